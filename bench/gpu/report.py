"""The benchmark's records as the Markdown section `bench/RESULTS.md` keeps.

    python3 bench/gpu/report.py RESULTS.jsonl     # the section, on standard output

A run writes one JSON object per line (`harness.py`): `meta` (date, commit,
command), `device`, `peak_gemm`, one `run` per side × model × batch, one
`glu` per batch of a GLU model. This module only formats them, so it is
tested on recorded lines (`test_report.py`) without a GPU.
"""

import json
import sys

SIDES = ("zeroplan", "eager", "compile")
GIB = float(1 << 30)


def mfu(tokens_per_s, params, peak_tflops):
    """Model FLOPs utilisation, 6·Ψ·tokens/s over the measured bf16 GEMM peak."""
    if not tokens_per_s or not params or not peak_tflops:
        return None
    return 6 * params * tokens_per_s / (peak_tflops * 1e12)


def _num(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def _gib(b):
    return "—" if b is None else f"{b / GIB:.2f}"


def _ratio(a, b):
    return "—" if not a or not b else f"{a / b:.2f}"


def _pct(x):
    return "—" if x is None else f"{100 * x:.1f} %"


def _table(header, rows):
    align = ["---" if i < 2 else "---:" for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


class Records:
    def __init__(self, records):
        self.meta = next((r for r in records if r.get("kind") == "meta"), {})
        self.device = next((r for r in records if r.get("kind") == "device"), {})
        self.peak = next((r for r in records if r.get("kind") == "peak_gemm" and r.get("status", "ok") == "ok"), None)
        self.runs = [r for r in records if r.get("kind") == "run"]
        self.glu = [r for r in records if r.get("kind") == "glu"]
        self.notes = [r for r in records if r.get("kind") == "note"]
        self.failed_peaks = [r for r in records if r.get("kind") == "peak_gemm" and r.get("status", "ok") != "ok"]

    def configs(self):
        """(model, batch) pairs in the order they ran."""
        seen = []
        for r in self.runs:
            key = (r["model"], r["batch"])
            if key not in seen:
                seen.append(key)
        return seen

    def run(self, side, model, batch):
        return next((r for r in self.runs if (r["side"], r["model"], r["batch"]) == (side, model, batch)), None)

    @property
    def peak_tflops(self):
        return self.peak["tflops"] if self.peak else None


def _ok(r):
    return r is not None and r.get("status") == "ok"


def _cell(r, value):
    """`value(r)` for a run that finished, else why not (`oom`, `error`, `skipped`…), `—` for none."""
    if r is None:
        return "—"
    if r.get("status") != "ok":
        return r.get("status", "?")
    return value(r)


def _params(rec, model, batch):
    for side in SIDES:
        r = rec.run(side, model, batch)
        if r and r.get("params"):
            return r["params"]
    return None


def throughput(rec):
    rows = []
    for model, batch in rec.configs():
        psi = _params(rec, model, batch)
        runs = {s: rec.run(s, model, batch) for s in SIDES}
        tps = {s: runs[s].get("tokens_per_s") if _ok(runs[s]) else None for s in SIDES}
        row = [model, batch, _num(psi)]
        row += [_cell(runs[s], lambda r: _num(r.get("tokens_per_s"))) for s in SIDES]
        row += [_cell(runs[s], lambda r, psi=psi: _pct(mfu(r.get("tokens_per_s"), psi, rec.peak_tflops)))
                for s in SIDES]
        row += [_cell(runs[s], lambda r: _gib(r.get("peak_bytes"))) for s in SIDES]
        row += [_ratio(tps["zeroplan"], tps["eager"]), _ratio(tps["zeroplan"], tps["compile"])]
        rows.append(row)
    header = ["model", "batch", "Ψ", "zeroplan tok/s", "eager tok/s", "compile tok/s", "zeroplan MFU", "eager MFU",
              "compile MFU", "zeroplan peak GiB", "eager peak GiB", "compile peak GiB", "zeroplan ÷ eager",
              "zeroplan ÷ compile"]
    return _table(header, rows)


def memory(rec):
    rows = []
    for model, batch in rec.configs():
        z, e, c = (rec.run(s, model, batch) for s in SIDES)
        get = lambda r, k: _cell(r, lambda r: _gib(r.get(k)))  # noqa: E731, B023
        rows.append([model, batch, get(z, "peak_bytes"), get(z, "arena_high_water_bytes"), get(e, "peak_bytes"),
                     get(e, "allocator_peak_bytes"), get(e, "allocator_reserved_bytes"), get(c, "peak_bytes"),
                     get(c, "allocator_peak_bytes"), get(c, "allocator_reserved_bytes")])
    header = ["model", "batch", "zeroplan driver", "zeroplan arena high water", "eager driver", "eager allocated",
              "eager reserved", "compile driver", "compile allocated", "compile reserved"]
    return _table(header, rows)


def fidelity(rec):
    rows = []
    for model, batch in rec.configs():
        z = rec.run("zeroplan", model, batch)
        if z is None or "predicted" not in z:
            continue
        p = z["predicted"]
        measured_ms = z.get("step_ms") if _ok(z) else None
        measured_peak = z.get("peak_bytes") if _ok(z) else None
        rows.append([model, batch, _num(1e3 * p["step_s"], 1), _cell(z, lambda r: _num(r.get("step_ms"), 1)),
                     _ratio(measured_ms, 1e3 * p["step_s"]), _num(p["tokens_per_s"]), _gib(p["peak_bytes"]),
                     _cell(z, lambda r: _gib(r.get("peak_bytes"))), _ratio(measured_peak, p["peak_bytes"]),
                     _gib(p["arena_bytes"]), _cell(z, lambda r: _gib(r.get("arena_high_water_bytes")))])
    header = ["model", "batch", "predicted step ms", "measured step ms", "measured ÷ predicted", "predicted tok/s",
              "predicted peak GiB", "measured peak GiB", "measured ÷ predicted", "plan arena GiB",
              "arena high water GiB"]
    return _table(header, rows)


def compile_time(rec):
    rows = []
    for model, batch in rec.configs():
        z, e, c = (rec.run(s, model, batch) for s in SIDES)
        if z is None:
            continue
        seconds = lambda key: lambda r: _num(r.get(key), 2)  # noqa: E731
        rows.append([model, batch, _num(z.get("compile_wall_s"), 2), _cell(z, seconds("setup_load_s")),
                     z.get("ptx_cache", "—"), _cell(z, seconds("first_step_s")),
                     _cell(z, seconds("to_first_step_end_s")), _cell(c, seconds("first_step_s")),
                     _cell(e, seconds("first_step_s"))])
    header = ["model", "batch", "zeroplan compile s", "zeroplan load s (NVRTC, arenas, init)", "PTX cache",
              "zeroplan step 1 s", "zeroplan launch → step 1 end s", "torch.compile step 1 s", "eager step 1 s"]
    return _table(header, rows)


def glu(rec):
    rows = []
    for g in rec.glu:
        measured = g.get("measured_separate_us") is not None and g.get("measured_merged_us") is not None
        picks = "merge" if g.get("predicted_decision", "").startswith("merge") else "keep"
        faster = None
        if measured:
            faster = "merge" if g["measured_merged_us"] < g["measured_separate_us"] else "keep"
        rows.append([g["model"], g["batch"], _num(g.get("tokens")), _num(g.get("predicted_separate_us"), 1),
                     _num(g.get("predicted_merged_us"), 1), g.get("predicted_decision", g.get("status", "—")),
                     _num(g.get("measured_separate_us"), 1), _num(g.get("measured_merged_us"), 1), faster or "—",
                     "—" if faster is None else ("yes" if faster == picks else "no")])
    header = ["model", "batch", "tokens M", "predicted separate µs", "predicted merged µs", "cost model",
              "measured separate µs", "measured merged µs", "measured faster", "agree"]
    return _table(header, rows)


def problems(rec):
    """One line per distinct failure, naming the runs it stopped."""
    grouped = {}
    for r in rec.runs:
        if r.get("status") != "ok":
            key = (r.get("status"), r.get("error", ""))
            grouped.setdefault(key, []).append(f"{r['side']} {r['model']} batch {r['batch']}")
    lines = [f"- {', '.join(runs)}: {status}: {error}" for (status, error), runs in grouped.items()]
    for g in rec.glu:
        for k in ("error", "measured_error"):
            if g.get(k):
                lines.append(f"- GLU {g['model']} batch {g['batch']}: {g[k]}")
    lines += [f"- bf16 GEMM peak: {r.get('status')}: {r.get('error', '')}" for r in rec.failed_peaks]
    lines += [f"- {n['text']}" for n in rec.notes]
    return "\n".join(lines) + ("\n" if lines else "")


def section(records):
    rec = Records(records)
    m, d = rec.meta, rec.device
    out = f"## {m.get('date', '?')} · {d.get('name', '?')} · {m.get('commit', '?')}\n\n"
    out += f"Command: `{m.get('command', '?')}`\n\n"
    facts = [f"backend `{m.get('backend', '?')}`", f"plans for `{d.get('profile', '?')}`",
             f"seq {m.get('seq', '?')}, {m.get('warmup', '?')} warm-up + {m.get('steps', '?')} timed steps"]
    if d.get("driver"):
        facts.append(f"driver {d['driver']}, {_gib(d.get('memory_bytes'))} GiB")
    if rec.peak:
        p = rec.peak
        facts.append(f"bf16 GEMM peak {p['tflops']:.0f} TFLOP/s ({p['n']}³, torch {p.get('torch')}, "
                     f"CUDA {p.get('cuda')}, transformers {p.get('transformers')})")
    else:
        facts.append("no bf16 GEMM peak measured (no MFU)")
    out += "; ".join(facts) + ".\n\n"
    out += "Throughput (tokens/s over the timed steps; MFU = 6·Ψ·tokens/s ÷ the measured peak; peak = the driver's " \
           "used memory, sampled, less the idle baseline):\n\n" + throughput(rec) + "\n"
    out += "Memory by each side's own count (GiB):\n\n" + memory(rec) + "\n"
    out += "Plan fidelity (zeroplan's plan against its run):\n\n" + fidelity(rec) + "\n"
    out += "Compile time:\n\n" + compile_time(rec) + "\n"
    if rec.glu:
        out += "GLU, fused (merged gate and up) against unfused, the rewrite cost model against a measurement:\n\n"
        out += glu(rec) + "\n"
    issues = problems(rec)
    if issues:
        out += "Not measured or failed:\n\n" + issues + "\n"
    return out


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS.jsonl")
    sys.stdout.write(section(load(sys.argv[1])))
