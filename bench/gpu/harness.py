"""The GPU benchmark's sweep: zeroplan against PyTorch eager and torch.compile.

Run through `bench/gpu/run.sh` (which finds the binary, NVRTC and cuBLAS);
`python3 bench/gpu/harness.py --help` lists the options. Every measurement
runs in its own process, the driver's used memory sampled from here, and is
written as one JSON line to OUT/results.jsonl as soon as it is known (so a
run stopped half-way keeps what it measured); OUT/results.md is the Markdown
section (`report.py`) appended to `--results`.
"""

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gpu_memory  # noqa: E402
import report  # noqa: E402
import spec as specs  # noqa: E402
import zeroplan_side  # noqa: E402


class Out:
    """OUT/results.jsonl, appended record by record."""

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "results.jsonl")
        self.records = []
        open(self.path, "w").close()

    def add(self, record):
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        status = record.get("status", "")
        what = " ".join(str(record[k]) for k in ("side", "model", "batch") if k in record)
        print(f"[{record['kind']}] {what} {status} {record.get('error', '')}".rstrip(), file=sys.stderr, flush=True)


def git(*args):
    out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "?"


def commit():
    """HEAD's short hash, `-dirty` with uncommitted changes; `?` outside a git checkout."""
    head = git("rev-parse", "--short", "HEAD")
    if head == "?":
        return "?"
    return head + ("-dirty" if git("status", "--porcelain") not in ("", "?") else "")


def nvidia_smi():
    """(name, memory bytes, driver) of GPU 0, or an error naming the fix."""
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("error: nvidia-smi not found: --backend cuda needs an NVIDIA GPU and driver "
                         "(or use --backend cpu for a dry run of the zeroplan side)")
    out = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: nvidia-smi failed: {out.stderr.strip() or out.stdout.strip()}")
    name, mib, driver = [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")]
    return name, int(float(mib)) * (1 << 20), driver


def torch_status():
    """None when PyTorch, transformers and a CUDA device are usable, else why not."""
    probe = "import torch, transformers; assert torch.cuda.is_available(), 'torch sees no CUDA device'"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if out.returncode != 0:
        return report_error(out.stderr)
    return None


def report_error(stderr):
    return zeroplan_side.last_line(stderr)


def time_left(args):
    """Seconds the next measurement may take: `--timeout`, cut to what is left
    of `--budget`; None when the budget is spent (too little left to start)."""
    limit = args.timeout
    if args.budget is not None:
        left = args.budget - (time.monotonic() - args.started)
        if left < 15:
            return None
        limit = min(limit, left)
    return limit


def over_budget(args, record, out):
    record.update(status="skipped", error=f"over --budget {args.budget} s: not started")
    out.add(record)


def torch_worker(args, *worker_args, sampler=None, timeout):
    """Runs `torch_side.py`; its JSON result (with the sampled peak)."""
    cmd = [sys.executable, os.path.join(HERE, "torch_side.py"), *worker_args]
    try:
        if sampler is None:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        else:
            with sampler:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"stopped after {timeout:.0f} s", "command": cmd}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    result.setdefault("status", "ok" if out.returncode == 0 else "error")
    if out.returncode != 0 and "error" not in result:
        result["error"] = report_error(out.stderr)
    if sampler is not None:
        result["peak_bytes"] = sampler.peak_bytes
    result["command"] = cmd
    return result


def sampler_for(args):
    return gpu_memory.PeakSampler(args.read_memory) if args.read_memory else None


def run_zeroplan(args, out, spec_path, spec, batch, cache, cold):
    name = spec["name"]
    record = {"kind": "run", "side": "zeroplan", "model": name, "batch": batch, "seq": args.seq}
    if time_left(args) is None:
        return over_budget(args, record, out)
    plan_path = os.path.join(args.work, "plans", f"{name}-b{batch}.ron")
    os.makedirs(os.path.dirname(plan_path), exist_ok=True)
    planned = zeroplan_side.compile_plan(args.zeroplan, spec_path, batch, args.seq, args.profile, plan_path)
    record.update(planned)
    if planned["status"] != "ok":
        return out.add(record)
    expected = specs.params(spec)
    record["spec_params"] = expected
    if planned["params"] != expected:
        record.update(status="error", error=f"the plan counts {planned['params']} parameters, the spec {expected}")
        return out.add(record)
    env = zeroplan_side.environment(args.nvrtc_dir, cache)
    limit = time_left(args)
    if limit is None:
        return over_budget(args, record, out)
    measured = zeroplan_side.train_plan(args.zeroplan, plan_path, args.backend, args.warmup, args.steps, env,
                                        limit, sampler_for(args))
    measured["train_command"] = measured.pop("command")
    record.update(measured)
    record["ptx_cache"] = "cold" if cold else "warm"
    out.add(record)


def run_torch(args, out, spec_path, spec, batch, mode, why_not):
    record = {"kind": "run", "side": mode, "model": spec["name"], "batch": batch, "seq": args.seq}
    if why_not:
        record.update(status="skipped", error=why_not)
        return out.add(record)
    try:
        specs.hf_bert_config(spec)
    except specs.SpecError as e:
        record.update(status="skipped", error=str(e))
        return out.add(record)
    limit = time_left(args)
    if limit is None:
        return over_budget(args, record, out)
    result = torch_worker(args, "train", "--spec", spec_path, "--batch", str(batch), "--seq", str(args.seq),
                          "--mode", mode, "--warmup", str(args.warmup), "--steps", str(args.steps),
                          sampler=sampler_for(args), timeout=limit)
    record.update(result)
    record.update(kind="run", side=mode, model=spec["name"], batch=batch)
    out.add(record)


