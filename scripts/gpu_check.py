"""The one-command GPU check: everything a lent GPU can show that this
machine cannot, in one run that records every figure and goes on past a
failing step.

Run through `scripts/gpu-check.sh` (which finds Python); `--help` lists the
options. Each step is a command (or a few) with a time limit; its output goes
to OUT/steps.log, its outcome and figures to OUT/report.json, and the
Markdown summary to OUT/report.md, rewritten after every step so a run cut
off half-way keeps what it measured. `--steps` runs a subset and merges into
an existing report in OUT, so a check longer than one device call is two
calls into the same OUT. `--dry-run` prints the commands and runs the whole
check with recorded outputs instead of a GPU (bench/gpu/testdata), so the
comparisons, the report and the going-on-past-failure are tested in CI.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(ROOT, "bench", "gpu", "testdata")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))

# Agreement of the CUDA backend with the host backend on the same plan, the
# same seed and batches: the tolerances runtime/tests/cuda.rs asserts. f32
# differs only by summation order (1e-5 relative); bf16 by the rounding of
# 8-bit-mantissa storage (2^-8 ≈ 4e-3 per value, 1e-2 on a loss).
TOLERANCE = {"f32": 1e-5, "bf16": 1e-2}
SANITIZER_TOOLS = ["memcheck", "racecheck", "synccheck"]


@dataclass
class Step:
    """One thing to check: a name, the commands, whether `--quick` keeps it."""

    name: str
    what: str
    quick: bool
    run: object  # (Check) -> dict of figures; raises StepFailed


class StepFailed(Exception):
    def __init__(self, message, figures=None):
        super().__init__(message)
        self.figures = figures or {}


class Check:
    """Where the check runs: the binary, the environment, the output folder."""

    def __init__(self, args):
        self.args = args
        self.out = args.out
        self.dry = args.dry_run
        self.log = open(os.path.join(self.out, "steps.log"), "a", encoding="utf-8")
        self.env = dict(os.environ)
        self.zeroplan = args.zeroplan or os.path.join(
            os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "zeroplan")
        if not self.dry:
            self._find_cuda_libraries()
        self.step = None

    def _find_cuda_libraries(self):
        """NVRTC + headers and cuBLAS: fixtures/nvrtc, the wheels beside torch, the toolkit."""
        paths = []
        nvrtc = self.args.nvrtc_dir or os.environ.get("ZEROPLAN_NVRTC_DIR")
        wheels = None
        try:
            import nvidia  # the pip wheels PyTorch brings (nvidia/cu13)

            for base in nvidia.__path__:
                d = os.path.join(base, "cu13")
                if os.path.isfile(os.path.join(d, "lib", "libnvrtc.so.13")):
                    wheels = d
        except ImportError:
            pass
        if not nvrtc and os.path.isfile(os.path.join(ROOT, "fixtures", "nvrtc", "lib", "libnvrtc.so.13")):
            nvrtc = os.path.join(ROOT, "fixtures", "nvrtc")
        if not nvrtc and wheels and os.path.isfile(os.path.join(wheels, "include", "cuda_bf16.h")):
            nvrtc = wheels
        if nvrtc:
            self.env["ZEROPLAN_NVRTC_DIR"] = nvrtc
        for lib in [wheels and os.path.join(wheels, "lib"), "/usr/local/cuda/lib64"]:
            if lib and os.path.isdir(lib):
                paths.append(lib)
        if paths:
            old = self.env.get("LD_LIBRARY_PATH")
            self.env["LD_LIBRARY_PATH"] = ":".join(paths + ([old] if old else []))

    def sh(self, cmd, timeout, recorded=None, env=None, cwd=ROOT):
        """Runs `cmd`, logs it and its output; the completed process.

        In a dry run nothing runs: `recorded` (a file in bench/gpu/testdata, or
        None for an empty success) stands for its output."""
        line = " ".join(cmd)
        timeout = min(timeout, self.args.max_step_seconds or timeout)
        self.log.write(f"\n$ {line}\n")
        self.log.flush()
        if self.dry:
            print(f"    would run: {line}")
            text = ""
            if recorded:
                with open(os.path.join(TESTDATA, recorded), encoding="utf-8") as f:
                    text = f.read()
            code = 1 if self.step in self.args.fail.split(",") else 0
            return subprocess.CompletedProcess(cmd, code, text, "injected failure\n" if code else "")
        started = time.monotonic()
        try:
            done = subprocess.run(cmd, cwd=cwd, env={**self.env, **(env or {})}, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.log.write(_text(e.stdout) + _text(e.stderr))
            raise StepFailed(f"`{line}` ran past {timeout} s") from e
        except OSError as e:
            raise StepFailed(f"`{line}` could not start: {e}") from e
        self.log.write(done.stdout + done.stderr + f"[exit {done.returncode}, {time.monotonic() - started:.1f} s]\n")
        self.log.flush()
        return done

    def must(self, cmd, timeout, recorded=None, env=None):
        done = self.sh(cmd, timeout, recorded, env)
        if done.returncode != 0:
            raise StepFailed(f"`{' '.join(cmd)}` exited {done.returncode}: {_last_line(done.stderr or done.stdout)}")
        return done


def _text(b):
    if b is None:
        return ""
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def _last_line(text):
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "(no message)"


# ---------------------------------------------------------------- the steps


def environment(c):
    done = c.must(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                   "--format=csv,noheader"], 30, "nvidia_smi.txt")
    figures = {"gpu": done.stdout.strip()}
    for tool in ["nvcc", "compute-sanitizer", "ncu"]:
        figures[tool] = shutil.which(tool) or "absent"
    if not c.dry:
        figures["torch"] = _python_probe("import torch; print(torch.__version__, torch.version.cuda)")
    return figures


def _python_probe(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else f"absent ({_last_line(done.stderr)})"


# The GPU test binaries: (cargo's package arguments, the test's name, the
# folder cargo runs it in). `--prebuilt DIR` holds the same names, built
# elsewhere: the lent machines have no Rust toolchain and no registry.
TESTS = {
    "gpu": (["-p", "zeroplan-backend-cuda"], "backend-cuda"),
    "cuda": (["-p", "zeroplan-runtime"], "runtime"),
    "nccl": (["-p", "zeroplan-runtime"], "runtime"),
    "launch": ([], "."),
}


def build(c):
    started = time.monotonic()
    if c.args.prebuilt:
        missing = [n for n in [*TESTS, "zeroplan"] if not os.access(os.path.join(c.args.prebuilt, n), os.X_OK)]
        if missing:
            raise StepFailed(f"--prebuilt {c.args.prebuilt}: no executable {', '.join(missing)}")
        return {"build_s": 0.0, "prebuilt": c.args.prebuilt}
    c.must(["cargo", "build", "--release", "--bin", "zeroplan"], 900)
    c.must(["cargo", "test", "--release", "--no-run", "-p", "zeroplan-backend-cuda", "--test", "gpu",
            "-p", "zeroplan-runtime", "--test", "cuda", "--test", "nccl"], 900)
    return {"build_s": round(time.monotonic() - started, 1)}


def _cargo_ignored(c, test, recorded, env=None):
    package, folder = TESTS[test]
    # --nocapture: the figures the tests print (attention's speed, graphs
    # against eager launches) go to steps.log; cargo hides a passing test's.
    flags = ["--ignored", "--test-threads", "1", "--nocapture"]
    if c.args.prebuilt:
        done = c.sh([os.path.abspath(os.path.join(c.args.prebuilt, test)), *flags],
                    900, recorded, env, cwd=os.path.join(ROOT, folder))
    else:
        done = c.sh(["cargo", "test", "--release", *package, "--test", test, "--", *flags], 900, recorded, env)
    passed, failed = _test_counts(done.stdout)
    figures = {"passed": passed, "failed": failed}
    if done.returncode != 0 or failed:
        raise StepFailed(f"{failed} failed, {passed} passed: {_failed_names(done.stdout)}", figures)
    if passed == 0:
        raise StepFailed("no test ran", figures)
    return figures


def _test_counts(stdout):
    passed = failed = 0
    for line in stdout.splitlines():
        if line.startswith("test result:"):
            words = line.replace(";", "").split()
            passed += int(words[words.index("passed") - 1])
            failed += int(words[words.index("failed") - 1])
    return passed, failed


def _failed_names(stdout):
    """The failed tests, from libtest's closing `failures:` list (under
    --nocapture a test's own output can split its `test NAME ... FAILED` line)."""
    lines = stdout.splitlines()
    listed = [i for i, line in enumerate(lines) if line.strip() == "failures:"]
    names = []
    if listed:
        for line in lines[listed[-1] + 1:]:
            if not line.startswith("    "):
                break
            names.append(line.strip())
    if not names:
        names = [line.split()[1] for line in lines if line.startswith("test ") and line.endswith("FAILED")]
    return ", ".join(names) or "see steps.log"


