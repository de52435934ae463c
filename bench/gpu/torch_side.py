"""The PyTorch side of the GPU benchmark: one measurement per process.

    python3 bench/gpu/torch_side.py train --spec models/bert-base.ron --batch 64 --mode eager|compile
    python3 bench/gpu/torch_side.py peak-gemm [--n 8192]
    python3 bench/gpu/torch_side.py glu --hidden 768 --intermediate 3072 --tokens 8192

Prints one JSON object on standard output (`harness.py` collects them).

`train`: Hugging Face `BertForMaskedLM` built from the zeroplan spec's
dimensions (`spec.hf_bert_config`), SDPA attention, fp32 weights under bf16
autocast, AdamW as zeroplan's training-spec defaults (Hugging Face Trainer's:
lr 5e-5, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on matrices only,
gradients clipped to norm 1.0). Synthetic MLM batches: uniform token ids, 15 %
of positions labelled (the rest -100), no padding (so no attention mask, which
lets SDPA pick its fused kernels). `--warmup` steps, then `--steps` steps timed
with CUDA events; the first step is also timed alone on the wall clock (for
`compile`, that is Dynamo + Inductor + Triton compilation and the step).

`peak-gemm`: the card's bf16 matmul rate, the MFU denominator, measured in the
same run: an n×n×n bf16 product, 3 warm-ups, then 20 timed with CUDA events.

`glu`: MosaicBERT's feed-forward input projections at one token count, the
two forms zeroplan's `rewrite` pass prices (`passes/src/rewrite/cost.rs`):
separate (gate and up, two GEMMs) against merged (the weights concatenated,
one GEMM, its output split into two contiguous halves).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec as specs  # noqa: E402


def cuda_events_ms(torch, fn, reps):
    """Mean milliseconds of `fn()` over `reps` calls, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def peak_gemm(args):
    import torch

    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ms = cuda_events_ms(torch, lambda: a @ b, 20)
    return {"kind": "peak_gemm", "n": n, "ms": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12, **versions(torch)}


def glu(args):
    import torch

    m, h, i = args.tokens, args.hidden, args.intermediate
    x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(i, h, device="cuda", dtype=torch.bfloat16)
    up = torch.randn(i, h, device="cuda", dtype=torch.bfloat16)

    def separate():
        return x @ gate.t(), x @ up.t()

    def merged():
        y = x @ torch.cat([gate, up]).t()
        return y[:, :i].contiguous(), y[:, i:].contiguous()

    times = {}
    for name, fn in (("separate", separate), ("merged", merged)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        times[name] = cuda_events_ms(torch, fn, 50) * 1e3
    return {"kind": "glu_measured", "tokens": m, "hidden": h, "intermediate": i,
            "separate_us": times["separate"], "merged_us": times["merged"]}


def versions(torch):
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name()}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    return out


def build_model(torch, spec, seed):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(**specs.hf_bert_config(spec), attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    if getattr(model.config, "_attn_implementation", None) != "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    attention = getattr(model.config, "_attn_implementation", None)
    if attention != "sdpa":
        raise RuntimeError(f"transformers built BertForMaskedLM with attention `{attention}`, not sdpa")
    return model.cuda().train(), attention


def optimizer(torch, model, train):
    """AdamW as zeroplan's defaults: no decay on biases and LayerNorms."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": train["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    kwargs = {"lr": train["lr"], "betas": train["betas"], "eps": train["eps"]}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, **kwargs), "foreach"


# zeroplan's TrainingSpec::default (ir/src/spec/training.rs), the compile command's bf16.
TRAIN = {"lr": 5e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "max_grad_norm": 1.0}


def batches(torch, spec, batch, seq, count, seed):
    """`count` synthetic MLM batches on the GPU: 15 % of positions labelled."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(0, spec["vocab_size"], (batch, seq), device="cuda", generator=g)
        chosen = torch.rand((batch, seq), device="cuda", generator=g) < 0.15
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        out.append((ids, torch.zeros_like(ids), labels))
    return out


def train(args):
    import torch

    spec = specs.load(args.spec)
    expected = specs.params(spec)
    model, attention = build_model(torch, spec, args.seed)
    params = sum(p.numel() for p in model.parameters())
    if params != expected:
        raise RuntimeError(f"BertForMaskedLM has {params} parameters, the spec {expected}: the configs differ")
    opt, adamw = optimizer(torch, model, TRAIN)
    forward = torch.compile(model) if args.mode == "compile" else model
    data = batches(torch, spec, args.batch, args.seq, 4, args.seed)

    def step(i):
        ids, types, labels = data[i % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(input_ids=ids, token_type_ids=types, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    started = time.perf_counter()
    first_loss = step(0).item()
    first_step_s = time.perf_counter() - started
    for i in range(1, args.warmup):
        step(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.steps
    tokens = args.batch * args.seq
    return {
        "kind": "run", "side": args.mode, "model": spec["name"], "batch": args.batch, "seq": args.seq,
        "status": "ok", "params": params, "spec_params": expected, "attention": attention, "adamw": adamw,
        "warmup": args.warmup, "timed_steps": args.steps, "step_ms": ms, "tokens_per_s": tokens / (ms * 1e-3),
        "first_step_s": first_step_s, "first_loss": first_loss, "last_loss": loss.item(),
        "allocator_peak_bytes": torch.cuda.max_memory_allocated(),
        "allocator_reserved_bytes": torch.cuda.max_memory_reserved(),
        **versions(torch),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train")
    t.add_argument("--spec", required=True)
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq", type=int, default=128)
    t.add_argument("--mode", choices=["eager", "compile"], required=True)
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--steps", type=int, default=50)
    t.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("peak-gemm")
    g.add_argument("--n", type=int, default=8192)
    u = sub.add_parser("glu")
    u.add_argument("--tokens", type=int, required=True)
    u.add_argument("--hidden", type=int, required=True)
    u.add_argument("--intermediate", type=int, required=True)
    args = p.parse_args(argv)
    if args.what == "train" and (args.warmup < 1 or args.steps < 1):
        p.error("--warmup and --steps must be at least 1 (the first step is timed alone, then --steps)")
    try:
        result = {"train": train, "peak-gemm": peak_gemm, "glu": glu}[args.what](args)
    except Exception as e:  # noqa: BLE001 (the harness records why a configuration did not run)
        oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e)
        result = {"kind": "run" if args.what == "train" else args.what, "status": "oom" if oom else "error",
                  "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        if args.what == "train":
            result.update(side=args.mode, batch=args.batch, seq=args.seq)
        print(json.dumps(result), flush=True)
        raise
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
