//! Snapshots of the generated CUDA C of each kind of kernel the fuse pass
//! makes, from the tiny models' training graphs (batch 2, seq 8, H100), in
//! f32 and bf16. They run everywhere; `tests/nvrtc.rs` compiles them.
//!
//! The helpers every kernel includes (`src/codegen/prelude.rs`) are shown
//! once, in `full_source_of_a_bf16_dropout_residual_layer_norm`; the other
//! snapshots replace them with one comment line.

mod common;

use common::{dims, fused_kernels, tiny_model};
use zeroplan_backend_cuda::{DeviceProperties, GeneratedKernel, generate};
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::spec::Precision;

/// The first kernel of `pattern` in `model`'s fused training graph.
fn kernel(model: &str, precision: Precision, pattern: &str, also: impl Fn(&Kernel) -> bool) -> Kernel {
    fused_kernels(&tiny_model(model), precision)
        .into_iter()
        .find(|k| k.pattern.as_deref() == Some(pattern) && also(k))
        .unwrap_or_else(|| panic!("{model} has a {pattern} kernel"))
}

fn generated(kernel: &Kernel) -> GeneratedKernel {
    generate(kernel, &dims(kernel, 2, 8), &DeviceProperties::H100_SXM).unwrap()
}

/// The source with the prelude (everything between the includes and the
/// first line of the kernel's own code) replaced by one line.
fn without_prelude(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let head = lines.iter().position(|l| !(l.starts_with("//") || l.starts_with("#include"))).unwrap_or(0);
    let body = lines.iter().position(|l| l.starts_with("// ALiBi") || l.starts_with("extern \"C\"")).expect("a kernel");
    let mut out: Vec<&str> = lines[..head].to_vec();
    out.push("// … the helpers of src/codegen/prelude.rs …");
    out.push("");
    out.extend(&lines[body..]);
    out.join("\n") + "\n"
}

fn launch(g: &GeneratedKernel) -> String {
    let l = &g.launch;
    format!(
        "// launch: grid {} × block {}, {} rows per block, {} B shared, {} B scratch, finish {:?}\n",
        l.grid, l.block, l.rows_per_block, l.shared_bytes, l.scratch_bytes, l.finish
    )
}

/// Snapshots `name_f32` and `name_bf16` of the first `pattern` kernel of `model`.
fn snapshot(name: &str, model: &str, pattern: &str, also: impl Fn(&Kernel) -> bool + Copy) {
    for (label, precision) in [("f32", Precision::F32), ("bf16", Precision::Bf16)] {
        let g = generated(&kernel(model, precision, pattern, also));
        insta::assert_snapshot!(format!("{name}_{label}"), launch(&g) + &without_prelude(&g.source));
    }
}

fn any(_: &Kernel) -> bool {
    true
}

#[test]
fn bias_gelu() {
    snapshot("bias_gelu", "tiny-bert", "bias_act", any);
}

#[test]
fn dropout_residual_layer_norm() {
    snapshot("dropout_residual_layer_norm", "tiny-bert", "bias_dropout_residual_layer_norm", any);
}

#[test]
fn scale_mask_softmax_dropout() {
    snapshot("scale_mask_softmax_dropout", "tiny-bert", "attention_softmax", any);
}

#[test]
fn alibi_softmax() {
    snapshot("alibi_softmax", "tiny-mosaicbert", "attention_softmax", |k| k.to_text().contains("alibi"));
}

#[test]
fn softmax_backward() {
    snapshot("softmax_backward", "tiny-bert", "attention_softmax_grad", any);
}

#[test]
fn layer_norm_backward_with_cross_row_dgamma_dbeta() {
    snapshot("layer_norm_backward", "tiny-bert", "layer_norm_grad", any);
}

#[test]
fn gelu_backward_with_bias_gradient() {
    snapshot("gelu_backward_bias_grad", "tiny-bert", "act_grad_bias_grad", any);
}

#[test]
fn glu_gating() {
    snapshot("glu", "tiny-mosaicbert", "glu", any);
}

#[test]
fn embedding_layer_norm() {
    snapshot("embedding_layer_norm", "tiny-bert", "embedding_layer_norm", any);
}

#[test]
fn adamw() {
    snapshot("adamw", "tiny-bert", "adamw", |k| k.shape.rank() == 2);
}

