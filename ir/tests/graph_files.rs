//! The text form is deterministic and RON files round-trip.

mod common;

use common::load_model;
use zeroplan_ir::Graph;
use zeroplan_ir::build::{BuildOptions, forward};

#[test]
fn ron_round_trips_every_tiny_graph() {
    for file in common::tiny_models() {
        let file = file.as_str();
        let graph = forward(&load_model(file), &BuildOptions::default()).unwrap();
        let ron = graph.to_ron();
        let back = Graph::from_ron(&ron).unwrap_or_else(|e| panic!("{file}: {e}"));
        back.verify().unwrap();
        assert_eq!(back.to_ron(), ron, "{file}");
        assert_eq!(back.to_text(), graph.to_text(), "{file}");
        assert_eq!(back.parameter_count(), graph.parameter_count());
    }
}

#[test]
fn building_twice_gives_identical_text() {
    let spec = load_model("bert-base.ron");
    let a = forward(&spec, &BuildOptions::default()).unwrap().to_text();
    let b = forward(&spec, &BuildOptions::default()).unwrap().to_text();
    assert_eq!(a, b);
}

#[test]
fn a_hand_edited_graph_that_no_longer_types_is_rejected_at_its_node() {
    let graph = forward(&load_model("tiny/tiny-bert.ron"), &BuildOptions::default()).unwrap();
    let ron = graph.to_ron();
    // Make layer 0's query weight [32, 31]: its matmul no longer type-checks.
    let at = ron.find("name: \"layer0.attn.q.weight\"").expect("the query weight is in the file");
    let (head, tail) = ron.split_at(at);
    let edited = format!("{head}{}", tail.replacen("shape: [\"32\", \"32\"]", "shape: [\"32\", \"31\"]", 1));
    assert_ne!(edited, ron);
    let err = Graph::from_ron(&edited).unwrap_err().to_string();
    assert!(err.contains("layer0.attn.q.mm") && err.contains("K = 31"), "{err}");
}

#[test]
fn a_graph_file_naming_two_nodes_alike_is_rejected_at_the_second() {
    use zeroplan_ir::{DType, Dim, Shape, TensorType};
    // Sources alone: no operand is looked up by name while they load.
    let mut g = Graph::new("g");
    let ty = TensorType::new(Shape::new([Dim::constant(4)]), DType::F32);
    g.input("x", ty.clone()).unwrap();
    g.input("y", ty).unwrap();
    let edited = g.to_ron().replace("\"y\"", "\"x\"");
    let err = Graph::from_ron(&edited).unwrap_err().to_string();
    assert!(err.contains("`x`") && err.contains("a node of this name"), "{err}");
    // A whole step's: a weight listed twice.
    let ron = forward(&load_model("tiny/tiny-bert.ron"), &BuildOptions::default()).unwrap().to_ron();
    let start = ron.find("(\n        name: \"layer0.attn.q.weight\"").expect("the query weight is in the file");
    let end = start + ron[start..].find("\n    )").expect("its entry ends") + "\n    )".len();
    let edited = format!("{}, {}{}", &ron[..end], &ron[start..end], &ron[end..]);
    let err = Graph::from_ron(&edited).unwrap_err().to_string();
    assert!(err.contains("layer0.attn.q.weight") && err.contains("a node of this name"), "{err}");
}

#[test]
fn malformed_graph_files_are_errors() {
    for bad in ["", "(", "(name: \"g\", nodes: [], outputs: [(\"loss\", \"nowhere\")])"] {
        assert!(Graph::from_ron(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn bf16_graphs_type_every_float_tensor_bf16() {
    use zeroplan_ir::DType;
    let options = BuildOptions::new(DType::BF16);
    let graph = forward(&load_model("tiny/tiny-mosaicbert.ron"), &options).unwrap();
    let text = graph.to_text();
    let params: Vec<&str> = text.lines().filter(|l| l.contains("= param")).collect();
    assert!(!params.is_empty() && params.iter().all(|l| l.contains(": bf16[")), "{params:?}");
    assert!(text.contains("%loss: f32[]"), "losses accumulate in f32");
}

/// A graph holding the tiles of `w` [6, 4] with row blocks `blocks`, read
/// back from its file.
fn tiled(blocks: &[(u64, u64)]) -> Result<Graph, String> {
    use zeroplan_ir::{DType, Dim, Init, Shape, TensorType};
    let mut g = Graph::new("tiles");
    for (i, &(start, len)) in blocks.iter().enumerate() {
        let init = Init::Slice { of: "w".into(), whole: [6, 4].into(), start, len, init: Init::Ones.into() };
        let ty = TensorType::new(Shape(vec![Dim::constant(len), Dim::constant(4)]), DType::F32);
        g.param(format!("w.tile{i}"), ty, init).map_err(|e| e.to_string())?;
    }
    Graph::from_ron(&g.to_ron()).map_err(|e| e.to_string())
}

/// Each tile's initialiser draws its parameter's whole tensor, so the
/// tiles a file holds must partition the whole's rows: a gap, an overlap
/// or a whole larger than its tiles is refused; a tile repeated is not.
#[test]
fn the_tiles_of_a_parameter_partition_its_rows() {
    tiled(&[(0, 2), (2, 4)]).unwrap();
    tiled(&[(0, 2), (2, 4), (0, 2)]).unwrap();
    for (blocks, expect) in [
        (&[(0, 2), (3, 3)][..], "gap or overlap at row 2"),
        (&[(0, 3), (2, 4)][..], "gap or overlap at row 2"),
        (&[(0, 2), (2, 2)][..], "cover 4 rows of [6, 4]"),
        (&[(0, 2), (4, 4)][..], "rows 4.. (4 of them) lie outside [6, 4]"),
    ] {
        let e = tiled(blocks).unwrap_err();
        assert!(e.contains(expect), "{blocks:?}: {e}");
    }
}

/// Split sizes whose sum wraps `u64` (found by the timed fuzz run, where
/// it overflowed in a debug build) are refused like any that miss the axis.
#[test]
fn split_sizes_past_two_to_the_sixty_four_are_refused() {
    use zeroplan_ir::{DType, Dim, Init, Op, Shape, TensorType};
    let mut g = Graph::new("split");
    let x = g.param("x", TensorType::new(Shape(vec![Dim::constant(4)]), DType::F32), Init::Ones).unwrap();
    let split = Op::Split { axis: 0, sizes: vec![u64::MAX, 5] };
    let e = g.add_node("x.split", split, &[x], Vec::new()).unwrap_err().to_string();
    assert!(e.contains("must be positive and sum to axis 0"), "{e}");
}
