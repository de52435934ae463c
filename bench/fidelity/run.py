#!/usr/bin/env python3
"""Fidelity suite: zeroplan's predictions against published, measured training runs.

For every row of rows.csv that zeroplan can express, run `zeroplan compile` pinned
to the row's configuration, convert the plan's prediction to the row's unit, and
compare it with the measured figure. Prints the table and writes RESULTS.md.
Python 3 standard library only; the output depends only on the rows and the binary.
"""

import argparse
import csv
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def flops_per_token(formula, layers, hidden, seq, vocab):
    """Model FLOPs per token of a GPT with the row's shape, as the source counts them."""
    l, h, s, v = layers, hidden, seq, vocab
    if formula == "narayanan":
        # Narayanan et al. 2021: 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration of
        # B sequences (forward counted twice: full recomputation).
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    if formula == "megatron-causal":
        # Megatron-LM num_floating_point_operations for a dense GPT with a 4h
        # non-gated MLP, full multi-head attention, causal core attention halved,
        # no recomputation: 72·l·h²·(1 + s/12h + V/12lh) per token.
        return 72 * l * h * h * (1 + s / (12 * h) + v / (12 * l * h))
    raise ValueError(f"unknown FLOP formula {formula!r}")


def compile_command(zeroplan, row):
    cmd = [
        zeroplan, "compile", row["model_spec"],
        "--gpu", row["gpu_profile"],
        "--gpus", row["gpus"],
        "--nodes", row["nodes"],
        "--seq", row["seq"],
        "--global-batch", row["global_batch"],
        "--precision", row["precision"],
        "--json",
    ]
    # An empty cell: the source does not publish it, and the planner chooses.
    for column, flag in (("micro_batch", "--micro-batch"), ("tp", "--tp"), ("zero", "--zero"),
                         ("offload", "--offload"), ("recompute", "--recompute")):
        if row[column]:
            cmd += [flag, row[column]]
    if row["sp"] == "on":
        cmd.append("--sp")
    elif row["sp"] == "off":
        cmd.append("--no-sp")
    return cmd


def predicted_in_unit(row, plan):
    unit = row["unit"]
    tokens_per_second = plan["predicted"]["tokens_per_second"]
    if unit == "TFLOP/s per GPU":
        per_token = flops_per_token(row["flops_per_token"], int(row["layers"]), int(row["hidden"]),
                                    int(row["seq"]), int(row["vocab"]))
        return per_token * tokens_per_second / int(row["gpus"]) / 1e12
    if unit == "samples/s":
        return tokens_per_second / int(row["seq"])
    if unit == "tokens/s":
        return tokens_per_second
    if unit == "ms per step":
        return plan["predicted"]["step_seconds"] * 1000
    if unit == "MiB GPU memory":
        return plan["memory"]["peak_bytes"] / 2**20
    raise ValueError(f"{row['id']}: no conversion for unit {unit!r}")


def strategy_text(plan):
    s = plan["strategy"]
    return (f"mb {s['micro_batch']}×{s['micro_batches']}, TP {s['tensor_parallel']}"
            f"{' +SP' if s['sequence_parallel'] else ''}, ZeRO {s['zero_stage']}, "
            f"offload {s['offload']}, recompute {s['recompute']}")


def evaluate(zeroplan, rows):
    results = []
    for row in rows:
        result = {"row": row, "predicted": None, "error": None, "status": row["expressible"], "plan": ""}
        if row["expressible"] == "yes":
            cmd = compile_command(zeroplan, row)
            run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
                result["status"] = f"not expressible: zeroplan refused it: {last}"
            else:
                plan = json.loads(run.stdout)
                predicted = predicted_in_unit(row, plan)
                measured = float(row["measured"])
                result["predicted"] = predicted
                result["error"] = (predicted - measured) / measured * 100
                result["plan"] = strategy_text(plan)
        results.append(result)
    return results


def rankings(results):
    """Per source and unit: does ordering the rows by prediction give the measured order?"""
    groups = {}
    for r in results:
        if r["error"] is not None:
            groups.setdefault((r["row"]["source"], r["row"]["unit"]), []).append(r)
    lines = []
    for (source, unit), group in groups.items():
        if len(group) < 2:
            continue
        by_measured = [r["row"]["id"] for r in sorted(group, key=lambda r: float(r["row"]["measured"]))]
        by_predicted = [r["row"]["id"] for r in sorted(group, key=lambda r: r["predicted"])]
        pairs = discordant = 0
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                dm = float(a["row"]["measured"]) - float(b["row"]["measured"])
                dp = a["predicted"] - b["predicted"]
                if dm == 0:
                    continue
                pairs += 1
                discordant += dm * dp < 0
        verdict = "matches" if discordant == 0 else f"differs ({discordant} of {pairs} pairs swapped)"
        lines.append((source, unit, verdict, by_measured, by_predicted))
    return lines


def fmt(x):
    if x is None:
        return "—"
    return f"{x:,.1f}" if abs(x) < 1e5 else f"{x:,.0f}"


