#!/usr/bin/env python3
"""An independent reference for `zeroplan embed`: sentence embeddings in numpy.

Install its dependencies once:

    python3 -m pip install numpy safetensors tokenizers

Usage (prints the same JSON as `zeroplan embed --json`):

    python3 scripts/reference_embed.py --model fixtures/minilm-l6 --text "a" --text "b"

It reads the same files as zeroplan: `config.json` (a Hugging Face BERT
config), `model.safetensors` (BertModel weights, with or without the `bert.`
prefix) and `tokenizer.json` (tokenised with the `tokenizers` package,
padding switched off, the file's truncation kept). The forward is a plain
post-LayerNorm BERT encoder written out here in float64, sharing no code with
zeroplan; the sentence embedding is sentence-transformers' recipe for
all-MiniLM-L6-v2: the last hidden state mean-pooled over the attention mask,
then L2-normalised. The similarity matrix is the embeddings' dot products
(their cosines, since they are unit vectors).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


ACTIVATIONS = {
    "gelu": gelu,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
}


def forward(weights, config, ids, types, mask):
    """The last hidden state, [batch, seq, hidden], in float64."""
    w = lambda name: weights[name]  # noqa: E731
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    eps = config.get("layer_norm_eps", 1e-12)
    act = ACTIVATIONS[config.get("hidden_act", "gelu")]
    batch, seq = ids.shape

    x = (
        w("embeddings.word_embeddings.weight")[ids]
        + w("embeddings.position_embeddings.weight")[np.arange(seq)][None, :, :]
        + w("embeddings.token_type_embeddings.weight")[types]
    )
    x = layer_norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"), eps)
    # Masked keys get a large negative score: exp() of it is 0.
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e30)

    def linear(v, name):
        return v @ w(name + ".weight").T + w(name + ".bias")

    def split(v):
        return v.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}"
        q = split(linear(x, p + ".attention.self.query"))
        k = split(linear(x, p + ".attention.self.key"))
        v = split(linear(x, p + ".attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + bias
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        attn = linear(context, p + ".attention.output.dense")
        x = layer_norm(
            attn + x, w(p + ".attention.output.LayerNorm.weight"), w(p + ".attention.output.LayerNorm.bias"), eps
        )
        inter = act(linear(x, p + ".intermediate.dense"))
        out = linear(inter, p + ".output.dense")
        x = layer_norm(out + x, w(p + ".output.LayerNorm.weight"), w(p + ".output.LayerNorm.bias"), eps)
    return x


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="directory with config.json, model.safetensors, tokenizer.json")
    parser.add_argument("--text", action="append", required=True, help="a text to embed (repeat for more)")
    args = parser.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    raw = load_file(os.path.join(args.model, "model.safetensors"))
    weights = {}
    for name, tensor in raw.items():
        bare = name[len("bert.") :] if name.startswith("bert.") else name
        weights[bare] = tensor.astype(np.float64) if tensor.dtype.kind == "f" else tensor

    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    tokenizer.no_padding()
    encodings = [tokenizer.encode(t) for t in args.text]
    seq = max(len(e.ids) for e in encodings)
    batch = len(encodings)
    ids = np.zeros((batch, seq), dtype=np.int64)
    types = np.zeros((batch, seq), dtype=np.int64)
    mask = np.zeros((batch, seq), dtype=np.int64)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        ids[i, :n] = e.ids
        types[i, :n] = e.type_ids
        mask[i, :n] = e.attention_mask

    hidden = forward(weights, config, ids, types, mask)
    m = mask[:, :, None].astype(np.float64)
    pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    embeddings = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    similarity = embeddings @ embeddings.T
    json.dump(
        {"dim": int(embeddings.shape[1]), "embeddings": embeddings.tolist(), "similarity": similarity.tolist()},
        sys.stdout,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
