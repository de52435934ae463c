//! CUDA graphs against eager launches, on the GPU: the same program, seed
//! and batches run with `--cuda-graphs off` and `on` give the same bits —
//! every output of every micro-batch and every state after six steps, with
//! dropout on (the graphs read each pass's counter word from device
//! memory) — and each prints its time per step.

use std::time::Instant;

use zeroplan_backend_cuda::device::GraphCounts;
use zeroplan_ir::interp::State;
use zeroplan_runtime::runner::GraphMode;

use super::*;

const STEPS: i64 = 6;

/// What a run gave: per step, every micro-batch's float outputs; the state
/// after; the mean seconds of the steps after the first (which records).
struct Run {
    outputs: Vec<Vec<(String, Vec<f64>)>>,
    state: State,
    seconds: f64,
    counts: GraphCounts,
}

fn run(program: &Program, model: &ModelSpec, mode: GraphMode) -> Run {
    let mut gpu = CudaProgram::load(program.clone(), 7).unwrap_or_else(|e| panic!("{e}"));
    gpu.set_graphs(mode);
    let k = gpu.micro_batches() as i64;
    let mut outputs = Vec::new();
    let mut later = 0.0;
    for s in 0..STEPS {
        let feeds: Vec<Feeds> = (0..k).map(|i| batch(model, s * k + i)).collect();
        let start = Instant::now();
        let ran = gpu.step(&feeds).unwrap_or_else(|e| panic!("{mode:?}, step {s}: {e}"));
        if s > 0 {
            later += start.elapsed().as_secs_f64();
        }
        let floats = |t: &Tensor| t.floats().map(<[f64]>::to_vec);
        outputs.push(
            ran.outputs
                .micro_batches
                .iter()
                .flat_map(|m| m.iter().filter_map(|(n, t)| floats(t).map(|f| (n.clone(), f))))
                .collect(),
        );
    }
    let counts = gpu.device().graph_counts();
    Run { outputs, state: gpu.state(), seconds: later / (STEPS - 1) as f64, counts }
}

/// `program` with graphs and without: bit for bit, graphs recorded and
/// replayed, none refused.
fn replays_bit_for_bit(what: &str, model: &ModelSpec, program: &Program) {
    let eager = run(program, model, GraphMode::Off);
    let graphs = run(program, model, GraphMode::On);
    eprintln!(
        "{what}: eager {:.3} ms a step, graphs {:.3} ms ({:?})",
        eager.seconds * 1e3,
        graphs.seconds * 1e3,
        graphs.counts
    );
    assert_eq!(eager.counts, GraphCounts::default(), "{what}: graphs ran with --cuda-graphs off");
    assert!(graphs.counts.recorded > 0, "{what}: nothing recorded: {:?}", graphs.counts);
    assert!(graphs.counts.replayed >= graphs.counts.recorded, "{what}: {:?}", graphs.counts);
    assert_eq!(graphs.counts.refused, 0, "{what}: a recording failed (see the warning): {:?}", graphs.counts);
    for (s, (e, g)) in eager.outputs.iter().zip(&graphs.outputs).enumerate() {
        for ((name, a), (_, b)) in e.iter().zip(g) {
            assert!(a == b, "{what}, step {s}, output {name}: max difference {:e}", max_abs_diff(a, b));
        }
    }
    for (name, t) in eager.state.iter().filter(|(_, t)| t.dtype().is_float()) {
        let (a, b) = (t.floats().unwrap(), graphs.state[name].floats().unwrap());
        assert!(a == b, "{what}: after {STEPS} steps, {name}: max difference {:e}", max_abs_diff(a, b));
    }
}

fn train(precision: Precision, micro_batches: u64) -> TrainingSpec {
    TrainingSpec { precision, dropout: Some(0.1), micro_batches, ..TrainingSpec::default() }
}

/// Tiny-bert, f32 and bf16, one micro-batch: the feeds and the staged
/// attention split the step, the rest replays.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn cuda_graphs_replay_tiny_bert_bit_for_bit() {
    let model = model("tiny-bert");
    for precision in [Precision::F32, Precision::Bf16] {
        let what = format!("tiny-bert {precision:?}");
        replays_bit_for_bit(&what, &model, &program(&model, &train(precision, 1)));
    }
}

/// Two micro-batches (a graph replayed per micro-batch at its own counter
/// word, the last one's with the optimizer), and fused attention on the
/// device (head dim 64: recorded too, drawing its masks from the words).
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn cuda_graphs_replay_micro_batches_and_fused_attention_bit_for_bit() {
    let mut wide = model("tiny-bert");
    wide.heads = 2;
    wide.hidden = 2 * 64;
    wide.intermediate = 4 * wide.hidden;
    replays_bit_for_bit("tiny-bert head dim 64, 2 micro-batches", &wide, &program(&wide, &train(Precision::Bf16, 2)));
}

/// ZeRO-Offload: the copies to and from the pinned arena recorded on the
/// copy stream, the CPU's AdamW between graphs.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn cuda_graphs_replay_offloaded_copies_bit_for_bit() {
    let model = model("tiny-bert");
    let dp = DataParallel { ranks: 1, zero_stage: 1, offload: Offload::Optimizer };
    let program = program_with(&model, &train(Precision::Bf16, 1), Some(dp));
    replays_bit_for_bit("tiny-bert ZeRO-Offload", &model, &program);
}
