//! The CUDA device against the host runtime: the same plan's program, the
//! same seed and batches, three optimizer steps with dropout.
//!
//! The GPU tests are ignored (no GPU in CI); on a machine with a CUDA 13
//! driver and NVRTC (`scripts/fetch-nvrtc.sh`, found through
//! `ZEROPLAN_NVRTC_DIR`, or the CUDA toolkit):
//!
//! ```sh
//! ZEROPLAN_NVRTC_DIR=$PWD/fixtures/nvrtc cargo test -p zeroplan-runtime --test cuda -- --ignored --nocapture
//! ```
//!
//! What runs everywhere: loading on a machine without a GPU is a clear
//! error, not a panic.
//!
//! [`graphs`]: CUDA graphs against eager launches, bit for bit.

use std::collections::BTreeSet;

use zeroplan_backend_cuda::device as cuda;
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding as Exactness};
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::{Activation, ModelSpec, Precision, TrainingSpec};
use zeroplan_ir::{Graph, Tensor};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};
use zeroplan_runtime::CudaProgram;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::runner::{Device, Runner};

mod common;
#[path = "cuda/graphs.rs"]
mod graphs;

use common::{BATCH, SEQ, batch, max_abs_diff, model};

fn program(model: &ModelSpec, train: &TrainingSpec) -> Program {
    program_with(model, train, None)
}

