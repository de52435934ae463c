#!/usr/bin/env python3
"""Fidelity suite: zeroplan's predictions against published, measured training runs.

For every row of rows.csv that zeroplan can express, run `zeroplan compile` pinned
to the row's configuration, convert the plan's prediction to the row's unit, and
compare it with the measured figure. For every row of activation_rows.csv, read one
layer's stored activations off zeroplan's memory plan and compare them with
Korthikanti et al.'s per-layer formulas. Prints the tables and writes RESULTS.md;
exits 1 when a per-layer figure is not linear in depth, when zeroplan's bytes differ
from the formula adjusted for zeroplan's documented design by more than
RESIDUAL_TOLERANCE, or when a prediction exceeds a measured upper bound.
Python 3 standard library only; the output depends only on the rows and the binary.
"""

import argparse
import csv
import hashlib
import json
import os
import shlex
import statistics
import re
import subprocess
import sys
import tempfile

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
    if row["attention"]:
        cmd += ["--attention", row["attention"]]
    if row["cuda_graphs"] == "on":
        cmd.append("--cuda-graphs")
    if row["sp"] == "on":
        cmd.append("--sp")
    elif row["sp"] == "off":
        cmd.append("--no-sp")
    return cmd


def comparable(row):
    """True for a scored row; False for one zeroplan plans but whose measured run did work
    that cannot be pinned (predicted and shown, not scored); None where it cannot be planned."""
    if row["expressible"] == "yes":
        return True
    return False if row["expressible"].startswith("not comparable") else None


# Units of speed, scored against the goal of the suite (README: goals); memory rows apart.
SPEED_UNITS = ("TFLOP/s per GPU", "samples/s", "tokens/s", "ms per step")
GOAL_MEDIAN, GOAL_WORST = 10.0, 25.0  # percent, |error| of the speed rows


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
        if row["expressible"] == "yes" or comparable(row) is False:
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


# ---------------------------------------------------------------------------
# Per-layer activation memory against Korthikanti et al. 2022 (activation_rows.csv)
# ---------------------------------------------------------------------------

# Depths compiled per row: one layer's activations are the difference between
# consecutive depths, and must be the same difference twice.
DEPTHS = (1, 2, 3)
# ZeRO-3 over this many data-parallel ranks shrinks every per-layer model state
# (parameters, gradients, moments) to a 1/256 shard, so the peak of the memory plan
# is at the start of the backward, where every layer's stored activations are live,
# at any depth. The ranks change no activation.
ISOLATE = ["--ranks", "256", "--zero", "3"]
RESIDUAL_TOLERANCE = 0.1  # percent


def spec_at_depth(spec_path, layers, directory):
    with open(os.path.join(REPO, spec_path)) as f:
        text = f.read()
    text, n = re.subn(r"\blayers:\s*\d+", f"layers: {layers}", text, count=1)
    if n != 1:
        raise ValueError(f"{spec_path}: no `layers:` field")
    path = os.path.join(directory, f"{os.path.basename(spec_path)[:-4]}-{layers}.ron")
    with open(path, "w") as f:
        f.write(text)
    return path


def activations_at_peak(zeroplan, spec, train, row, recompute, attention):
    cmd = [zeroplan, "graph", spec, "--train", train, "--summary", "--json",
           "--batch-size", row["micro_batch"], "--seq-len", row["seq"], "--recompute", recompute] + ISOLATE
    if int(row["tp"]) > 1:
        cmd += ["--tp", row["tp"]]
    if row["sp"] == "on":
        cmd.append("--sp")
    if attention == "unfused":
        cmd += ["--disable", "attention"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"{row['id']}: zeroplan graph failed: {last}")
    return json.loads(run.stdout)["memory"]["at_peak"]["activations"]


def per_layer(zeroplan, row, directory, train, recompute, attention):
    """One layer's activations in the memory plan, and whether they are linear in depth."""
    at = [activations_at_peak(zeroplan, spec_at_depth(row["model_spec"], depth, directory), train, row,
                              recompute, attention) for depth in DEPTHS]
    steps = [b - a for a, b in zip(at, at[1:])]
    return steps[-1], all(step == steps[0] for step in steps)


