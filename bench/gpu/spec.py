"""A zeroplan model spec (models/*.ron) as the PyTorch side needs it.

Reads the subset of RON the model specs use (one top-level struct of
`field: value` pairs, `//` comments, identifiers, numbers, `None`,
`Some(x)`), maps it onto a Hugging Face `BertConfig`, and counts its
parameters the way zeroplan builds them (`ir/src/build/`) and Hugging Face
`BertForMaskedLM` does (the decoder tied to the word embeddings, so counted
once). The count is the Ψ of MFU = 6·Ψ·tokens/s / peak: both sides must
report it, and agree with it, before their throughputs are compared.

No torch or transformers here: the mapping is tested without them.
"""

import re

# zeroplan's activations by Hugging Face's `hidden_act` names.
# `Gelu` is erf GELU (`gelu`); `GeluTanh` is the tanh approximation.
HF_ACTIVATION = {"Gelu": "gelu", "GeluTanh": "gelu_pytorch_tanh", "Relu": "relu", "Silu": "silu"}

DEFAULTS = {
    "type_vocab": 2,
    "embedding_size": None,
    "initializer_range": 0.02,
    "sharing": "Independent",
    "head": "Mlm",
}


class SpecError(ValueError):
    """A spec this harness cannot read or cannot express on the PyTorch side."""


def _strip_comments(text):
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def _split_top_level(body):
    """Splits `a: 1, b: Some(2), c: X(k: 3)` at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [p.strip() for p in parts if p.strip()]


def _value(text):
    text = text.strip()
    if text == "None":
        return None
    m = re.fullmatch(r"Some\((.*)\)", text, re.S)
    if m:
        return _value(m.group(1))
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text  # an identifier (`Gelu`) or a nested struct, kept as written


def parse(text, path="<spec>"):
    """The spec's fields (defaults filled in) from RON text."""
    body = _strip_comments(text).strip()
    if not (body.startswith("(") and body.endswith(")")):
        raise SpecError(f"{path}: a model spec is one RON struct `( field: value, ... )`")
    fields = dict(DEFAULTS)
    for part in _split_top_level(body[1:-1]):
        key, sep, value = part.partition(":")
        if not sep:
            raise SpecError(f"{path}: `{part}` is not `field: value`")
        fields[key.strip()] = _value(value)
    for need in ("name", "vocab_size", "hidden", "layers", "heads", "intermediate", "max_position",
                 "activation", "feed_forward", "position", "norm", "layer_norm_eps", "hidden_dropout",
                 "attention_dropout"):
        if need not in fields:
            raise SpecError(f"{path}: the field `{need}` is missing")
    return fields


def load(path):
    with open(path) as f:
        return parse(f.read(), str(path))


def params(spec):
    """Parameters of the spec with its MLM head, as zeroplan builds it:
    embeddings (word, learned positions, token types, LayerNorm; a factorised
    embedding's projection), per layer Q/K/V/output with biases and two
    LayerNorms, the feed-forward (MLP: up and down with biases; GLU: gate and
    up without bias, down with bias), and the MLM head (transform with bias,
    LayerNorm, decoder bias; the decoder weight is the word embeddings)."""
    if spec["sharing"] != "Independent":
        raise SpecError(f"{spec['name']}: shared layers ({spec['sharing']}) are not counted here")
    if spec["head"] != "Mlm":
        raise SpecError(f"{spec['name']}: the harness trains the MLM head, the spec has `{spec['head']}`")
    v, h, i, n = spec["vocab_size"], spec["hidden"], spec["intermediate"], spec["layers"]
    e = spec["embedding_size"] or h
    embeddings = v * e + spec["type_vocab"] * e + 2 * e
    if spec["position"] == "Learned":
        embeddings += spec["max_position"] * e
    if e != h:
        embeddings += e * h + h
    attention = 4 * (h * h + h) + 2 * h
    if spec["feed_forward"] == "Mlp":
        ffn = h * i + i + i * h + h
    elif spec["feed_forward"] == "Glu":
        ffn = 2 * h * i + i * h + h
    else:
        raise SpecError(f"{spec['name']}: feed_forward `{spec['feed_forward']}` is not known here")
    layer = attention + ffn + 2 * h
    head = h * e + e + 2 * e + v
    return embeddings + n * layer + head


def hf_bert_config(spec):
    """`BertConfig` keyword arguments for a spec that Hugging Face
    `BertForMaskedLM` can express, or `SpecError` saying why not."""
    name = spec["name"]
    unsupported = []
    if spec["feed_forward"] != "Mlp":
        unsupported.append(f"feed_forward: {spec['feed_forward']}")
    if spec["position"] != "Learned":
        unsupported.append(f"position: {spec['position']}")
    if spec["norm"] != "Post":
        unsupported.append(f"norm: {spec['norm']}")
    if spec["embedding_size"] not in (None, spec["hidden"]):
        unsupported.append(f"embedding_size: {spec['embedding_size']}")
    if spec["sharing"] != "Independent":
        unsupported.append(f"sharing: {spec['sharing']}")
    if spec["activation"] not in HF_ACTIVATION:
        unsupported.append(f"activation: {spec['activation']}")
    if unsupported:
        raise SpecError(
            f"{name}: Hugging Face BertForMaskedLM has no {', '.join(unsupported)} "
            "(MosaicBERT's model code comes with trust_remote_code from the Hub, which the GPU machine cannot reach)"
        )
    return {
        "vocab_size": spec["vocab_size"],
        "hidden_size": spec["hidden"],
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "intermediate_size": spec["intermediate"],
        "hidden_act": HF_ACTIVATION[spec["activation"]],
        "max_position_embeddings": spec["max_position"],
        "type_vocab_size": spec["type_vocab"],
        "layer_norm_eps": spec["layer_norm_eps"],
        "hidden_dropout_prob": spec["hidden_dropout"],
        "attention_probs_dropout_prob": spec["attention_dropout"],
        "initializer_range": spec["initializer_range"],
        "tie_word_embeddings": True,
    }