/// [`program`] under a data-parallel strategy (one rank: ZeRO-Offload).
fn program_with(model: &ModelSpec, train: &TrainingSpec, dp: Option<DataParallel>) -> Program {
    let bindings: zeroplan_ir::Bindings = [("batch".to_string(), BATCH as u64), ("seq".to_string(), SEQ as u64)].into();
    let options = PassOptions { shape_hint: bindings.clone(), data_parallel: dp, ..PassOptions::default() };
    let graph = compile(model, &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    zeroplan_passes::planner::program::program(graph, &memory, BATCH as u64, SEQ as u64)
}

#[test]
fn loading_without_a_gpu_is_a_clear_error() {
    let Err(why) = cuda::available() else {
        eprintln!("SKIPPED: this machine has a GPU; the ignored tests are the ones to run");
        return;
    };
    let model = model("tiny-bert");
    let err = match CudaProgram::load(program(&model, &TrainingSpec::default()), 7) {
        Ok(_) => panic!("a CUDA program loaded without a GPU"),
        Err(e) => e.to_string(),
    };
    assert_eq!(err, why);
    assert!(why.contains("no CUDA driver found") || why.contains("CUDA driver failed"), "{why}");
}

/// Parameters whose gradient is zero in exact arithmetic (the attention key
/// bias): rounding noise, which AdamW normalises into steps of up to `lr`
/// either way, so two correct devices differ there by up to
/// [`adamw_apart`].
fn zero_gradients(graph: &Graph, feeds: &Feeds) -> BTreeSet<String> {
    let interpreter = Interpreter::new(Exactness::Native, 7);
    let state = interpreter.init_state(graph).unwrap();
    let values = interpreter.evaluate(graph, &state, feeds, 0).unwrap();
    graph
        .node_indices()
        .filter_map(|n| zeroplan_ir::kernel::adamw_operands(graph, n))
        .filter(|ops| {
            let x = values.value(graph, ops[1]).floats().unwrap();
            x.iter().map(|x| x * x).sum::<f64>().sqrt() < 1e-7 * (x.len() as f64).sqrt()
        })
        .map(|ops| graph.node(ops[0].node).name.to_string())
        .collect()
}

fn step<D: Device>(runner: &mut Runner<D>, feeds: &Feeds) -> Vec<(String, Tensor)> {
    let ran = runner.step(std::slice::from_ref(feeds)).unwrap_or_else(|e| panic!("{e}"));
    ran.outputs.micro_batches[0]
        .iter()
        .filter(|(_, t)| t.dtype().is_float())
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect()
}

/// Three steps of tiny-bert at `precision` on the GPU and on the host:
/// every float output per step and every float state after, within `tol`.
fn agree(precision: Precision, tol: f64) {
    agree_on(&model("tiny-bert"), precision, tol);
}

/// [`agree`] for `model`; returns the GPU's instruction kinds (profiled).
fn agree_on(model: &ModelSpec, precision: Precision, tol: f64) -> Vec<String> {
    agree_with(model, precision, None, tol)
}

/// [`agree_on`] under a data-parallel strategy `dp` (one rank).
fn agree_with(model: &ModelSpec, precision: Precision, dp: Option<DataParallel>, tol: f64) -> Vec<String> {
    let model = model.clone();
    let train = TrainingSpec { precision, dropout: Some(0.1), ..TrainingSpec::default() };
    let program = program_with(&model, &train, dp);
    let noise = zero_gradients(&program.graph, &batch(&model, 0));
    let mut gpu = CudaProgram::load(program.clone(), 7).unwrap_or_else(|e| panic!("{e}"));
    gpu.set_profiling(true);
    let mut host = HostProgram::load(program, 7).unwrap_or_else(|e| panic!("{e}"));
    for s in 0..3 {
        let feeds = batch(&model, s);
        for ((name, got), (_, want)) in step(&mut gpu, &feeds).iter().zip(&step(&mut host, &feeds)) {
            let err = common::relative(got.floats().unwrap(), want.floats().unwrap());
            eprintln!("step {s}: {name} relative error {err:e}");
            assert!(err <= tol, "{precision:?}, step {s}, output {name}: relative error {err:e} > {tol:e}");
        }
    }
    let (got, want) = (gpu.state(), host.state());
    for (name, t) in want.iter().filter(|(_, t)| t.dtype().is_float()) {
        let (a, b) = (got[name].floats().unwrap(), t.floats().unwrap());
        if noise.contains(name) {
            let (apart, bound) = (max_abs_diff(a, b), adamw_apart(3, train.lr));
            assert!(apart <= bound, "{precision:?}: {name} (a zero gradient) moved {apart:e} apart, over {bound:e}");
            continue;
        }
        let flips = if precision == Precision::F32 { 0 } else { a.len() / 16 };
        let err = relative_but_for_flips(a, b, flips, adamw_apart(3, train.lr))
            .unwrap_or_else(|why| panic!("{precision:?}: after 3 steps, {name}: {why}"));
        assert!(err <= tol, "{precision:?}: after 3 steps, {name}: relative error {err:e} > {tol:e}");
    }
    gpu.profile().expect("profiling is on").by_kind().into_iter().map(|(kind, _)| kind).collect()
}

/// How far apart `steps` AdamW steps at `lr` can take one element on two
/// correct devices whose gradients there are rounding noise: each step moves
/// it by `lr · |m̂/√v̂|`, which the bias-corrected averages bound by
/// `√(Σ wᵢ²/uᵢ)` (Cauchy–Schwarz over their weights: 1, 1.0014, 1.0036 for
/// steps 1–3 at betas 0.9/0.999), and the two devices may step opposite ways.
fn adamw_apart(steps: u32, lr: f64) -> f64 {
    assert!(steps <= 3, "the bound's factor covers three steps");
    2.0 * f64::from(steps) * lr * 1.004
}

/// The relative error of `a` against `b` over all but the `flips` elements
/// that differ most, each of which must differ by at most `bound`; `flips`
/// is at most one in sixteen, so a scalar (`train.step`) is always compared.
///
/// In 16-bit storage, an element whose gradient is within rounding noise of
/// zero (a zero-initialised LayerNorm β summed over few tokens) can step the
/// other way on one device: AdamW normalises the noise into a step of ±lr,
/// so two correct runs differ there by up to 2·steps·lr. A few such
/// elements are rounding; a wrong gradient moves most of the tensor.
fn relative_but_for_flips(a: &[f64], b: &[f64], flips: usize, bound: f64) -> Result<f64, String> {
    let mut order: Vec<usize> = (0..a.len()).collect();
    order.sort_by(|&i, &j| (a[j] - b[j]).abs().total_cmp(&(a[i] - b[i]).abs()));
    let (flipped, kept) = order.split_at(flips.min(a.len()));
    if let Some(&i) = flipped.iter().find(|&&i| (a[i] - b[i]).abs() > bound) {
        return Err(format!("element {i} differs by {:e}, more than AdamW's {bound:e}", (a[i] - b[i]).abs()));
    }
    let pick = |x: &[f64]| kept.iter().map(|&i| x[i]).collect::<Vec<_>>();
    Ok(common::relative(&pick(a), &pick(b)))
}

/// Tiny-bert widened to head dims the fused-attention template covers (32
/// and 64; the tiny models' 8 is staged on the host): the forward and the
/// backward must run as device kernels, not the staged routine, and train
/// as the host runtime does.
fn fused_attention_agrees(head_dim: u64, precision: Precision, tol: f64) {
    let mut wide = model("tiny-bert");
    wide.heads = 2;
    wide.hidden = 2 * head_dim;
    wide.intermediate = 4 * wide.hidden;
    let kinds = agree_on(&wide, precision, tol);
    for op in ["flash_attention", "flash_attention_grad"] {
        assert!(kinds.iter().any(|k| k.contains("kernel") && k.contains(op)), "{op} did not run on the GPU: {kinds:?}");
        assert!(!kinds.iter().any(|k| k == op), "{op} was staged on the host: {kinds:?}");
    }
}

#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn fused_attention_f32_head_dims_32_and_64_match_the_host_runtime() {
    fused_attention_agrees(32, Precision::F32, 1e-5);
    fused_attention_agrees(64, Precision::F32, 1e-5);
}

