//! The liveness check on a small program placed by hand, and the kernel
//! aliasing check on buffers alone.
//!
//! The program: `a = x + w`, `b = relu(a)`, `c = relu(b)` (an output) in
//! the forward, then `w_new = w - c` in the optimizer, written over `w`.
//! Schedule positions: `x` 0, `w` 1, `a` 2, `b` 3, `c` 4, `w_new` 5. Each
//! value takes 32 bytes; `b` reuses `x`'s bytes (dead after 2) and `c`
//! reuses `a`'s (dead after 3).

use zeroplan_ir::kernel::{KernelBuilder, Unary};
use zeroplan_ir::plan::{Buffer, Program};
use zeroplan_ir::{DType, Dim, Graph, Init, Op, Phase, Place, Shape, TensorType};

use super::*;
use crate::buffers::Rank;

const ONE: Rank = Rank { index: 0, ranks: 1, tensor: 0, tensor_ranks: 1 };

fn f32x8() -> TensorType {
    TensorType::new(Shape::new([Dim::constant(8)]), DType::F32)
}

/// The program, with `late` adding a forward node `d` after `w_new`
/// (position 6) that reads `c` and the value `late` names (`w` or
/// `w_new`); buffers at `offsets` (by value name).
fn program(late: Option<&str>, offsets: &[(&str, u64)]) -> Program {
    let mut g = Graph::new("lives");
    let x = g.input("x", f32x8()).unwrap();
    let w = g.param("w", f32x8(), Init::Zeros).unwrap();
    let a = g.add("a", Op::Add, &[x, w]).unwrap();
    let b = g.add("b", Op::Relu, &[a]).unwrap();
    let c = g.add("c", Op::Relu, &[b]).unwrap();
    g.set_output("c", c);
    g.phase = Phase::Optimizer;
    let w_new = g.add("w_new", Op::Sub, &[w, c]).unwrap();
    g.set_update(w.node, w_new).unwrap();
    if let Some(late) = late {
        g.phase = Phase::Forward;
        let d = g.add("d", Op::Mul, &[if late == "w" { w } else { w_new }, c]).unwrap();
        g.set_output("d", d);
    }
    let buffers = offsets
        .iter()
        .map(|&(value, offset)| Buffer { value: value.into(), place: Place::Device, offset, bytes: 32, alias_of: None })
        .collect();
    Program { graph: g, batch: 1, seq: 1, arena_bytes: 256, host_arena_bytes: 0, buffers }
}

const PLACED: [(&str, u64); 6] = [("x", 32), ("w", 0), ("a", 64), ("b", 32), ("c", 64), ("w_new", 0)];

/// `PLACED` with `value` at `offset`.
fn moved(value: &str, offset: u64) -> Vec<(&'static str, u64)> {
    PLACED.iter().map(|&(v, o)| (v, if v == value { offset } else { o })).collect()
}

fn load(p: &Program) -> Result<HashMap<Value, Buf>, String> {
    let order = p.graph.topo_order();
    let bindings = Bindings::new();
    buffers(p, &order, &bindings, ONE).map_err(|e| e.to_string())
}

#[test]
fn values_reusing_the_bytes_of_dead_ones_load() {
    load(&program(None, &PLACED)).unwrap();
}

#[test]
fn a_value_moved_onto_one_live_at_the_same_time_is_refused_naming_both() {
    // `c` onto `b`'s bytes: `c` is written by the instruction that reads `b`.
    let e = load(&program(None, &moved("c", 32))).unwrap_err();
    assert!(e.contains("`b` (bytes 32..64 of the device arena) and `c` (bytes 32..64)"), "{e}");
    assert!(e.contains("from instruction 4 (`c`) to 4 (`c`)"), "{e}");
    assert!(e.contains("compile it again"), "{e}");
}

#[test]
fn a_value_moved_onto_a_parameter_is_refused() {
    // A parameter holds its bytes from one step to the next.
    let e = load(&program(None, &moved("x", 8))).unwrap_err();
    assert!(e.contains("`w` (bytes 0..32 of the device arena) and `x` (bytes 8..40)"), "{e}");
}

#[test]
fn an_output_lives_to_the_end_of_the_step() {
    // `w_new` off `w`'s bytes is copied into `w` at the step's end; onto `c`,
    // the output read then, it would overwrite it.
    load(&program(None, &moved("w_new", 128))).unwrap();
    let e = load(&program(None, &moved("w_new", 64))).unwrap_err();
    assert!(e.contains("`c` (bytes 64..96 of the device arena) and `w_new` (bytes 64..96)"), "{e}");
}

