//! The host runtime at all-MiniLM-L6-v2's size (models/minilm-l6.ron):
//! the encoder's forward at batch 32 × seq 128, and one MLM training step
//! (forward, backward, AdamW) at the same shape, f32, every pass on.
//! Prints one JSON line per measurement (median of the timed runs after a
//! warm-up), which `bench/cpu/run.sh` puts beside JAX's figures.
//!
//! `cargo bench -p zeroplan-runtime --bench host [-- RUNS] [--disable PASS]`
//! (`--disable attention` times the unfused attention chain, for a
//! before/after of the `attention` pass in one build).

use std::path::Path;
use std::time::Instant;

use zeroplan_ir::interp::Feeds;
use zeroplan_ir::plan::Program;
use zeroplan_ir::spec::{self, Head, TrainingSpec};
use zeroplan_ir::{Bindings, DType, Graph, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::HostProgram;

const BATCH: usize = 32;
const SEQ: usize = 128;
/// Instruction kinds shown in the profile.
const PROFILE_ROWS: usize = 25;

fn program(graph: Graph, bindings: &Bindings) -> Program {
    let memory = zeroplan_passes::memory::plan(&graph, bindings).expect("planned");
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

fn feeds(vocab: u64) -> Feeds {
    let ints = |v: Vec<i64>, shape: Vec<usize>| Tensor::int(shape, DType::I64, v).expect("sizes agree");
    let ids: Vec<i64> = (0..(BATCH * SEQ) as i64).map(|i| (i * 7919 + 101) % vocab as i64).collect();
    let labels = ids.iter().enumerate().map(|(i, &t)| if i % 7 == 3 { t } else { -100 }).collect();
    Feeds::from([
        ("input_ids".to_string(), ints(ids, vec![BATCH, SEQ])),
        ("token_type_ids".to_string(), ints(vec![0; BATCH * SEQ], vec![BATCH, SEQ])),
        ("attention_mask".to_string(), ints(vec![1; BATCH * SEQ], vec![BATCH, SEQ])),
        ("labels".to_string(), ints(labels, vec![BATCH, SEQ])),
    ])
}

/// The median of `runs` timings of `f`, after one warm-up run.
fn median(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.iter().filter_map(|a| a.parse().ok()).next().unwrap_or(5);
    let disabled: std::collections::BTreeSet<String> =
        args.windows(2).filter(|w| w[0] == "--disable").map(|w| w[1].clone()).collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/minilm-l6.ron");
    let mut model = spec::load(&path).expect("the bundled spec");
    model.hidden_dropout = 0.0;
    model.attention_dropout = 0.0;
    let bindings: Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = || PassOptions { shape_hint: bindings.clone(), disabled: disabled.clone(), ..PassOptions::default() };
    let threads = rayon::current_num_threads();

    let mut encoder = model.clone();
    encoder.head = Head::Pooler;
    let graph = compile(&encoder, &Target::Forward(DType::F32), options()).expect("compiles").graph;
    let mut forward = HostProgram::load(program(graph, &bindings), 0).expect("loads");
    let input = feeds(model.vocab_size);
    report("forward", &mut forward, &input, runs, threads);

    let train = TrainingSpec::default();
    let graph = compile(&model, &Target::Training(&train), options()).expect("compiles").graph;
    let mut step = HostProgram::load(program(graph, &bindings), 0).expect("loads");
    // A trainer reads back the loss, not the [tokens, vocab] logits.
    step.fetch(&["loss"]).expect("an output");
    report("train_step", &mut step, &input, runs, threads);
}

/// Times `program`'s step (one JSON line on stdout), then profiles one more
/// step and prints where its time went on stderr.
fn report(what: &str, program: &mut HostProgram, input: &Feeds, runs: usize, threads: usize) {
    let seconds = median(runs, || {
        program.step(std::slice::from_ref(input)).expect("runs");
    });
    let tokens = (BATCH * SEQ) as f64;
    println!(
        "{{\"what\":\"{what}\",\"model\":\"minilm-l6\",\"batch\":{BATCH},\"seq\":{SEQ},\"threads\":{threads},\
         \"seconds\":{seconds},\"tokens_per_s\":{}}}",
        tokens / seconds
    );
    program.set_profiling(true);
    let start = Instant::now();
    program.step(std::slice::from_ref(input)).expect("runs");
    let wall = start.elapsed().as_secs_f64();
    let profile = program.profile().expect("profiling is on");
    let total = profile.total_seconds();
    eprintln!("{what}: a step of {:.1} ms, {:.1} ms in instructions, by kind:", wall * 1e3, total * 1e3);
    for (kind, e) in profile.by_kind().iter().take(PROFILE_ROWS) {
        let rate = if e.flops > 0.0 { format!("{:6.1} GFLOP/s", e.flops / e.seconds / 1e9) } else { String::new() };
        eprintln!("  {:7.1} ms {:5.1}% {:4}× {kind} {rate}", e.seconds * 1e3, 100.0 * e.seconds / total, e.calls);
    }
    program.set_profiling(false);
}
