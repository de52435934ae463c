"""The zeroplan side of the GPU benchmark: plan, train the plan, read the logs.

For one model and per-GPU batch:

1. `zeroplan compile SPEC --gpu PROFILE --gpus 1 --seq S --global-batch B
   --micro-batch B --zero 0 --offload none --recompute none --json -o PLAN`:
   the configuration PyTorch runs (one GPU, no accumulation, every
   activation stored, bf16 mixed precision, AdamW), and the plan's
   predictions: `predicted.step_seconds`, `memory.peak_bytes` (everything the
   process holds on the GPU, CUDA context and cuBLAS workspace included),
   `memory.arena_bytes`, `params`. The command's wall time is the planner's.
2. `zeroplan train PLAN --backend cuda|cpu --steps W+N --log-json`: the plan's
   own program on its synthetic batch. Each step's JSON line carries
   `step_seconds` and `tokens_per_s`, the first also `setup` (seconds to
   compile the step and to load it: kernels through NVRTC, arenas,
   initialisation). The first W steps are warm-up; the rest are timed. The
   driver's used memory is sampled meanwhile (`gpu_memory`).
3. `zeroplan graph SPEC --dtype bf16 --batch-size B --seq-len S --explain
   rewrite`: what the rewrite pass's cost model predicted for each merge
   group (a GLU's gate and up), separate against merged.
"""

import json
import os
import re
import subprocess
import tempfile
import time

GPU_PROFILES = [("H200", "h200"), ("H100", "h100-80gb-sxm"), ("A100-SXM4-80GB", "a100-80gb"),
                ("A100 80GB", "a100-80gb"), ("A100", "a100-40gb"), ("V100", "v100-32gb")]


def gpu_profile(device_name):
    """The bundled GPU profile (`models/gpus/`) for an `nvidia-smi` name, or None."""
    for needle, profile in GPU_PROFILES:
        if needle.lower() in device_name.lower():
            return profile
    return None


def compile_plan(zeroplan, spec, batch, seq, profile, plan_path, precision="bf16"):
    """Plans `spec` for one GPU at `batch` sequences; the plan's figures."""
    cmd = [zeroplan, "compile", spec, "--gpu", profile, "--gpus", "1", "--seq", str(seq),
           "--global-batch", str(batch), "--micro-batch", str(batch), "--zero", "0", "--offload", "none",
           "--recompute", "none", "--precision", precision, "--json", "-o", plan_path]
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        return {"status": "error", "error": last_line(out.stderr), "command": cmd}
    plan = json.loads(out.stdout)
    return {
        "status": "ok",
        "command": cmd,
        "compile_wall_s": wall,
        "params": plan["params"],
        "predicted": {
            "step_s": plan["predicted"]["step_seconds"],
            "tokens_per_s": plan["predicted"]["tokens_per_second"],
            "mfu": plan["predicted"]["mfu"],
            "peak_bytes": plan["memory"]["peak_bytes"],
            "arena_bytes": plan["memory"]["arena_bytes"],
            "reserve_bytes": plan["memory"]["reserve_bytes"],
        },
        "strategy": plan["strategy"],
    }


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


def read_steps(stream, clock):
    """The JSON step lines of `stream`, each with the clock reading at which it arrived."""
    lines = []
    for raw in stream:
        raw = raw.strip()
        if raw.startswith("{"):
            line = json.loads(raw)
            line["_arrived_s"] = clock()
            lines.append(line)
    return lines


def train_plan(zeroplan, plan_path, backend, warmup, steps, env, timeout_s, sampler=None):
    """Runs the plan's program; the timed steps' figures."""
    cmd = [zeroplan, "train", plan_path, "--backend", backend, "--steps", str(warmup + steps), "--log-json"]
    # Standard error to a file: a pipe nobody reads while stdout is read could fill and stall the run.
    with tempfile.TemporaryFile(mode="w+") as errors:
        if sampler is None:
            lines, proc, fired = _run_steps(cmd, env, errors, timeout_s)
        else:
            with sampler:
                lines, proc, fired = _run_steps(cmd, env, errors, timeout_s)
        errors.seek(0)
        stderr = errors.read()
    result = summarise_steps(lines, warmup, steps)
    result["command"] = cmd
    if sampler is not None:
        result["peak_bytes"] = sampler.peak_bytes
    if fired:
        so_far = f" ({result['tokens_per_s']:,.0f} tokens/s over them)" if "tokens_per_s" in result else ""
        result.update(status="timeout", error=f"stopped after {timeout_s:.0f} s: {len(lines)} steps done, "
                                              f"{result['timed_steps']} of them timed{so_far}")
    elif proc.returncode != 0:
        error = last_line(stderr)
        result.update(status="oom" if "out of memory" in stderr.lower() else "error", error=error)
    return result


