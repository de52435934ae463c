"""An independent CPU implementation of the same workload as
runtime/benches/host.rs, in JAX (jit-compiled by XLA for the host): the
all-MiniLM-L6-v2-sized BERT encoder's forward at batch 32 x seq 128, and
one MLM training step (forward, backward, AdamW), f32, no dropout.

Prints one JSON line per measurement: the median of RUNS timings after a
warm-up (compilation excluded), like the Rust bench.
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp

VOCAB, HIDDEN, LAYERS, HEADS, FFN, POSITIONS, TYPES = 30522, 384, 6, 12, 1536, 512, 2
EPS = 1e-12
BATCH, SEQ = 32, 128


def init(key):
    def normal(key, shape):
        return 0.02 * jax.random.normal(key, shape, jnp.float32)

    keys = iter(jax.random.split(key, 64))
    p = {
        "word": normal(next(keys), (VOCAB, HIDDEN)),
        "pos": normal(next(keys), (POSITIONS, HIDDEN)),
        "type": normal(next(keys), (TYPES, HIDDEN)),
        "emb_g": jnp.ones(HIDDEN), "emb_b": jnp.zeros(HIDDEN),
        "layers": [],
        "t_w": normal(next(keys), (HIDDEN, HIDDEN)), "t_b": jnp.zeros(HIDDEN),
        "t_g": jnp.ones(HIDDEN), "t_bb": jnp.zeros(HIDDEN),
        "dec_b": jnp.zeros(VOCAB),
        "pool_w": normal(next(keys), (HIDDEN, HIDDEN)), "pool_b": jnp.zeros(HIDDEN),
    }
    for _ in range(LAYERS):
        p["layers"].append({
            "qkv": normal(next(keys), (HIDDEN, 3 * HIDDEN)), "qkv_b": jnp.zeros(3 * HIDDEN),
            "o": normal(next(keys), (HIDDEN, HIDDEN)), "o_b": jnp.zeros(HIDDEN),
            "g1": jnp.ones(HIDDEN), "b1": jnp.zeros(HIDDEN),
            "up": normal(next(keys), (HIDDEN, FFN)), "up_b": jnp.zeros(FFN),
            "down": normal(next(keys), (FFN, HIDDEN)), "down_b": jnp.zeros(HIDDEN),
            "g2": jnp.ones(HIDDEN), "b2": jnp.zeros(HIDDEN),
        })
    return p


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + EPS) * g + b


def gelu(x):
    return jax.nn.gelu(x, approximate=False)


def encoder(p, ids, types, mask):
    x = p["word"][ids] + p["pos"][jnp.arange(SEQ)] + p["type"][types]
    x = layer_norm(x, p["emb_g"], p["emb_b"])
    bias = jnp.where(mask[:, None, None, :] != 0, 0.0, -jnp.inf)
    d = HIDDEN // HEADS
    for l in p["layers"]:
        qkv = x @ l["qkv"] + l["qkv_b"]
        q, k, v = [t.reshape(BATCH, SEQ, HEADS, d).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, -1)]
        a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d) + bias, -1)
        ctx = (a @ v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN)
        x = layer_norm(x + ctx @ l["o"] + l["o_b"], l["g1"], l["b1"])
        h = gelu(x @ l["up"] + l["up_b"])
        x = layer_norm(x + h @ l["down"] + l["down_b"], l["g2"], l["b2"])
    return x


def forward(p, ids, types, mask):
    x = encoder(p, ids, types, mask)
    return jnp.tanh(x[:, 0] @ p["pool_w"] + p["pool_b"]), x


def mlm_loss(p, ids, types, mask, labels):
    x = encoder(p, ids, types, mask)
    h = layer_norm(gelu(x @ p["t_w"] + p["t_b"]), p["t_g"], p["t_bb"])
    logits = h.reshape(-1, HIDDEN) @ p["word"].T + p["dec_b"]
    y = labels.reshape(-1)
    counted = y != -100
    lse = jax.nn.logsumexp(logits, -1)
    picked = jnp.take_along_axis(logits, jnp.where(counted, y, 0)[:, None], -1)[:, 0]
    return jnp.sum(jnp.where(counted, lse - picked, 0.0)) / jnp.maximum(counted.sum(), 1)


def train_step(p, m, v, t, batch, lr=5e-5, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    loss, g = jax.value_and_grad(mlm_loss)(p, *batch)
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    p = jax.tree.map(lambda p, m, v: p * (1 - lr * wd) - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), p, m, v)
    return p, m, v, loss


def median(runs, f):
    f()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    p = init(jax.random.PRNGKey(0))
    i = jnp.arange(BATCH * SEQ)
    ids = ((i * 7919 + 101) % VOCAB).reshape(BATCH, SEQ)
    types = jnp.zeros((BATCH, SEQ), jnp.int32)
    mask = jnp.ones((BATCH, SEQ), jnp.int32)
    labels = jnp.where(i % 7 == 3, ids.reshape(-1), -100).reshape(BATCH, SEQ)
    fwd = jax.jit(forward)
    tokens = BATCH * SEQ
    threads = os.cpu_count()
    common = {"model": "minilm-l6", "batch": BATCH, "seq": SEQ, "threads": threads, "jax": jax.__version__}
    s = median(runs, lambda: jax.block_until_ready(fwd(p, ids, types, mask)))
    print(json.dumps({"what": "forward", **common, "seconds": s, "tokens_per_s": tokens / s}))
    step = jax.jit(train_step)
    zeros = jax.tree.map(jnp.zeros_like, p)
    state = {"p": p, "m": zeros, "v": zeros, "t": 1}

    def one():
        state["p"], state["m"], state["v"], loss = step(state["p"], state["m"], state["v"], 1.0 * state["t"],
                                                        (ids, types, mask, labels))
        jax.block_until_ready(loss)

    s = median(runs, one)
    print(json.dumps({"what": "train_step", **common, "seconds": s, "tokens_per_s": tokens / s}))


if __name__ == "__main__":
    main()