#[test]
fn squared_sum() {
    snapshot("squared_sum", "tiny-bert", "squared_sum", |k| k.shape.rank() == 2);
}

#[test]
fn full_source_of_a_bf16_dropout_residual_layer_norm() {
    let g = generated(&kernel("tiny-bert", Precision::Bf16, "bias_dropout_residual_layer_norm", any));
    insta::assert_snapshot!(launch(&g) + &g.source);
}

/// A fused attention source from its specialisation's constants on (the
/// template itself; the prelude's helpers above it are left out), with its
/// launch over `[2, 12, 128, 64]`: the CUDA-core kernels, or the tensor-core ones.
fn attention_snapshot(pass: zeroplan_backend_cuda::attention::Pass, tensor_cores: bool) -> String {
    use zeroplan_backend_cuda::attention::AttentionKernel;
    use zeroplan_ir::DType;
    let kernel = AttentionKernel {
        head_dim: 64,
        dtype: DType::BF16,
        mask: DType::I64,
        alibi: true,
        dropout: true,
        tensor_cores,
    };
    let rendered = kernel.render(pass).unwrap();
    let launch = kernel
        .launch(
            pass,
            zeroplan_backend_cuda::attention::AttentionShape { batch: 2, heads: 12, seq: 128 },
            &DeviceProperties::H100_SXM,
        )
        .unwrap();
    let mut s: String = launch.kernels.iter().map(|l| format!("// launch: {l:?}\n")).collect();
    let first = rendered.source.lines().next().unwrap();
    let from = rendered.source.find("// ── This specialisation ──").expect("the constants");
    s.push_str(first);
    s.push_str("\n// … the helpers of src/codegen/prelude.rs …\n\n");
    s.push_str(&rendered.source[from..]);
    s
}

#[test]
fn fused_attention_forward() {
    insta::assert_snapshot!(attention_snapshot(zeroplan_backend_cuda::attention::Pass::Forward, false));
}

#[test]
fn fused_attention_backward() {
    insta::assert_snapshot!(attention_snapshot(zeroplan_backend_cuda::attention::Pass::Backward, false));
}

#[test]
fn tensor_core_attention_forward() {
    insta::assert_snapshot!(attention_snapshot(zeroplan_backend_cuda::attention::Pass::Forward, true));
}

#[test]
fn tensor_core_attention_backward() {
    insta::assert_snapshot!(attention_snapshot(zeroplan_backend_cuda::attention::Pass::Backward, true));
}

#[test]
fn multi_tensor_adamw() {
    use zeroplan_backend_cuda::adamw::AdamWKernel;
    use zeroplan_ir::DType;
    let r = AdamWKernel { grad: DType::BF16, working: Some(DType::BF16) }.render().unwrap();
    let first = r.source.lines().next().unwrap();
    let from = r.source.find("// ── This specialisation ──").expect("the constants");
    insta::assert_snapshot!(format!("{first}\n// … the helpers of src/codegen/prelude.rs …\n\n{}", &r.source[from..]));
}

/// A routine source from its specialisation on (the CUDA prelude's helpers
/// left out): its typedefs, the shared helpers of `common.cu`, its template.
fn routine_snapshot(routine: zeroplan_backend_cuda::routines::Routine) -> String {
    let source = routine.render().unwrap().source;
    let from = source.find("// ── This specialisation ──").expect("a specialisation");
    format!("// {}\n{}", routine.symbol(), &source[from..])
}

#[test]
fn cross_entropy_grad_routine() {
    use zeroplan_ir::DType;
    let routine = zeroplan_backend_cuda::routines::Routine::CrossEntropyGrad {
        logits: DType::BF16,
        labels: DType::I64,
        dloss: DType::F32,
        out: DType::BF16,
    };
    insta::assert_snapshot!(routine_snapshot(routine));
}

#[test]
fn layout_routine() {
    insta::assert_snapshot!(routine_snapshot(zeroplan_backend_cuda::routines::Routine::Layout { unit: 16 }));
}

#[test]
fn broadcast_routine() {
    use zeroplan_ir::DType;
    let routine =
        zeroplan_backend_cuda::routines::Routine::Broadcast { a: DType::F32, b: DType::BF16, out: DType::BF16 };
    insta::assert_snapshot!(routine_snapshot(routine));
}