def _run_steps(cmd, env, errors, timeout_s):
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    timer = _Killer(proc, timeout_s)
    try:
        lines = read_steps(proc.stdout, lambda: time.perf_counter() - started)
        proc.wait()
    finally:
        timer.cancel()
    return lines, proc, timer.fired


def summarise_steps(lines, warmup, steps):
    """Tokens/s over the steps after `warmup` (total tokens over total step
    seconds), setup and first-step times, from `train --log-json` lines."""
    result = {"status": "ok", "warmup": warmup, "steps_run": len(lines)}
    if lines:
        first = lines[0]
        setup = first.get("setup", {})
        result["setup_compile_s"] = setup.get("compile_seconds")
        result["setup_load_s"] = setup.get("load_seconds")
        result["first_step_s"] = first.get("step_seconds")
        result["first_loss"] = first.get("loss")
        result["last_loss"] = lines[-1].get("loss")
        # From launch to the end of step 1, as torch.compile's first step is timed.
        result["to_first_step_end_s"] = first["_arrived_s"]
        result["arena_high_water_bytes"] = lines[-1].get("arena_high_water_bytes")
    timed = lines[warmup:]
    result["timed_steps"] = len(timed)
    if timed:
        seconds = sum(line["step_seconds"] for line in timed)
        tokens = sum(line["tokens_per_s"] * line["step_seconds"] for line in timed)
        result["step_ms"] = 1e3 * seconds / len(timed)
        result["tokens_per_s"] = tokens / seconds
    if len(timed) < steps:
        result.update(status="error", error=f"{len(timed)} timed steps of {steps} (warm-up {warmup})")
    return result


class _Killer:
    """Kills `proc` after `seconds` unless cancelled."""

    def __init__(self, proc, seconds):
        import threading

        self.fired = False
        self._timer = threading.Timer(seconds, self._kill, args=(proc,))
        self._timer.daemon = True
        self._timer.start()

    def _kill(self, proc):
        self.fired = True
        proc.kill()

    def cancel(self):
        self._timer.cancel()


EXPLAIN = re.compile(
    r"rewrite: \{(?P<names>[^}]*)\} on (?P<type>\S+\[[^\]]*\]) \(M=(?P<m>\d+)\): "
    r"separate (?P<separate>[\d.]+) µs, merged (?P<merged>[\d.]+) µs → (?P<decision>.*)$"
)


def parse_explanations(text):
    """`--explain rewrite` lines as dicts: members, M, both costs, the decision."""
    groups = []
    for line in text.splitlines():
        m = EXPLAIN.match(line.strip())
        if m:
            groups.append({
                "members": [n.strip() for n in m["names"].split(",")],
                "m": int(m["m"]),
                "separate_us": float(m["separate"]),
                "merged_us": float(m["merged"]),
                "decision": m["decision"].strip(),
            })
    return groups


def glu_prediction(zeroplan, spec, batch, seq):
    """The cost model's GLU merge decision for `spec` at `batch` × `seq` (layer 0's group)."""
    cmd = [zeroplan, "graph", spec, "--dtype", "bf16", "--batch-size", str(batch), "--seq-len", str(seq),
           "--summary", "--json", "--explain", "rewrite"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"status": "error", "error": last_line(out.stderr), "command": cmd}
    groups = [g for g in parse_explanations(out.stderr) if any(".ffn.gate" in n for n in g["members"])]
    if not groups:
        return {"status": "error", "error": "no GLU merge group in --explain rewrite", "command": cmd}
    return {"status": "ok", "command": cmd, **groups[0]}


def environment(nvrtc_dir=None, ptx_cache=None):
    env = dict(os.environ)
    if nvrtc_dir:
        env["ZEROPLAN_NVRTC_DIR"] = nvrtc_dir
    if ptx_cache:
        env["ZEROPLAN_PTX_CACHE"] = ptx_cache
    return env
