"""Measured matrix-product and softmax speed at the fidelity rows' shapes (issue 27).

zeroplan's cost model prices a dense GEMM by its FLOPs over a peak times a
shape efficiency, and an elementwise pass by its bytes over bandwidth. The
Megatron rows it misses (`bench/fidelity/rows.csv`: nar-1.7b +36 %, mh-1.7b
+15 %) have step times made of these pieces, so this measures the pieces on
the lent GPU, at the rows' own shapes: each linear layer's forward, its input
gradient and its weight gradient, the attention's two batched products, and
a softmax over the s × s scores (the bytes-bound part).

Method (the device README's METHOD.md): random inputs, three input sets in
rotation so the 50 MB L2 holds none of them, CUDA events around 20 runs after
5 warm-ups, median of 5 such repeats; `torch.matmul` (cuBLAS, cuBLASLt).

    python3 bench/gpu/gemm_sweep.py --out DIR    # DIR/gemm.jsonl, DIR/gemm.md
"""

import argparse
import json
import os
import statistics

import torch

# (row, hidden, heads, seq, micro-batch, dtype): the fidelity rows' layers.
ROWS = [
    ("nar-1.7b", 2304, 24, 2048, 16, torch.float16),
    ("mh-1.7b", 2048, 16, 4096, 2, torch.bfloat16),
]


def shapes(hidden, heads, seq, micro):
    """(name, batch, M, N, K) of one layer's products, forward and backward."""
    m, h, f = micro * seq, hidden, 4 * hidden
    out = []
    for name, n, k in [("qkv", 3 * h, h), ("proj", h, h), ("fc1", f, h), ("fc2", h, f)]:
        out += [(f"{name} fwd", 1, m, n, k), (f"{name} dgrad", 1, m, k, n), (f"{name} wgrad", 1, k, n, m)]
    d = h // heads
    out += [("scores QKᵀ", micro * heads, seq, seq, d), ("context PV", micro * heads, seq, d, seq)]
    return out


def timed(fn, reps=20, warmup=5, repeats=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps / 1e3)
    return statistics.median(times), (max(times) - min(times)) / statistics.median(times)


def gemm(batch, m, n, k, dtype):
    shape = lambda r, c: (batch, r, c) if batch > 1 else (r, c)
    sets = [(torch.randn(shape(m, k), device="cuda", dtype=dtype),
             torch.randn(shape(k, n), device="cuda", dtype=dtype)) for _ in range(3)]
    i = [0]

    def run():
        a, b = sets[i[0] % 3]
        i[0] += 1
        torch.matmul(a, b)

    return timed(run)


def softmax(micro, heads, seq, dtype):
    sets = [torch.randn(micro, heads, seq, seq, device="cuda", dtype=dtype) for _ in range(2)]
    i = [0]

    def run():
        torch.softmax(sets[i[0] % 2], dim=-1)
        i[0] += 1

    return timed(run, reps=5)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    records = []
    for row, hidden, heads, seq, micro, dtype in ROWS:
        for name, batch, m, n, k in shapes(hidden, heads, seq, micro):
            seconds, spread = gemm(batch, m, n, k, dtype)
            flops = 2 * batch * m * n * k
            records.append(dict(row=row, op=name, batch=batch, m=m, n=n, k=k, dtype=str(dtype)[6:],
                                seconds=seconds, spread=spread, tflops=flops / seconds / 1e12))
        seconds, spread = softmax(micro, heads, seq, dtype)
        moved = 2 * micro * heads * seq * seq * torch.tensor([], dtype=dtype).element_size()
        records.append(dict(row=row, op="softmax s×s", batch=micro * heads, m=seq, n=seq, k=0, dtype=str(dtype)[6:],
                            seconds=seconds, spread=spread, tbps=moved / seconds / 1e12))
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "gemm.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    lines = [f"{props.name}, torch {torch.__version__}", "",
             "| row | op | batch | M | N | K | dtype | ms | spread | TFLOP/s or TB/s |", "|" + " --- |" * 10]
    for r in records:
        rate = f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else f"{r['tbps']:.2f} TB/s"
        lines.append(f"| {r['row']} | {r['op']} | {r['batch']} | {r['m']} | {r['n']} | {r['k']} | {r['dtype']} | "
                     f"{r['seconds'] * 1e3:.3f} | {r['spread'] * 100:.1f} % | {rate} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "gemm.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