#[test]
fn an_update_written_in_place_before_a_read_of_the_old_value_is_refused() {
    let mut placed = PLACED.to_vec();
    placed.push(("d", 96));
    let e = load(&program(Some("w"), &placed)).unwrap_err();
    assert!(e.contains("the buffer of `w_new`: it is `w`'s bytes, written in place at instruction 5"), "{e}");
    assert!(e.contains("but `d` reads `w` after that, at instruction 6"), "{e}");
    // Off `w`'s bytes, the update is copied into `w` when the step ends,
    // after `d`: so it lives till then, and `d` may not take its bytes.
    placed[5].1 = 128;
    load(&program(Some("w"), &placed)).unwrap();
    placed[6].1 = 128;
    let e = load(&program(Some("w"), &placed)).unwrap_err();
    assert!(e.contains("`w_new` (bytes 128..160 of the device arena) and `d` (bytes 128..160)"), "{e}");
}

/// A micro-batch reading a value the optimizer writes reads, on every
/// micro-batch of the next step, what the last step wrote: the value
/// lives throughout, though its schedule positions are disjoint from `x`'s.
#[test]
fn an_optimizer_value_a_micro_batch_reads_lives_throughout() {
    let mut placed = moved("w_new", 128);
    placed.push(("d", 160));
    load(&program(Some("w_new"), &placed)).unwrap();
    placed[0].1 = 128;
    let e = load(&program(Some("w_new"), &placed)).unwrap_err();
    assert!(e.contains("`x` (bytes 128..160 of the device arena) and `w_new` (bytes 128..160)"), "{e}");
}

fn device(offset: usize, len: usize) -> Buf {
    Buf { place: Place::Device, offset, len, dtype: DType::F32 }
}

#[test]
fn a_kernel_output_may_be_its_input_but_not_overlap_it() {
    let mut k = KernelBuilder::new("k", Shape::new([Dim::constant(8)]));
    let x = k.load("x", f32x8(), vec![0]);
    let y = k.unary(Unary::Relu, x);
    k.store("out", f32x8(), y);
    let k = k.finish().unwrap();
    kernel_launch(&k, &[8], &[device(0, 8)], &[device(0, 8)]).unwrap();
    let e = kernel_launch(&k, &[8], &[device(0, 8)], &[device(4, 8)]).unwrap_err();
    assert!(e.contains("output 0 overlaps input 0"), "{e}");
}

/// What the liveness check adds to a load, on a plan file `zeroplan
/// compile` wrote: `ZEROPLAN_PLAN=/tmp/bert-large.ron cargo test --release
/// -p zeroplan-exec -- --ignored --nocapture liveness_cost`. Prints the
/// fastest of five runs of the whole buffer validation and of the liveness
/// check alone, on rank 0; the last data and tensor rank must load too.
#[test]
#[ignore = "a measurement: needs a plan file (ZEROPLAN_PLAN), and a release build"]
fn liveness_cost() {
    let path = std::env::var("ZEROPLAN_PLAN").expect("ZEROPLAN_PLAN names a plan file");
    let plan = zeroplan_ir::plan::Plan::from_ron(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (p, strategy) = (&plan.program, &plan.strategy);
    let order = p.graph.topo_order();
    let bindings: Bindings = [("batch".to_string(), p.batch), ("seq".to_string(), p.seq)].into();
    let rank =
        Rank { index: 0, ranks: strategy.ranks as usize, tensor: 0, tensor_ranks: strategy.tensor_parallel as usize };
    let fastest = |run: &dyn Fn()| {
        (0..5)
            .map(|_| {
                let start = std::time::Instant::now();
                run();
                start.elapsed()
            })
            .min()
            .unwrap()
    };
    let last = Rank { index: rank.ranks - 1, tensor: rank.tensor_ranks - 1, ..rank };
    buffers(p, &order, &bindings, last).unwrap();
    let bufs = buffers(p, &order, &bindings, rank).unwrap();
    let all = fastest(&|| drop(buffers(p, &order, &bindings, rank).unwrap()));
    let lives = fastest(&|| live_values_apart(&p.graph, &order, &bufs).unwrap());
    eprintln!(
        "{path}: {} values, {} nodes: buffers {all:?}, of which the liveness check {lives:?}",
        bufs.len(),
        order.len()
    );
}