def backend_cuda_tests(c):
    return _cargo_ignored(c, "gpu", "cargo_test_ok.txt")


def runtime_cuda_tests(c):
    return _cargo_ignored(c, "cuda", "cargo_test_ok.txt")


def nccl_world_of_one(c):
    return _cargo_ignored(c, "nccl", "cargo_test_ok.txt")


def launched_ranks(c):
    return _cargo_ignored(c, "launch", "cargo_test_ok.txt", env={"ZEROPLAN_TEST_GPUS": "1"})


def ranks_on_one_gpu(c):
    """Two data-parallel ranks as threads sharing the one GPU, against the host's two."""
    common = ["train", "models/tiny/tiny-bert.ron", "--steps", "3", "--log-json", "--lr", "1e-2",
              "--ranks", "2", "--zero", "2"]
    gpu = _log(c.must([c.zeroplan, *common, "--backend", "cuda"], 300, "train_log.jsonl").stdout)
    cpu = _log(c.must([c.zeroplan, *common, "--backend", "cpu"], 300, "train_log.jsonl").stdout)
    return agreement(gpu, cpu, TOLERANCE["f32"])


def sanitizer(c):
    figures = {}
    failed = []
    for tool in SANITIZER_TOOLS:
        done = c.sh(["compute-sanitizer", "--tool", tool, "--error-exitcode", "99", c.zeroplan, "train",
                     "models/tiny/tiny-bert.ron", "--backend", "cuda", "--steps", "1"], 600, "sanitizer_ok.txt")
        summary = _last_line(done.stdout + "\n" + done.stderr)
        figures[tool] = summary
        if done.returncode != 0:
            failed.append(f"{tool}: {summary}")
    if failed:
        raise StepFailed("; ".join(failed), figures)
    return figures


