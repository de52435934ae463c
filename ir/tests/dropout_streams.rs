//! The builder marks exactly the dropout sites whose tensor is split over
//! the tensor ranks (`zeroplan_ir::dropout_stream`), and
//! `graph_for_tensor_rank` gives those, and only those, a stream per rank.

use std::collections::BTreeMap;
use std::path::PathBuf;

use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::dropout_stream::{graph_for_tensor_rank, is_sharded};
use zeroplan_ir::spec::{self, ModelSpec};
use zeroplan_ir::{Graph, Op};

fn model(name: &str) -> ModelSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../models/tiny/{name}.ron"));
    let m = spec::load(&path).unwrap_or_else(|e| panic!("{e}"));
    ModelSpec { hidden_dropout: 0.1, attention_dropout: 0.1, ..m }
}

fn build(m: &ModelSpec, t: u64, sp: bool) -> Graph {
    let options = BuildOptions { tensor_parallel: t, sequence_parallel: sp, ..BuildOptions::default() };
    forward(m, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// Each dropout node's stream, by name.
fn streams(g: &Graph) -> BTreeMap<String, u32> {
    g.nodes()
        .filter_map(|n| match n.op {
            Op::Dropout { stream, .. } => Some((n.name.to_string(), stream)),
            _ => None,
        })
        .collect()
}

/// The names of the sharded sites.
fn sharded(g: &Graph) -> Vec<String> {
    streams(g).into_iter().filter(|(_, s)| is_sharded(*s)).map(|(n, _)| n).collect()
}

#[test]
fn one_rank_marks_nothing_and_is_left_as_it_is() {
    for name in ["tiny-bert", "tiny-mosaicbert", "tiny-bert-sts"] {
        let g = build(&model(name), 1, false);
        assert!(!streams(&g).is_empty(), "{name}: no dropout");
        assert_eq!(sharded(&g), Vec::<String>::new(), "{name}");
        let mut rewritten = g.clone();
        assert_eq!(graph_for_tensor_rank(&mut rewritten, 0, 1).unwrap(), 0);
        assert_eq!(rewritten.to_text(), g.to_text(), "{name}: t = 1 rewritten");
    }
}

#[test]
fn tensor_parallel_marks_the_attention_and_glu_dropouts() {
    let g = build(&model("tiny-bert"), 2, false);
    let marked = sharded(&g);
    assert!(!marked.is_empty() && marked.iter().all(|n| n.ends_with("attn.probs_dropout")), "{marked:?}");
    assert!(streams(&g).contains_key("classifier.dropout") || streams(&g).contains_key("embeddings.dropout"));
    // MosaicBERT's GLU drops the column-parallel product.
    let g = build(&model("tiny-mosaicbert"), 2, false);
    let marked = sharded(&g);
    assert!(marked.iter().any(|n| n.ends_with("ffn.dropout")), "{marked:?}");
    assert!(marked.iter().all(|n| n.ends_with("attn.probs_dropout") || n.ends_with("ffn.dropout")), "{marked:?}");
}

#[test]
fn sequence_parallelism_marks_its_regions_not_the_classifier() {
    let g = build(&model("tiny-bert-sts"), 2, true);
    let all = streams(&g);
    let marked = sharded(&g);
    for site in ["embeddings.dropout", "layer0.attn.out_dropout", "layer0.ffn.dropout", "layer0.attn.probs_dropout"] {
        assert!(marked.iter().any(|n| n == site), "{site} not marked: {marked:?}");
    }
    assert!(all.contains_key("classifier.dropout") && !marked.contains(&"classifier.dropout".to_string()));
}

#[test]
fn each_rank_gets_its_own_sharded_streams() {
    let g = build(&model("tiny-bert"), 4, true);
    let per_rank: Vec<BTreeMap<String, u32>> = (0..4)
        .map(|r| {
            let mut mine = g.clone();
            assert!(graph_for_tensor_rank(&mut mine, r, 4).unwrap() > 0 || r == 0);
            streams(&mine)
        })
        .collect();
    for (name, stream) in &per_rank[0] {
        let ours: Vec<u32> = per_rank.iter().map(|s| s[name]).collect();
        let distinct = ours.iter().collect::<std::collections::BTreeSet<_>>().len();
        if is_sharded(*stream) {
            assert_eq!(distinct, 4, "{name}: {ours:?}");
        } else {
            assert_eq!(distinct, 1, "{name}: {ours:?}");
        }
    }
    // No two sites share a stream on any two ranks.
    let every: Vec<u32> = per_rank.iter().flat_map(|s| s.values().copied()).collect();
    let distinct = every.iter().collect::<std::collections::BTreeSet<_>>().len();
    let replicated = per_rank[0].values().filter(|s| !is_sharded(**s)).count();
    assert_eq!(distinct, every.len() - 3 * replicated);
}
