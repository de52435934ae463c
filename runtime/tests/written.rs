//! What the runner does with steps whose work a device moved into another
//! step's instruction (`Step::written`), as the CUDA device's multi-tensor
//! AdamW and bias-gradient GEMMs do — tested without a GPU on a device that
//! runs the host's instructions but merges runs of AdamW updates into the
//! last one's step, and marks one matmul's product as never written.
//!
//! - finite checks see every merged update's outputs, right after the
//!   instruction that computes them;
//! - a capture of a merged update reads its value after that instruction
//!   (the host runtime's value);
//! - a capture of a product the device never writes is an error naming it.

use std::collections::HashMap;

use zeroplan_backend_cpu::device::{Host, Instr};
use zeroplan_exec::{Buf, Rank, SelectError};
use zeroplan_ir::kernel::adamw_operands;
use zeroplan_ir::plan::Program;
use zeroplan_ir::spec::TrainingSpec;
use zeroplan_ir::{Bindings, NodeIndex, Op, Tensor, Value};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::runner::{Ctx, Device, Instruction, Loaded, RunError, Runner, Written};

mod common;

use common::{BATCH, SEQ, batch, model};

/// The host's instructions, several to a step.
struct Merged(Host);

struct Many(Vec<Instr>);

impl Instruction for Many {
    fn kind(&self) -> String {
        self.0.iter().map(Instruction::kind).collect::<Vec<_>>().join(" + ")
    }

    fn flops(&self) -> f64 {
        self.0.iter().map(Instruction::flops).sum()
    }

    fn touches(&self) -> Vec<(Buf, bool)> {
        self.0.iter().flat_map(Instruction::touches).collect()
    }
}

impl Device for Merged {
    type Instr = Many;

    fn load(
        program: &Program,
        order: &[NodeIndex],
        bufs: &HashMap<Value, Buf>,
        bindings: &Bindings,
        rank: Rank,
    ) -> Result<Loaded<Merged>, SelectError> {
        let (host, steps) = Host::load(program, order, bufs, bindings, rank)?;
        let g = &program.graph;
        let mut steps: Vec<_> = steps
            .into_iter()
            .map(|s| zeroplan_runtime::runner::Step {
                node: s.node,
                optimizer: s.optimizer,
                instr: s.instr.map(|i| Many(vec![i])),
                written: s.written,
            })
            .collect();
        // Each AdamW update moves into the next one's step when only empty
        // steps lie between (the updates touch disjoint buffers).
        let updates: Vec<usize> = (0..steps.len()).filter(|&at| adamw_operands(g, steps[at].node).is_some()).collect();
        for pair in updates.windows(2) {
            let (from, to) = (pair[0], pair[1]);
            if (from + 1..to).any(|at| steps[at].instr.is_some()) {
                continue;
            }
            let Some(Many(moved)) = steps[from].instr.take() else { continue };
            steps[to].instr.as_mut().expect("an update").0.splice(0..0, moved);
            for (at, step) in steps.iter_mut().enumerate().take(from + 1) {
                if step.written == Written::At(from) || at == from {
                    step.written = Written::At(to);
                }
            }
        }
        let first_matmul = steps.iter().position(|s| matches!(g.node(s.node).op, Op::MatMul { .. })).unwrap();
        steps[first_matmul].written = Written::Never;
        Ok((Merged(host), steps))
    }

    fn run(&self, instr: &Many, cx: &Ctx) -> Result<(), String> {
        instr.0.iter().try_for_each(|i| self.0.run(i, cx))
    }

    fn read(&self, buf: Buf, shape: Vec<usize>) -> Tensor {
        self.0.read(buf, shape)
    }

    fn write(&self, buf: Buf, t: &Tensor) {
        self.0.write(buf, t)
    }

    fn copy(&self, from: Buf, to: Buf) {
        self.0.copy(from, to)
    }

    fn fill(&self, buf: Buf, value: f64) {
        self.0.fill(buf, value)
    }
}

fn program() -> Program {
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions { shape_hint: bindings.clone(), ..PassOptions::default() };
    let train = TrainingSpec::default();
    let graph = compile(&model("tiny-bert"), &Target::Training(&train), options).unwrap().graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

/// The AdamW update nodes in schedule order (the first ones are merged).
fn updates(program: &Program) -> Vec<NodeIndex> {
    let g = &program.graph;
    g.topo_order().into_iter().filter(|&n| adamw_operands(g, n).is_some()).collect()
}

#[test]
fn finite_checks_cover_every_merged_update() {
    let program = program();
    let first = updates(&program)[0];
    let g = &program.graph;
    // A NaN in the first update's first moment: only that update sees it.
    let m = adamw_operands(g, first).unwrap()[2];
    let (name, shape) = (g.node(m.node).name.clone(), g.value_type(m).shape.clone());
    let dims: Vec<usize> = shape.dims().iter().map(|d| d.as_constant().unwrap() as usize).collect();
    let nan = Tensor::full(dims, g.value_type(m).dtype, f64::NAN);
    let mut merged = Runner::<Merged>::load(program.clone(), 7).unwrap();
    merged.set_state(&[(name.to_string(), nan.clone())].into()).unwrap();
    merged.set_finite_checks(true);
    match merged.step(&[batch(&model("tiny-bert"), 0)]) {
        Err(RunError::NonFinite { node, .. }) => assert_eq!(node, &*g.node(first).name, "the merged update is named"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("the NaN in `{name}` went unnoticed"),
    }
}

#[test]
fn captures_of_merged_updates_read_them_after_the_merged_instruction() {
    let program = program();
    let values: Vec<Value> = updates(&program).into_iter().map(|n| Value { node: n, output: 0 }).collect();
    let mut merged = Runner::<Merged>::load(program.clone(), 7).unwrap();
    let mut host = HostProgram::load(program, 7).unwrap();
    merged.capture(values.clone()).unwrap();
    host.capture(values).unwrap();
    let feeds = [batch(&model("tiny-bert"), 0)];
    let (got, want) = (merged.step(&feeds).unwrap().captured, host.step(&feeds).unwrap().captured);
    assert!(want[0].len() > 2);
    assert_eq!(got, want);
}

#[test]
fn a_capture_of_a_product_the_device_never_writes_is_an_error_naming_it() {
    let program = program();
    let g = &program.graph;
    let mm = g.topo_order().into_iter().find(|&n| matches!(g.node(n).op, Op::MatMul { .. })).unwrap();
    let mut merged = Runner::<Merged>::load(program.clone(), 7).unwrap();
    let err = merged.capture(vec![Value { node: mm, output: 0 }]).unwrap_err().to_string();
    assert!(err.contains(&*g.node(mm).name) && err.contains("never writes it"), "{err}");
}