def _log(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def agreement(gpu, cpu, tolerance):
    """The worst relative difference of loss and gradient norm, step by step;
    a StepFailed past `tolerance` or when the logs differ in length."""
    if not gpu or len(gpu) != len(cpu):
        raise StepFailed(f"{len(gpu)} steps logged on the GPU, {len(cpu)} on the host")
    worst = {}
    for name in ["loss", "grad_norm"]:
        worst[name] = max(abs(g[name] - h[name]) / max(abs(h[name]), 1e-30) for g, h in zip(gpu, cpu))
    figures = {f"{k}_rel_err": float(f"{v:.3e}") for k, v in worst.items()}
    figures["tolerance"] = tolerance
    figures["gpu_tokens_per_s"] = round(gpu[-1].get("tokens_per_s", 0.0))
    bad = [f"{k} {v:.2e}" for k, v in worst.items() if v > tolerance]
    if bad:
        raise StepFailed(f"over {tolerance:g}: {', '.join(bad)}", figures)
    return figures


def against_host(c, spec, precision, batch, seq, steps):
    """`spec` planned for this GPU, trained on CUDA (its memory sampled) and
    on the host; losses and gradient norms compared, measured peak against
    the plan's `memory.peak_bytes`."""
    with tempfile.TemporaryDirectory() as work:
        plan = os.path.join(work, "plan.ron")
        compiled = c.must([c.zeroplan, "compile", spec, "--gpu", c.args.gpu_profile, "--gpus", "1", "--seq", str(seq),
                           "--global-batch", str(batch), "--micro-batch", str(batch), "--precision", precision,
                           "--zero", "0", "--offload", "none", "--json", "-o", plan], 300, "zeroplan_plan.json")
        predicted = json.loads(compiled.stdout)["memory"]["peak_bytes"]
        train = ["train", plan, "--steps", str(steps), "--log-json"]
        peak, source = None, "dry run"
        if c.dry:
            gpu = _log(c.must([c.zeroplan, *train, "--backend", "cuda"], 600, "train_log.jsonl").stdout)
        else:
            import gpu_memory

            read, source = gpu_memory.reader()
            with gpu_memory.PeakSampler(read) as sampled:
                gpu = _log(c.must([c.zeroplan, *train, "--backend", "cuda"], 600).stdout)
            peak = sampled.peak_bytes
        cpu = _log(c.must([c.zeroplan, *train, "--backend", "cpu"], 1200, "train_log.jsonl").stdout)
    figures = {"predicted_peak_bytes": predicted, "measured_peak_bytes": peak, "memory_source": source}
    if peak:
        figures["peak_error_pct"] = round(100.0 * (predicted - peak) / peak, 1)
    try:
        figures.update(agreement(gpu, cpu, TOLERANCE[precision]))
    except StepFailed as e:
        e.figures = {**figures, **e.figures}
        raise
    return figures


def tiny_bert_against_host(c):
    return against_host(c, "models/tiny/tiny-bert.ron", "f32", 4, 16, 5)


def bert_base_against_host(c):
    return against_host(c, "models/bert-base.ron", "bf16", 8, 128, 3)


def _bert_base_plan(c, plan):
    """bert-base bf16 at batch 32 × seq 128 on one GPU, every activation kept:
    the benchmark's first row, written to `plan`."""
    c.must([c.zeroplan, "compile", "models/bert-base.ron", "--gpu", c.args.gpu_profile, "--gpus", "1", "--seq", "128",
            "--global-batch", "32", "--micro-batch", "32", "--precision", "bf16", "--zero", "0", "--offload", "none",
            "--recompute", "none", "-o", plan], 300)


def profile(c):
    """bert-base bf16 at batch 32 × seq 128 (the benchmark's first row), three
    steps with every instruction timed to its end: the slowest instruction
    kinds, where the step's time goes."""
    trace = os.path.join(c.out, "profile.json")
    with tempfile.TemporaryDirectory() as work:
        plan = os.path.join(work, "plan.ron")
        _bert_base_plan(c, plan)
        done = c.must([c.zeroplan, "train", plan, "--backend", "cuda", "--steps", "3", "--log-json", "--profile", trace],
                      600, "train_log.jsonl")
    rows = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(rows) if line.startswith("profile (rank 0)")), None)
    if start is None:
        return {"slowest": "no profile printed"}
    return {"total": rows[start], "slowest": rows[start + 2:start + 12]}