def run_glu(args, out, spec_path, spec, batch, why_not):
    record = {"kind": "glu", "model": spec["name"], "batch": batch, "seq": args.seq, "tokens": batch * args.seq}
    predicted = zeroplan_side.glu_prediction(args.zeroplan, spec_path, batch, args.seq)
    if predicted["status"] != "ok":
        record.update(status="error", error=predicted["error"])
        return out.add(record)
    record.update(status="ok", predicted_separate_us=predicted["separate_us"],
                  predicted_merged_us=predicted["merged_us"], predicted_decision=predicted["decision"],
                  predicted_m=predicted["m"])
    limit = time_left(args)
    if why_not or limit is None:
        record["measured_error"] = f"not measured: {why_not or f'over --budget {args.budget} s'}"
    else:
        measured = torch_worker(args, "glu", "--tokens", str(batch * args.seq), "--hidden", str(spec["hidden"]),
                                "--intermediate", str(spec["intermediate"]), timeout=limit)
        if measured.get("status") == "ok":
            record.update(measured_separate_us=measured["separate_us"], measured_merged_us=measured["merged_us"])
        else:
            record["measured_error"] = measured.get("error", "failed")
    out.add(record)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zeroplan", required=True, help="the zeroplan binary (release build)")
    p.add_argument("--backend", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: the benchmark; cpu: a dry run of the zeroplan side on this CPU (no PyTorch)")
    p.add_argument("--models", default="models/bert-base.ron,models/bert-large.ron,models/mosaicbert-base.ron")
    p.add_argument("--batches", default="32,64,128,256", help="per-GPU batches (sequences)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10, help="steps before timing (the first is timed alone)")
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--sides", default="zeroplan,eager,compile")
    p.add_argument("--no-glu", action="store_true", help="skip the GLU fused-against-unfused comparison")
    p.add_argument("--gpu-profile", help="the plan's GPU profile (default: from nvidia-smi's name; "
                                         "h100-80gb-sxm for --backend cpu)")
    p.add_argument("--nvrtc-dir", help="ZEROPLAN_NVRTC_DIR for zeroplan (lib/ and include/)")
    p.add_argument("--timeout", type=int, default=300, help="seconds one measurement may take")
    p.add_argument("--budget", type=int, help="seconds for the whole sweep: measurements that would start "
                                              "later are recorded as skipped, so the tables are always written")
    p.add_argument("--out", required=True, help="directory for results.jsonl and results.md")
    p.add_argument("--work", help="directory for the plan files and PTX caches (default: a temporary one)")
    p.add_argument("--results", help="a Markdown file to append the section to (bench/RESULTS.md)")
    p.add_argument("--command", help="the command line to record (run.sh passes its own)")
    p.add_argument("--commit", help="the commit to record, where the tree is no git checkout (a copied tree)")
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.sides = [s for s in args.sides.split(",") if s]
    unknown = set(args.sides) - set(report.SIDES)
    if unknown:
        p.error(f"--sides: unknown {', '.join(sorted(unknown))} (the sides are {', '.join(report.SIDES)})")
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1")
    return args


def main(argv=None):
    args = parse(argv)
    args.started = time.monotonic()
    out = Out(args.out)
    if args.work is None:
        import tempfile

        args.work = tempfile.mkdtemp(prefix="zeroplan-gpubench-")
    out.add({"kind": "meta", "date": datetime.date.today().isoformat(),
             "commit": args.commit or commit(),
             "command": args.command or " ".join(map(shlex.quote, sys.argv)), "backend": args.backend,
             "seq": args.seq, "warmup": args.warmup, "steps": args.steps, "batches": args.batches})
    args.read_memory = None
    if args.backend == "cuda":
        name, memory_bytes, driver = nvidia_smi()
        args.profile = args.gpu_profile or zeroplan_side.gpu_profile(name)
        if args.profile is None:
            raise SystemExit(f"error: no bundled GPU profile for `{name}`: pass --gpu-profile NAME or a RON file")
        args.read_memory, source = gpu_memory.reader(0)
        out.add({"kind": "device", "name": name, "memory_bytes": memory_bytes, "driver": driver,
                 "profile": args.profile, "memory_source": source})
        why_not = torch_status()
    else:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   "this CPU")
        args.profile = args.gpu_profile or "h100-80gb-sxm"
        out.add({"kind": "device", "name": f"{cpu} (dry run)", "profile": args.profile})
        why_not = "the PyTorch sides run with --backend cuda only"
    torch_sides = [s for s in args.sides if s != "zeroplan"]
    if torch_sides and not why_not:
        out.add({**torch_worker(args, "peak-gemm", timeout=args.timeout), "kind": "peak_gemm"})
    for spec_path in args.models.split(","):
        spec = specs.load(os.path.join(ROOT, spec_path) if not os.path.isabs(spec_path) else spec_path)
        cache = os.path.join(args.work, "ptx", spec["name"])
        shutil.rmtree(cache, ignore_errors=True)
        for i, batch in enumerate(args.batches):
            if "zeroplan" in args.sides:
                run_zeroplan(args, out, spec_path, spec, batch, cache, cold=i == 0)
            for mode in torch_sides:
                run_torch(args, out, spec_path, spec, batch, mode, why_not)
            if spec["feed_forward"] == "Glu" and not args.no_glu:
                run_glu(args, out, spec_path, spec, batch, why_not)
    section = report.section(out.records)
    with open(os.path.join(out.dir, "results.md"), "w") as f:
        f.write(section)
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n" + section)
    sys.stdout.write(section)


if __name__ == "__main__":
    main()