#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn fused_attention_bf16_matches_the_host_runtime() {
    fused_attention_agrees(64, Precision::Bf16, 1e-2);
}

#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn tiny_bert_f32_steps_match_the_host_runtime() {
    agree(Precision::F32, 1e-5);
}

#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn tiny_bert_bf16_steps_match_the_host_runtime() {
    agree(Precision::Bf16, 1e-2);
}

/// Tiny-bert with the tanh GELU (the FFN's bias + GELU is one cuBLASLt
/// product, the pre-activation as its aux matrix) and with BERT's erf GELU
/// (every bias in its GEMM, the kernels rewritten without it): three steps
/// against the host runtime, and the profile shows what ran.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver, NVRTC and cuBLASLt"]
fn bias_epilogue_gemms_match_the_host_runtime() {
    let tanh = ModelSpec { activation: Activation::GeluTanh, ..model("tiny-bert") };
    let kinds = agree_on(&tanh, Precision::F32, 1e-5);
    let has = |kinds: &[String], what: &str| kinds.iter().any(|k| k.contains(what));
    assert!(has(&kinds, "cublaslt_bias_gelu_aux(layer*.ffn.act.fused)"), "no whole epilogue ran: {kinds:?}");
    assert!(!has(&kinds, "kernel layer*.ffn.act.fused"), "the GELU kernel still ran: {kinds:?}");
    let kinds = agree_on(&model("tiny-bert"), Precision::F32, 1e-5);
    assert!(has(&kinds, "cublaslt_bias(layer*.ffn.act.fused)"), "no bias epilogue ran: {kinds:?}");
    assert!(has(&kinds, "layer*.ffn.act.fused.bias_in_gemm"), "the rewritten kernel did not run: {kinds:?}");
    let kinds = agree_on(&tanh, Precision::Bf16, 1e-2);
    assert!(has(&kinds, "cublaslt_bias_gelu_aux"), "bf16: {kinds:?}");
}

/// Bias gradients summed in their weight gradients' GEMMs (cuBLASLt
/// `BGRADA`; the LayerNorm and GELU backward kernels run without their
/// sums), f32 and bf16, against the host runtime; then, with finite checks
/// on, every parameter gradient captured (a moved bias gradient is read
/// after the GEMM that writes it) against the host's.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver, NVRTC and cuBLASLt"]
fn bias_gradient_gemms_match_the_host_runtime() {
    let has = |kinds: &[String], what: &str| kinds.iter().any(|k| k.contains(what));
    for (precision, tol) in [(Precision::F32, 1e-5), (Precision::Bf16, 1e-2)] {
        let kinds = agree_on(&model("tiny-bert"), precision, tol);
        for what in ["cublaslt_bias_grad(layer*.ffn.up.mm.back1)", "layer*.ffn.act.back0.fused.bias_grad_in_gemm"] {
            assert!(has(&kinds, what), "{precision:?}: `{what}` did not run: {kinds:?}");
        }
        let program = program(&model("tiny-bert"), &TrainingSpec { precision, ..TrainingSpec::default() });
        let g = &program.graph;
        let grads: Vec<zeroplan_ir::Value> =
            g.node_indices().filter_map(|n| zeroplan_ir::kernel::adamw_operands(g, n)).map(|o| o[1]).collect();
        let mut gpu = CudaProgram::load(program.clone(), 7).unwrap_or_else(|e| panic!("{e}"));
        let mut host = HostProgram::load(program, 7).unwrap_or_else(|e| panic!("{e}"));
        gpu.set_finite_checks(true);
        gpu.capture(grads.clone()).unwrap();
        host.capture(grads).unwrap();
        let feeds = [batch(&model("tiny-bert"), 0)];
        let got = gpu.step(&feeds).unwrap_or_else(|e| panic!("{e}")).captured.remove(0);
        let want = host.step(&feeds).unwrap().captured.remove(0);
        for (name, w) in &want {
            let err = common::relative(got[name].floats().unwrap(), w.floats().unwrap());
            assert!(err <= tol, "{precision:?}: gradient {name}: relative error {err:e} > {tol:e}");
        }
    }
}