# The kernels the 2026-11-28 profile found far off their floor, as `ncu
# --kernel-name` matches them in bert-base's plan: the bias gradients'
# `sum_to`, LayerNorm's backward, the attention backward, the embedding
# gradient.
NCU_KERNELS = "regex:zp_sum_to|norm_back0|flash_attention_mma_bwd|embedding_grad"
# Per launch: time, DRAM traffic and its share of the peak, occupancy, shape.
NCU_METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
]


def kernels(c):
    """`ncu` over the first launches of the slow kernels of bert-base's step:
    what holds each (bytes, DRAM share, occupancy); the whole table in
    ncu_kernels.csv."""
    csv_path = os.path.join(c.out, "ncu_kernels.csv")
    with tempfile.TemporaryDirectory() as work:
        plan = os.path.join(work, "plan.ron")
        _bert_base_plan(c, plan)
        done = c.must(["ncu", "--kernel-name", NCU_KERNELS, "--launch-count", "16", "--csv", "--page", "raw",
                       "--metrics", ",".join(NCU_METRICS), c.zeroplan, "train", plan, "--backend", "cuda",
                       "--steps", "1", "--cuda-graphs", "off"], 600, "constructed_ncu_raw.csv")
    with open(csv_path, "w", encoding="utf-8") as f:
        f.write(done.stdout)
    return ncu_figures(done.stdout)