def korthikanti(row):
    """Bytes per layer by Korthikanti et al.'s Table 2 for the row's configuration: (bytes, formula)."""
    s, b, h, a, t = (int(row[k]) for k in ("seq", "micro_batch", "hidden", "heads", "tp"))
    sp = row["sp"] == "on"
    sbh = s * b * h
    if row["recompute"] == "full":
        if sp:
            return 2 * sbh / t, "2sbh/t: Table 2's full recomputation (2sbh), the layer input split by SP (no Table 2 row)"
        return 2 * sbh, "Table 2, full activation recompute: 2sbh"
    if sp:
        linear, base = 34 / t, "tensor + sequence parallel"
    elif t > 1:
        linear, base = 10 + 24 / t, "tensor parallel"
    else:
        linear, base = 34, "no parallelism (Eq. 1)"
    quadratic = 5 * a * s / (h * t)
    if row["recompute"] == "selective":
        text = {"tensor + sequence parallel": "Table 2, tensor + sequence parallel + selective recompute: 34sbh/t",
                "tensor parallel": "Table 2, tensor parallel + selective recompute: sbh(10 + 24/t)",
                "no parallelism (Eq. 1)": "Table 2 / Eq. 1 with selective recompute: 34sbh"}[base]
        return linear * sbh, text
    formula = {"tensor + sequence parallel": "sbh(34/t + 5as/(ht))", "tensor parallel": "sbh(10 + 24/t + 5as/(ht))",
               "no parallelism (Eq. 1)": "sbh(34 + 5as/h)"}[base]
    if row["attention"] == "fused":
        return linear * sbh, f"Table 2, {base}: {formula} without its 5as/(ht) term (fused attention stores no s² tensor)"
    return (linear + quadratic) * sbh, f"Table 2, {base}: {formula}"


def design_adjustments(row):
    """What zeroplan stores differently from the formula by design: [(bytes, why)]."""
    s, b, h, a, t = (int(row[k]) for k in ("seq", "micro_batch", "hidden", "heads", "tp"))
    sp = row["sp"] == "on"
    sbh = s * b * h
    if row["recompute"] == "full":
        return []
    out = [(-(2 / t if sp else 2) * sbh,
            "the two hidden-dropout masks (1 byte an element) are not stored: the backward redraws them")]
    if row["attention"] == "unfused" and row["recompute"] == "none":
        out.append((-a * s * s * b / t, "nor the attention-dropout mask (as²b/t bytes)"))
    if row["attention"] == "fused":
        out.append((4 * a * s * b / t, "flash attention's f32 log-sum-exp [b, a/t, s]"))
        out.append((2 * sbh / t, "flash attention's output [b, a/t, s, d] kept for its backward beside the "
                                  "output projection's transposed copy [b, s, h/t]"))
    return out


def evaluate_activations(zeroplan, rows):
    results = []
    with tempfile.TemporaryDirectory() as directory:
        train = os.path.join(directory, "train.ron")
        with open(train, "w") as f:
            f.write("(precision: Bf16)\n")
        for row in rows:
            with open(os.path.join(REPO, row["model_spec"])) as f:
                spec_text = f.read()
            for field in ("hidden", "heads"):
                found = re.search(rf"\b{field}:\s*(\d+)", spec_text)
                if not found or found.group(1) != row[field]:
                    raise ValueError(f"{row['id']}: {field} {row[field]} is not {row['model_spec']}'s")
            predicted, linear = per_layer(zeroplan, row, directory, train, row["recompute"], row["attention"])
            # Twins the row stands for: fused attention has nothing for selective
            # recomputation to drop; full recomputation stores only the layer input.
            twin = None
            if row["recompute"] == "none" and row["attention"] == "fused":
                twin = ("selective", "fused")
            elif row["recompute"] == "full":
                twin = ("full", "unfused" if row["attention"] == "fused" else "fused")
            twin_same = None
            if twin:
                twin_bytes, twin_linear = per_layer(zeroplan, row, directory, train, *twin)
                twin_same = twin_bytes == predicted and twin_linear
            reference, formula = korthikanti(row)
            adjustments = design_adjustments(row)
            adjusted = reference + sum(delta for delta, _ in adjustments)
            results.append({
                "row": row, "predicted": predicted, "linear": linear, "twin": twin, "twin_same": twin_same,
                "reference": reference, "formula": formula, "adjustments": adjustments, "adjusted": adjusted,
                "error": (predicted - reference) / reference * 100,
                "residual": (predicted - adjusted) / adjusted * 100,
            })
    return results


