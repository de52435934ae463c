//! The runner's side of CUDA graphs, without a GPU: a device that runs the
//! host's instructions, calls its kernels and GEMMs recordable, and logs
//! each segment the runner hands it (then runs it eagerly, as a device
//! whose recording failed would).
//!
//! - each segment is handed over once per pass, at its first step, and its
//!   other steps are not run on their own;
//! - the results are the host runtime's, bit for bit, over several
//!   micro-batches with dropout on (each segment gets its pass's counter
//!   word);
//! - a capture splits a segment after the value's step; profiling or
//!   `--cuda-graphs off` hands over none.

use std::collections::HashMap;
use std::sync::Mutex;

use zeroplan_backend_cpu::device::{Host, Instr};
use zeroplan_exec::graphs::{Capture, Masks};
use zeroplan_exec::{Buf, Rank, SelectError};
use zeroplan_ir::interp::Feeds;
use zeroplan_ir::plan::Program;
use zeroplan_ir::spec::TrainingSpec;
use zeroplan_ir::{Bindings, NodeIndex, Tensor, Value};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::runner::{Ctx, Device, GraphMode, Loaded, Runner};

mod common;

use common::{BATCH, SEQ, batch, model};

/// The host, with graphs it only pretends to record: `(key, instructions,
/// counter word)` per segment handed over, and instructions run alone.
struct Recording {
    host: Host,
    segments: Mutex<Vec<(usize, usize, u64)>>,
    alone: Mutex<usize>,
}

impl Device for Recording {
    type Instr = Instr;

    fn load(
        program: &Program,
        order: &[NodeIndex],
        bufs: &HashMap<Value, Buf>,
        bindings: &Bindings,
        rank: Rank,
    ) -> Result<Loaded<Recording>, SelectError> {
        let (host, steps) = Host::load(program, order, bufs, bindings, rank)?;
        Ok((Recording { host, segments: Mutex::default(), alone: Mutex::default() }, steps))
    }

    fn run(&self, instr: &Instr, cx: &Ctx) -> Result<(), String> {
        *self.alone.lock().unwrap() += 1;
        self.host.run(instr, cx)
    }

    fn capture(&self, instr: &Instr) -> Capture {
        match instr {
            Instr::Kernel { .. } | Instr::MatMul { .. } => Capture::Recordable { draws_masks: true },
            _ => Capture::Breaks("a host routine".into()),
        }
    }

    fn run_segment(&self, key: usize, instrs: &[&Instr], cx: &Ctx) -> Result<(), (usize, String)> {
        self.segments.lock().unwrap().push((key, instrs.len(), cx.offset));
        instrs.iter().enumerate().try_for_each(|(i, instr)| self.host.run(instr, cx).map_err(|e| (i, e)))
    }

    fn read(&self, buf: Buf, shape: Vec<usize>) -> Tensor {
        self.host.read(buf, shape)
    }

    fn write(&self, buf: Buf, t: &Tensor) {
        self.host.write(buf, t)
    }

    fn copy(&self, from: Buf, to: Buf) {
        self.host.copy(from, to)
    }

    fn fill(&self, buf: Buf, value: f64) {
        self.host.fill(buf, value)
    }
}

/// Tiny-bert with dropout, accumulating `micro_batches`.
fn program(micro_batches: u64) -> Program {
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions { shape_hint: bindings.clone(), ..PassOptions::default() };
    let train = TrainingSpec { dropout: Some(0.1), micro_batches, ..TrainingSpec::default() };
    let graph = compile(&model("tiny-bert"), &Target::Training(&train), options).unwrap().graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

fn feeds(step: i64, k: i64) -> Vec<Feeds> {
    (0..k).map(|i| batch(&model("tiny-bert"), step * k + i)).collect()
}

#[test]
fn segments_are_handed_over_once_a_pass_and_give_the_host_runtimes_bits() {
    let program = program(2);
    let mut graphs = Runner::<Recording>::load(program.clone(), 7).unwrap();
    let mut host = HostProgram::load(program, 7).unwrap();
    let plan = graphs.capture_plan().expect("graphs are on by default").clone();
    assert!(!plan.micro_batch.segments.is_empty() && !plan.last.segments.is_empty());
    for step in 0..3 {
        let f = feeds(step, 2);
        let (got, want) = (graphs.step(&f).unwrap(), host.step(&f).unwrap());
        assert_eq!(got.outputs.micro_batches, want.outputs.micro_batches, "step {step}");
        assert_eq!(got.outputs.optimizer, want.outputs.optimizer, "step {step}");
    }
    assert_eq!(graphs.state(), host.state());
    let d = graphs.device();
    let segments = d.segments.lock().unwrap();
    // Per step: the first micro-batch's segments, then the last one's.
    let per_step = plan.micro_batch.segments.len() + plan.last.segments.len();
    assert_eq!(segments.len(), 3 * per_step);
    let (recorded, eager) = plan.launches(2);
    let handed: usize = segments.iter().map(|(_, n, _)| n).sum();
    assert_eq!(handed as u64, 3 * recorded);
    assert_eq!(*d.alone.lock().unwrap() as u64, 3 * eager, "a segment's steps ran on their own too");
    // Step s, micro-batch i draws at word 2s + i on one rank; the
    // optimizer's segments at the step's first, 2s.
    let mb = plan.micro_batch.segments.len();
    for (s, handed) in segments.chunks(per_step).enumerate() {
        let word = 2 * s as u64;
        assert!(handed[..mb].iter().all(|(_, _, offset)| *offset == word), "step {s}: {handed:?}");
        for ((_, _, offset), seg) in handed[mb..].iter().zip(&plan.last.segments) {
            let want = if seg.masks == Masks::Optimizer { word } else { word + 1 };
            assert_eq!(*offset, want, "step {s}: {seg:?}");
        }
    }
    assert!(plan.last.segments.iter().any(|s| s.masks == Masks::Optimizer), "the optimizer's segments");
}

#[test]
fn a_capture_splits_the_segment_after_its_value_and_profiling_hands_none_over() {
    let program = program(1);
    let mut graphs = Runner::<Recording>::load(program.clone(), 7).unwrap();
    let before = graphs.capture_plan().unwrap().last.segments.clone();
    // The value written at the middle of the largest segment.
    let largest = before.iter().max_by_key(|s| s.launches).unwrap().steps.clone();
    let g = &program.graph;
    let order = g.topo_order();
    let middle = order[(largest.start + largest.end) / 2];
    let value = Value { node: middle, output: 0 };
    graphs.capture(vec![value]).unwrap();
    let after = graphs.capture_plan().unwrap().last.segments.clone();
    assert_eq!(after.len(), before.len() + 1, "one more segment");
    let f = feeds(0, 1);
    let got = graphs.step(&f).unwrap();
    let mut host = HostProgram::load(program.clone(), 7).unwrap();
    host.capture(vec![value]).unwrap();
    assert_eq!(got.captured, host.step(&f).unwrap().captured);
    graphs.set_profiling(true);
    assert!(graphs.capture_plan().is_none());
    graphs.set_profiling(false);
    graphs.set_graphs(GraphMode::Off);
    assert!(graphs.capture_plan().is_none());
}