def ncu_figures(text):
    """Each kernel's first launch from `ncu --csv --page raw`: µs, GB moved,
    % of DRAM peak, % occupancy (warps active), registers, grid × block."""
    import csv

    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise StepFailed("no ncu table in the output (see steps.log)")
    rows = list(csv.DictReader(lines[start:]))
    units = rows[0] if rows and not rows[0]["ID"].strip().isdigit() else {}
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3,
             "Gbyte": 1.0}
    figures = {}
    for row in rows:
        if not row["ID"].strip().isdigit() or row["Kernel Name"] in figures:
            continue
        value = lambda m: float(row[m].replace(",", "")) * scale.get(units.get(m, ""), 1.0)
        figures[row["Kernel Name"]] = (
            f"{value('gpu__time_duration.sum'):.1f} µs, "
            f"{value('dram__bytes_read.sum') + value('dram__bytes_write.sum'):.4f} GB, "
            f"DRAM {value('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} %, "
            f"occupancy {value('sm__warps_active.avg.pct_of_peak_sustained_active'):.0f} %, "
            f"{value('launch__registers_per_thread'):.0f} registers, "
            f"{value('launch__grid_size'):.0f} × {value('launch__block_size'):.0f}"
        )
    if not figures:
        raise StepFailed("ncu matched no kernel of the step")
    return figures


def benchmark(c):
    bench_out = os.path.join(c.out, "bench")
    cmd = ["bench/gpu/run.sh", "--out", bench_out, "--zeroplan", c.zeroplan]
    if c.args.quick:
        cmd += ["--models", "models/bert-base.ron", "--batches", "32", "--steps", "10"]
    if c.dry:
        cmd += ["--results", os.path.join(bench_out, "results.md")]
    c.must(cmd, 1500 if not c.args.quick else 400, None)
    return {"records": os.path.join("bench", "results.jsonl"), "section": os.path.join("bench", "results.md")}


STEPS = [
    Step("environment", "the GPU, the driver, the tools", True, environment),
    Step("build", "release binary and the GPU test binaries", True, build),
    Step("backend-cuda", "`--ignored` GPU tests of backend-cuda (kernels, cuBLASLt, attention, AdamW)", True,
         backend_cuda_tests),
    Step("runtime-cuda", "`--ignored` runtime CUDA tests: whole steps against the host runtime", True,
         runtime_cuda_tests),
    Step("nccl", "NCCL at world size 1", True, nccl_world_of_one),
    Step("launch", "`launch --nproc 1 -- train --backend cuda` against the host", False, launched_ranks),
    Step("ranks-on-one-gpu", "2 data-parallel ranks (threads) on one GPU against the host's", False,
         ranks_on_one_gpu),
    Step("sanitizer", "compute-sanitizer memcheck, racecheck, synccheck over a tiny-bert step", True, sanitizer),
    Step("tiny-bert", "tiny-bert f32 on CUDA against the CPU backend; peak memory against the plan", True,
         tiny_bert_against_host),
    Step("bert-base", "bert-base bf16 seq 128 on CUDA against the CPU backend; peak memory against the plan", False,
         bert_base_against_host),
    Step("profile", "bert-base bf16 batch 32: each instruction timed; the slowest kinds", True, profile),
    Step("kernels", "ncu over bert-base's slowest kernels: time, DRAM bytes and share, occupancy", False, kernels),
    Step("benchmark", "bench/gpu/run.sh: BERT seq 128 bf16 against PyTorch eager and torch.compile", True, benchmark),
]


# ---------------------------------------------------------------- the report


def load_report(path):
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return {"steps": {}}


def write_report(out, report):
    """report.json and report.md, each written whole to a temporary and renamed."""
    _replace(os.path.join(out, "report.json"), json.dumps(report, indent=2, sort_keys=True) + "\n")
    _replace(os.path.join(out, "report.md"), markdown(report))


