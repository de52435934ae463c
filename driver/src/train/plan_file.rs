//! What a plan file (`zeroplan compile -o`) says of the model it trains:
//! a plan holds the program, not the model spec, so the head and the
//! vocabulary are read back from the training graph.

use std::path::Path;

use zeroplan_ir::spec::Head;
use zeroplan_ir::{Graph, Op};

/// Whether `path` is a plan file (as `zeroplan compile -o` writes them).
pub fn is_plan(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.contains("program:") && t.contains("buffers:"))
}

/// The head a training graph ends in, and its vocabulary size.
pub fn head_of(g: &Graph) -> Option<(Head, u64)> {
    let vocab = vocab_of(g)?;
    let labels = g.nodes().find(|n| &*n.name == "labels" && n.op == Op::Input)?;
    let head = match (labels.outputs[0].shape.rank(), labels.outputs[0].dtype.is_float()) {
        (2, _) => Head::Mlm,
        (_, true) => Head::Classification { num_labels: 1 },
        _ => {
            let logits = g.outputs.iter().find(|(n, _)| n == "logits")?.1;
            Head::Classification { num_labels: g.value_type(logits).shape.dims().last()?.as_constant()? }
        }
    };
    Some((head, vocab))
}

/// The vocabulary of a training graph's word embeddings. A tensor rank
/// holds `1/t` of the table, padded to a multiple of `t`: its cross-entropy
/// knows the real size; without an MLM head, the padded table is the bound.
/// In flat buckets (every plan `compile` writes) the table is a view of its
/// bucket: the lookup's table operand has its rows.
fn vocab_of(g: &Graph) -> Option<u64> {
    let nodes = || g.nodes();
    let parallel = nodes()
        .find_map(|n| match n.op {
            Op::CrossEntropyStats { vocab, .. } => Some(vocab),
            _ => None,
        })
        .or_else(|| {
            nodes().find_map(|n| match n.op {
                Op::VocabShard { ranks, rows } => Some(ranks * rows),
                _ => None,
            })
        });
    let lookup = || {
        let n = g.node_by_name("embeddings.word").filter(|&n| g.node(n).op == Op::Embedding)?;
        g.value_type(*g.operands(n).first()?).shape.dims().first()?.as_constant()
    };
    parallel
        .or_else(|| nodes().find(|n| &*n.name == "embeddings.word.weight")?.outputs[0].shape.dims()[0].as_constant())
        .or_else(lookup)
}