def config_text(row):
    parts = [f"{row['gpus'] or '?'}×{row['gpu_profile']}", f"{row['nodes'] or '?'} nodes",
             f"seq {row['seq'] or '?'}", f"GBS {row['global_batch'] or '?'}",
             f"mb {row['micro_batch'] or 'planner'}", f"TP {row['tp'] or 'planner'}",
             f"SP {row['sp'] or 'planner'}", f"PP {row['pp'] or '?'}",
             f"ZeRO {row['zero'] or 'planner'}", f"offload {row['offload'] or 'planner'}",
             f"recompute {row['recompute'] or 'planner'}", row["precision"] or "?"]
    return ", ".join(parts)


def md_cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zeroplan", default="zeroplan", help="the zeroplan binary to test")
    parser.add_argument("--zeroplan-commit", default="",
                        help="the git commit the binary was built from (`zeroplan -V` does not report one)")
    parser.add_argument("--rows", default=os.path.join(HERE, "rows.csv"))
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    args = parser.parse_args()

    zeroplan = os.path.abspath(args.zeroplan) if os.sep in args.zeroplan else args.zeroplan
    with open(args.rows, newline="") as f:
        rows = list(csv.DictReader(f))
    results = evaluate(zeroplan, rows)

    version = subprocess.run([zeroplan, "-V"], capture_output=True, text=True).stdout.strip()
    binary_path = zeroplan if os.sep in zeroplan else (
        subprocess.run(["which", zeroplan], capture_output=True, text=True).stdout.strip())
    with open(binary_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()

    scored = [r for r in results if r["error"] is not None]
    errors = [abs(r["error"]) for r in scored]
    median = statistics.median(errors) if errors else None
    worst = max(scored, key=lambda r: abs(r["error"])) if scored else None
    ranks = rankings(results)

    for r in results:
        row = r["row"]
        error = "—" if r["error"] is None else f"{r['error']:+.1f}%"
        status = "" if r["status"] == "yes" else f"  [{r['status']}]"
        print(f"{row['id']:<20} measured {fmt(float(row['measured'])):>10} {row['unit']:<16} "
              f"predicted {fmt(r['predicted']):>10}  error {error}{status}")
    print()
    if scored:
        print(f"median |error| over {len(scored)} rows: {median:.1f}%")
        print(f"worst row: {worst['row']['id']} ({worst['error']:+.1f}%)")
    for source, unit, verdict, by_measured, by_predicted in ranks:
        print(f"ranking, {source} ({unit}): {verdict}")

    command = " ".join(shlex.quote(a) for a in ["python3", "bench/fidelity/run.py", "--zeroplan", args.zeroplan]
                       + (["--zeroplan-commit", args.zeroplan_commit] if args.zeroplan_commit else []))
    out = [
        "# Fidelity suite: predicted against measured",
        "",
        "Generated by `bench/fidelity/run.py` (see `bench/fidelity/README.md`); do not edit by hand.",
        "",
        f"- command: `{command}`",
        f"- binary: `{version}`, built from commit "
        f"`{args.zeroplan_commit or 'not stated (pass --zeroplan-commit)'}`, sha256 `{sha[:16]}…`",
        f"- rows: {len(rows)} in `bench/fidelity/rows.csv`; {len(scored)} expressible and scored, "
        f"{len(rows) - len(scored)} kept but not expressible (excluded from the statistics)",
        "- error = (predicted − measured) / measured; predicted is zeroplan's plan pinned to the "
        "row's configuration, converted to the row's unit (README: units)",
        "",
        "## Summary",
        "",
    ]
    if scored:
        out += [f"- median |error|: **{median:.1f}%** over {len(scored)} rows",
                f"- worst row: **{worst['row']['id']}** ({worst['error']:+.1f}%)"]
    out += ["", "Ranking of configurations within each source (rows of the same unit, ordered by measured "
            "and by predicted value):", "", "| source | unit | ranking | measured order (low → high) | "
            "predicted order |", "| --- | --- | --- | --- | --- |"]
    for source, unit, verdict, by_measured, by_predicted in ranks:
        out.append(f"| {md_cell(source)} | {unit} | {verdict} | {', '.join(by_measured)} | "
                   f"{', '.join(by_predicted)} |")
    out += ["", "## Rows", "", "| row | source | configuration | measured | predicted | error % | "
            "zeroplan's plan | notes |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        row = r["row"]
        unit = row["unit"]
        error = "—" if r["error"] is None else f"{r['error']:+.1f}"
        notes = row["notes"] if r["status"] == "yes" else f"**{r['status']}**. {row['notes']}"
        out.append(f"| {row['id']} | {md_cell(row['source'])}, {md_cell(row['source_table'])} | "
                   f"{md_cell(row['model'])}; {md_cell(config_text(row))} | {fmt(float(row['measured']))} "
                   f"{unit} | {fmt(r['predicted'])}{'' if r['predicted'] is None else ' ' + unit} | {error} | "
                   f"{r['plan'] or '—'} | {md_cell(notes)} |")
    with open(args.results, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"\nwrote {os.path.relpath(args.results, REPO)}")


if __name__ == "__main__":
    sys.exit(main())