def activation_failures(results):
    fails = []
    for r in results:
        if not r["linear"]:
            fails.append(f"{r['row']['id']}: one layer's activations differ between depths {DEPTHS}")
        if abs(r["residual"]) > RESIDUAL_TOLERANCE:
            fails.append(f"{r['row']['id']}: {r['residual']:+.2f}% from the design-adjusted formula")
        if r["twin"] and not r["twin_same"]:
            fails.append(f"{r['row']['id']}: recompute {r['twin'][0]} with {r['twin'][1]} attention "
                         f"plans different bytes")
    return fails


def mib(x):
    return f"{x / 2**20:,.2f}"


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
             f"recompute {row['recompute'] or 'planner'}", f"attention {row['attention'] or 'fused'}",
             row["precision"] or "?"]
    return ", ".join(parts)


def md_cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zeroplan", default="zeroplan", help="the zeroplan binary to test")
    parser.add_argument("--zeroplan-commit", default="",
                        help="the git commit the binary was built from (`zeroplan -V` does not report one)")
    parser.add_argument("--rows", default=os.path.join(HERE, "rows.csv"))
    parser.add_argument("--activation-rows", default=os.path.join(HERE, "activation_rows.csv"))
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    args = parser.parse_args()

    zeroplan = os.path.abspath(args.zeroplan) if os.sep in args.zeroplan else args.zeroplan
    with open(args.rows, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(args.activation_rows, newline="") as f:
        activation_rows = list(csv.DictReader(f))
    results = evaluate(zeroplan, rows)
    activations = evaluate_activations(zeroplan, activation_rows)

    version = subprocess.run([zeroplan, "-V"], capture_output=True, text=True).stdout.strip()
    binary_path = zeroplan if os.sep in zeroplan else (
        subprocess.run(["which", zeroplan], capture_output=True, text=True).stdout.strip())
    with open(binary_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()

    scored = [r for r in results if r["error"] is not None and comparable(r["row"])]
    shown = [r for r in results if r["error"] is not None and comparable(r["row"]) is False]
    speed = [r for r in scored if r["row"]["unit"] in SPEED_UNITS]
    errors = [abs(r["error"]) for r in speed]
    median = statistics.median(errors) if errors else None
    worst = max(speed, key=lambda r: abs(r["error"])) if speed else None
    ranks = rankings(scored)
    # A measured upper bound (nvidia-smi: what the process holds) that the prediction exceeds.
    over_bound = [r for r in scored if r["row"].get("bound") == "upper" and r["predicted"] > float(r["row"]["measured"])]
    memory_rows = [r for r in scored if r["row"]["unit"] == "MiB GPU memory"]
    failures = activation_failures(activations) + [
        f"{r['row']['id']}: predicted {r['predicted']:,.0f} above the measured upper bound {r['row']['measured']}"
        for r in over_bound]

    for r in results:
        row = r["row"]
        error = "—" if r["error"] is None else f"{r['error']:+.1f}%"
        status = "" if r["status"] == "yes" else f"  [{r['status']}]"
        print(f"{row['id']:<20} measured {fmt(float(row['measured'])):>10} {row['unit']:<16} "
              f"predicted {fmt(r['predicted']):>10}  error {error}{status}")
    print()
    if speed:
        print(f"speed: median |error| over {len(speed)} rows: {median:.1f}% (goal <= {GOAL_MEDIAN:.0f}%)")
        print(f"speed: worst row: {worst['row']['id']} ({worst['error']:+.1f}%; goal within {GOAL_WORST:.0f}%)")
    for source, unit, verdict, by_measured, by_predicted in ranks:
        print(f"ranking, {source} ({unit}): {verdict}")
    print()
    for r in activations:
        print(f"{r['row']['id']:<28} Korthikanti {mib(r['reference']):>10} MiB  predicted {mib(r['predicted']):>10} MiB"
              f"  error {r['error']:+6.1f}%  design-adjusted {mib(r['adjusted']):>10} MiB  residual {r['residual']:+.2f}%")
    act_errors = [abs(r["error"]) for r in activations]
    act_residuals = [abs(r["residual"]) for r in activations]
    if activations:
        print(f"per-layer activations: median |error| {statistics.median(act_errors):.1f}% over {len(activations)} rows; "
              f"largest |residual| {max(act_residuals):.2f}%")
    for failure in failures:
        print(f"FAIL {failure}")

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
        f"- rows: {len(rows)} in `bench/fidelity/rows.csv`; {len(scored)} scored ({len(speed)} of speed, "
        f"{len(scored) - len(speed)} of memory); {len(shown)} planned and shown but not comparable (the measured "
        f"run did work the row cannot pin; the row says why); {len(rows) - len(scored) - len(shown)} not expressible; "
        "the last two excluded from the statistics",
        "- error = (predicted − measured) / measured; predicted is zeroplan's plan pinned to the "
        "row's configuration, converted to the row's unit (README: units)",
        "",
        "## Summary",
        "",
    ]
    if speed:
        out += [f"- speed (throughput and step time, {len(speed)} rows): median |error| **{median:.1f}%** "
                f"(goal ≤ {GOAL_MEDIAN:.0f}%: {'met' if median <= GOAL_MEDIAN else 'not met'}); worst row "
                f"**{worst['row']['id']}** ({worst['error']:+.1f}%; goal within ±{GOAL_WORST:.0f}%: "
                f"{'met' if abs(worst['error']) <= GOAL_WORST else 'not met'})"]
    if memory_rows:
        out += [f"- peak memory ({len(memory_rows)} rows): median |error| "
                f"**{statistics.median(abs(r['error']) for r in memory_rows):.1f}%**; "
                f"{sum(r['row'].get('bound') == 'upper' for r in memory_rows)} of them measured as an upper bound "
                f"on the peak (what nvidia-smi shows the process holding); predicted above such a bound: "
                f"{', '.join(r['row']['id'] for r in over_bound) or 'none'}"]
    if activations:
        out += [f"- per-layer activations against Korthikanti et al. ({len(activations)} rows, below): median |error| "
                f"**{statistics.median(act_errors):.1f}%** against Table 2; largest |residual| against the formula "
                f"adjusted for zeroplan's documented design **{max(act_residuals):.2f}%** "
                f"(tolerance {RESIDUAL_TOLERANCE}%)"]
    out += [f"- failures: {len(failures)}" + ("" if not failures else ": " + "; ".join(failures))]
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
    out += ["", "## Activation memory per layer: Korthikanti et al. 2022", "",
            "One transformer layer's stored activations per GPU, micro-batch 1, sequence 2048, bf16, at the "
            "paper's model shapes (README: activation rows). *Korthikanti*: the Table 2 formula for the "
            "configuration. *Predicted*: the difference in activations live at the peak of zeroplan's memory plan "
            f"(`zeroplan graph --train --summary --json`, ZeRO-3 over 256 ranks) between {DEPTHS[0]} and "
            f"{DEPTHS[-1]} layers, checked equal for each added layer. *Design-adjusted*: the formula plus or "
            "minus the tensors zeroplan stores differently by design (the last column, in MiB); *residual*: "
            "predicted against it.", "",
            "| row | model | TP | SP | recompute | attention | formula | Korthikanti MiB | predicted MiB | "
            "error % | design-adjusted MiB | residual % | what differs by design (MiB) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in activations:
        row = r["row"]
        why = "; ".join(f"{delta / 2**20:+,.2f}: {text}" for delta, text in r["adjustments"]) or "nothing"
        if r["twin"]:
            why += (f". Recompute {r['twin'][0]} with {r['twin'][1]} attention plans "
                    f"{'the same bytes' if r['twin_same'] else 'different bytes'}")
        if not r["linear"]:
            why += ". NOT LINEAR IN DEPTH"
        out.append(f"| {row['id']} | {row['model']} (h {row['hidden']}, a {row['heads']}) | {row['tp']} | {row['sp']} | "
                   f"{row['recompute']} | {row['attention']} | {md_cell(r['formula'])} | {mib(r['reference'])} | "
                   f"{mib(r['predicted'])} | {r['error']:+.1f} | {mib(r['adjusted'])} | {r['residual']:+.2f} | "
                   f"{md_cell(why)} |")
    with open(args.results, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"\nwrote {os.path.relpath(args.results, REPO)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