/// Every parameter of tiny-bert stepped by one multi-tensor AdamW launch,
/// f32 and bf16 gradients, against the host runtime's per-parameter kernels.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn multi_tensor_adamw_matches_the_host_runtime() {
    for (precision, tol, grad) in [(Precision::F32, 1e-5, "f32"), (Precision::Bf16, 1e-2, "bf16")] {
        let kinds = agree_on(&model("tiny-bert"), precision, tol);
        let launch = format!("kernel multi_tensor_adamw_{grad}[");
        assert!(kinds.iter().any(|k| k.starts_with(&launch)), "{precision:?}: no multi-tensor launch: {kinds:?}");
        assert!(!kinds.iter().any(|k| k.contains("adamw.fused")), "{precision:?}: per-parameter AdamW ran: {kinds:?}");
    }
}

/// ZeRO-Offload on one rank: gradients down to the pinned arena and
/// parameters up on the copy stream, AdamW by the CPU there.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn offloaded_optimizer_copies_match_the_host_runtime() {
    let dp = DataParallel { ranks: 1, zero_stage: 1, offload: Offload::Optimizer };
    let kinds = agree_with(&model("tiny-bert"), Precision::Bf16, Some(dp), 1e-2);
    assert!(kinds.iter().any(|k| k == "copy"), "no copy ran: {kinds:?}");
}

/// The NVMe tier on a GPU (`train --backend cuda --nvme-dir DIR`): the
/// host-placed states in files, copied to and from the device through the
/// pinned staging buffers, train as the same plan in the pinned arena —
/// every output of three steps and every state after, within the CUDA-vs-host
/// tolerances — and no state stays in memory between steps.
#[test]
#[ignore = "needs a GPU with a CUDA 13 driver and NVRTC"]
fn the_nvme_tier_trains_as_the_pinned_arena() {
    use std::sync::Arc;

    use zeroplan_ir::interp::State;
    use zeroplan_runtime::comm::{Communicator, Groups, InProcess};
    use zeroplan_runtime::runner::Nvme;

    let cases = [
        (DataParallel { ranks: 1, zero_stage: 3, offload: Offload::OptimizerAndParams }, Precision::F32, 1e-5),
        (DataParallel { ranks: 1, zero_stage: 3, offload: Offload::OptimizerAndParams }, Precision::Bf16, 1e-2),
        (DataParallel { ranks: 1, zero_stage: 1, offload: Offload::Optimizer }, Precision::Bf16, 1e-2),
    ];
    let model = model("tiny-bert");
    for (dp, precision, tol) in cases {
        let what = format!("{dp:?}, {precision:?}");
        let train = TrainingSpec { precision, dropout: Some(0.1), ..TrainingSpec::default() };
        let program = program_with(&model, &train, Some(dp));
        let dir = std::env::temp_dir().join(format!("zeroplan-cuda-nvme-{}-{}", std::process::id(), dp.zero_stage));
        std::fs::create_dir_all(&dir).unwrap();
        let alone: Arc<dyn Communicator> = Arc::new(InProcess::group(1).pop().unwrap());
        let nvme = Nvme { dir: dir.clone() };
        let mut tiered =
            CudaProgram::load_tiered(program.clone(), 7, Groups::data_parallel(alone), &State::new(), Some(&nvme))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(tiered.tier_bytes().is_some_and(|b| b > 0), "{what}: nothing on the tier");
        let mut pinned = CudaProgram::load(program, 7).unwrap_or_else(|e| panic!("{e}"));
        for s in 0..3 {
            let feeds = batch(&model, s);
            let (got, want) = (step(&mut tiered, &feeds), step(&mut pinned, &feeds));
            assert_eq!(got.len(), want.len(), "{what}: outputs");
            for ((name, got), (_, want)) in got.iter().zip(&want) {
                let err = common::relative(got.floats().unwrap(), want.floats().unwrap());
                eprintln!("{what}, step {s}: {name} relative error {err:e}");
                assert!(err <= tol, "{what}, step {s}, output {name}: relative error {err:e} > {tol:e}");
            }
            tiered.check_tier().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(tiered.tier_resident_bytes(), Some(0), "{what}: states left in memory after a step");
        }
        let (got, want) = (tiered.state(), pinned.state());
        for (name, t) in want.iter().filter(|(_, t)| t.dtype().is_float()) {
            let err = common::relative(got[name].floats().unwrap(), t.floats().unwrap());
            assert!(err <= tol, "{what}: after 3 steps, {name}: relative error {err:e} > {tol:e}");
        }
        eprintln!(
            "{what}: the tier keeps {} B, at most {} B in memory at once",
            tiered.tier_bytes().unwrap(),
            tiered.tier_high_water_bytes().unwrap()
        );
        drop(tiered);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