def _replace(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def markdown(report):
    dry = " — dry run: recorded outputs, no GPU" if report.get("dry_run") else ""
    lines = [f"## GPU check, {report.get('date', '?')} ({report.get('commit', '?')}){dry}", "",
             f"`{report.get('command', '')}` on {report.get('gpu', 'an unknown GPU')}.", "",
             "| step | outcome | seconds | figures |", "| --- | --- | --- | --- |"]
    order = [s.name for s in STEPS]
    for name in sorted(report["steps"], key=lambda n: order.index(n) if n in order else len(order)):
        r = report["steps"][name]
        figures = ", ".join(f"{k}={v}" for k, v in sorted(r.get("figures", {}).items()))
        outcome = r["outcome"] + (f": {r['why']}" if r.get("why") else "")
        lines.append(f"| {name} | {outcome} | {r.get('seconds', '')} | {figures} |".replace("\n", " "))
    passed = sum(r["outcome"] == "passed" for r in report["steps"].values())
    lines += ["", f"{passed} of {len(report['steps'])} steps passed.", ""]
    return "\n".join(lines)


def _commit():
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "not a git checkout"


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="scripts/gpu-check.sh")
    p.add_argument("--out", help="folder for report.md, report.json, steps.log and bench/")
    p.add_argument("--quick", action="store_true", help="only the steps marked quick, a smaller benchmark")
    p.add_argument("--dry-run", action="store_true", help="print the commands; run the logic on recorded outputs")
    p.add_argument("--steps", help="comma-separated step names to run (merged into OUT's report)")
    p.add_argument("--zeroplan", help="a release binary (default: cargo's target/release/zeroplan)")
    p.add_argument("--prebuilt", help="the test binaries gpu, cuda, nccl, launch and zeroplan, built elsewhere "
                   "(cargo test --release --no-run); the build step only checks them")
    p.add_argument("--max-step-seconds", type=int, help="caps every command's time limit (a lease is short)")
    p.add_argument("--nvrtc-dir", help="NVRTC 13 and the CUDA headers (lib/, include/)")
    p.add_argument("--gpu-profile", default="h100-80gb-sxm", help="the plans' GPU profile (models/gpus/)")
    p.add_argument("--fail", default="", help="dry run only: the named steps' commands fail (tests the report)")
    p.add_argument("--list", action="store_true", help="list the steps and exit")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.list:
        for s in STEPS:
            print(f"{s.name:18} {'quick' if s.quick else '     '}  {s.what}")
        return 0
    if not args.out:
        print("error: --out DIR is needed: the folder for the report (e.g. --out target/gpu-check)", file=sys.stderr)
        return 2
    names = [s.name for s in STEPS]
    chosen = [s for s in STEPS if not args.quick or s.quick]
    if args.steps:
        wanted = args.steps.split(",")
        unknown = [w for w in wanted if w not in names]
        if unknown:
            print(f"error: --steps: no step {', '.join(unknown)}; the steps are {', '.join(names)}", file=sys.stderr)
            return 2
        chosen = [s for w in wanted for s in STEPS if s.name == w]  # in the order given
    os.makedirs(args.out, exist_ok=True)
    c = Check(args)
    report = load_report(os.path.join(args.out, "report.json"))
    report.update({"date": datetime.date.today().isoformat(), "commit": _commit(),
                   "command": "scripts/gpu-check.sh " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "dry_run": args.dry_run})
    for s in chosen:
        print(f"[{s.name}] {s.what}", flush=True)
        started = time.monotonic()
        c.step = s.name
        try:
            figures, outcome, why = s.run(c), "passed", None
        except StepFailed as e:
            figures, outcome, why = e.figures, "failed", str(e)
        except Exception as e:  # noqa: BLE001 (a broken step is recorded; the check goes on)
            figures, outcome, why = {}, "failed", f"{type(e).__name__}: {e}"
        seconds = round(time.monotonic() - started, 1)
        report["steps"][s.name] = {"outcome": outcome, "why": why, "seconds": seconds, "figures": figures}
        if s.name == "environment" and outcome == "passed":
            report["gpu"] = figures["gpu"]
        print(f"[{s.name}] {outcome}{': ' + why if why else ''} ({seconds} s)", flush=True)
        write_report(args.out, report)
    failed = [n for n, r in report["steps"].items() if r["outcome"] != "passed"]
    print(f"report: {os.path.join(args.out, 'report.md')}; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
