//! From an [`Op`] and its operand tensors to its output tensors: the one
//! place that knows which kernel implements which op.
//!
//! Kernels compute unrounded `f64` results labelled with the output dtype;
//! the driver ([`super::Pass`]) checks the shapes against the node's type and
//! rounds in `Native` mode.

use super::flash_attention::{self as flash, AttentionDropout};
use super::tensor_parallel::on_tensors as tp;
use super::{attention, bind, elementwise as ew, embedding, kernel, layout, loss, matmul, nd, optimizer, random, rows};
use crate::op::Op;
use crate::shape::Bindings;
use crate::tensor::Tensor;

/// What an op may need besides its operands.
pub(super) struct Ctx<'a> {
    pub seed: u64,
    /// The dropout offset of this pass.
    pub offset: u64,
    /// Symbol values, for attributes with symbolic dimensions.
    pub bindings: &'a Bindings,
}

fn usize_of(n: u64) -> Result<usize, String> {
    usize::try_from(n).map_err(|_| format!("{n} does not fit the host's address space"))
}

/// The outputs of `op` on `x`. Sources are the driver's business.
pub(super) fn apply(op: &Op, x: &[&Tensor], ctx: &Ctx) -> Result<Vec<Tensor>, String> {
    if !op.arity().accepts(x.len()) {
        return Err(format!("{} takes {} operands, got {}", op.name(), op.arity(), x.len()));
    }
    let one = |t: Result<Tensor, String>| t.map(|t| vec![t]);
    if let Some(ranks) = op.tensor_ranks().filter(|&r| r != 1) {
        return Err(format!(
            "{} over {ranks} tensor-parallel ranks needs the multi-rank runtime; this interpreter runs a single rank",
            op.name()
        ));
    }
    match op {
        Op::Input | Op::Param { .. } | Op::Arange | Op::State { .. } | Op::Fill { .. } => {
            Err(format!("{} is a source, evaluated by the driver", op.name()))
        }
        Op::Embedding => one(embedding::embedding(x[0], x[1])),
        Op::EmbeddingGrad { rows } => one(embedding::embedding_grad(x[0], x[1], usize_of(*rows)?)),
        Op::MatMul { transpose_a, transpose_b } => one(matmul::matmul(x[0], x[1], *transpose_a, *transpose_b)),
        Op::Add => one(ew::binary(ew::Binary::Add, x[0], x[1])),
        Op::Sub => one(ew::binary(ew::Binary::Sub, x[0], x[1])),
        Op::Mul => one(ew::binary(ew::Binary::Mul, x[0], x[1])),
        Op::Scale { factor } => one(ew::map(x[0], |v| v * factor)),
        Op::Gelu { approximation } => one(ew::map(x[0], ew::gelu(*approximation))),
        Op::Silu => one(ew::map(x[0], ew::silu)),
        Op::Relu => one(ew::map(x[0], ew::relu)),
        Op::Tanh => one(ew::map(x[0], f64::tanh)),
        Op::GeluGrad { approximation } => {
            let derivative = ew::gelu_grad(*approximation);
            one(ew::map2(x[0], x[1], |v, d| d * derivative(v)))
        }
        Op::SiluGrad => one(ew::map2(x[0], x[1], |v, d| d * ew::silu_grad(v))),
        // A select, not a product: dy = ±∞ at x ≤ 0 gives 0 (PyTorch's threshold_backward).
        Op::ReluGrad => one(ew::map2(x[0], x[1], |v, d| if v > 0.0 { d } else { 0.0 })),
        Op::TanhGrad => one(ew::map2(x[0], x[1], |y, d| d * (1.0 - y * y))),
        Op::Cast { to } => one(ew::cast(x[0], *to)),
        Op::SumTo { shape } => one(ew::sum_to(x[0], &bind::concrete_shape(shape, ctx.bindings)?)),
        Op::LayerNorm { eps } => one(rows::layer_norm(x[0], x[1], x[2], *eps)),
        Op::LayerNormGrad { eps } => rows::layer_norm_grad(x[0], x[1], x[2], *eps),
        Op::Softmax => one(rows::softmax(x[0])),
        Op::SoftmaxGrad => one(rows::softmax_grad(x[0], x[1])),
        Op::Dropout { p, stream } => one(random::dropout(x[0], *p, *stream, ctx.seed, ctx.offset)),
        Op::AttentionMask => one(attention::attention_mask(x[0], x[1])),
        Op::AttentionMaskGrad => one(attention::attention_mask_grad(x[0], x[1])),
        Op::AlibiBias { ranks } => one(attention::alibi_bias(x[0], 0, *ranks)),
        Op::FlashAttention { scale, alibi_ranks, dropout, stream } => {
            let dropout = AttentionDropout { p: *dropout, stream: *stream, seed: ctx.seed, offset: ctx.offset };
            flash::flash_attention(x, *scale, *alibi_ranks, dropout)
        }
        Op::FlashAttentionGrad { scale, alibi_ranks, dropout, stream } => {
            let dropout = AttentionDropout { p: *dropout, stream: *stream, seed: ctx.seed, offset: ctx.offset };
            flash::flash_attention_grad(x, *scale, *alibi_ranks, dropout)
        }
        Op::Reshape { shape } => one(layout::reshape(x[0], bind::concrete_shape(shape, ctx.bindings)?)),
        Op::Transpose { perm } => one(layout::transpose(x[0], perm)),
        Op::Split { axis, sizes } => {
            let sizes = sizes.iter().map(|&s| usize_of(s)).collect::<Result<Vec<_>, _>>()?;
            layout::split(x[0], *axis, &sizes)
        }
        Op::Slice { axis, start, len } => one(layout::slice(x[0], *axis, usize_of(*start)?, usize_of(*len)?)),
        Op::SliceGrad { axis, start, axis_len } => {
            let axis_len = bind::concrete_shape(&crate::shape::Shape(vec![axis_len.clone()]), ctx.bindings)?[0];
            one(layout::slice_grad(x[0], *axis, usize_of(*start)?, axis_len))
        }
        Op::Concat { axis } => one(layout::concat(x, *axis)),
        Op::CrossEntropy { ignore_index } => one(loss::cross_entropy(x[0], x[1], *ignore_index)),
        Op::CrossEntropyGrad { ignore_index } => one(loss::cross_entropy_grad(x[0], x[1], x[2], *ignore_index)),
        Op::Mse => one(loss::mse(x[0], x[1])),
        Op::MseGrad => one(loss::mse_grad(x[0], x[1], x[2])),
        Op::SquaredSum => one(optimizer::squared_sum(x[0])),
        Op::LrSchedule { peak, warmup_steps, total_steps } => {
            let s = nd::item(x[0], "the step count")?;
            one(Ok(nd::scalar(optimizer::lr_schedule(s, *peak, *warmup_steps, *total_steps))))
        }
        Op::GradScale { max_norm, micro_batches } => {
            let (sq, scale) = (nd::item(x[0], "the squared norm")?, nd::item(x[1], "the loss scale")?);
            let (multiplier, finite) = optimizer::grad_scale(sq, scale, *max_norm, *micro_batches);
            Ok(vec![nd::scalar(multiplier), nd::scalar(finite)])
        }
        Op::AdamW { beta1, beta2, eps, weight_decay } => optimizer::adamw(
            optimizer::AdamW { beta1: *beta1, beta2: *beta2, eps: *eps, weight_decay: *weight_decay },
            x,
        ),
        Op::LossScaleUpdate { growth_interval, growth, backoff } => {
            let scale = nd::item(x[0], "the scale")?;
            let (good, finite) = (nd::item(x[1], "the good-step count")?, nd::item(x[2], "finite")?);
            let (scale, good) = optimizer::loss_scale_update(scale, good, finite, *growth_interval, *growth, *backoff);
            Ok(vec![nd::scalar(scale), nd::scalar(good)])
        }
        Op::Fused { kernel } => kernel::run(kernel, x, ctx.bindings, ctx.seed, ctx.offset),
        Op::Flatten { len } => one(layout::flatten(x, usize_of(*len)?)),
        // One rank: every collective is the identity.
        Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks } => {
            if *ranks != 1 {
                return Err(format!(
                    "{} over {ranks} ranks needs the multi-rank interpreter; this one runs a single rank",
                    op.name()
                ));
            }
            Ok(vec![x[0].clone()])
        }
        Op::Copy => Ok(vec![x[0].clone()]),
        // One tensor rank (checked above): these are the whole ops' forms.
        Op::TensorCopy { .. }
        | Op::TensorAllReduce { .. }
        | Op::SequenceSlice { .. }
        | Op::SequenceAllGather { .. }
        | Op::SequenceReduceScatter { .. } => Ok(vec![x[0].clone()]),
        Op::VocabShard { ranks, rows } => one(tp::vocab_shard(x[0], 0, *ranks, *rows)),
        Op::CrossEntropyStats { ranks, vocab } => one(tp::stats(x[0], x[1], 0, *ranks, *vocab)),
        Op::CrossEntropyCombine { ignore_index } => one(tp::combine(x[0], x[1], x[2], *ignore_index)),
        Op::CrossEntropyShardGrad { ignore_index, vocab, .. } => {
            one(tp::shard_grad(x[0], x[1], x[2], x[3], *ignore_index, 0, *vocab))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::op::GeluApproximation;

    fn run(op: Op, x: &[&Tensor]) -> Vec<f64> {
        let bindings = Bindings::new();
        let ctx = Ctx { seed: 0, offset: 0, bindings: &bindings };
        apply(&op, x, &ctx).unwrap().remove(0).floats().unwrap().to_vec()
    }

    fn t(v: &[f64]) -> Tensor {
        nd::float(vec![v.len()], DType::F32, v.to_vec())
    }

    #[test]
    fn unary_ops_by_hand() {
        let x = t(&[-1.0, 0.0, 0.5, 2.0]);
        assert_eq!(run(Op::Scale { factor: 0.25 }, &[&x]), vec![-0.25, 0.0, 0.125, 0.5]);
        assert_eq!(run(Op::Relu, &[&x]), vec![0.0, 0.0, 0.5, 2.0]);
        // tanh(0.5) = 0.46211715726000974, tanh(2) = 0.9640275800758169
        let th = run(Op::Tanh, &[&x]);
        assert!((th[2] - 0.462_117_157_260_009_74).abs() < 1e-16 && (th[3] - 0.964_027_580_075_816_9).abs() < 1e-16);
        assert_eq!(run(Op::Gelu { approximation: GeluApproximation::Erf }, &[&x])[1], 0.0);
        assert_eq!(run(Op::Silu, &[&t(&[0.0])]), vec![0.0]);
    }

    #[test]
    fn gradient_ops_multiply_dy_by_the_derivative() {
        let zero = t(&[0.0]);
        let dy = t(&[3.0]);
        // gelu'(0) = silu'(0) = 1/2 for both forms.
        for approximation in [GeluApproximation::Erf, GeluApproximation::Tanh] {
            assert_eq!(run(Op::GeluGrad { approximation }, &[&zero, &dy]), vec![1.5]);
        }
        assert_eq!(run(Op::SiluGrad, &[&zero, &dy]), vec![1.5]);
        // tanh_grad takes y: 3·(1 − 0.5²) = 2.25.
        assert_eq!(run(Op::TanhGrad, &[&t(&[0.5]), &dy]), vec![2.25]);
        // relu_grad selects: an infinite dy at x ≤ 0 gives 0, not NaN.
        let x = t(&[-1.0, 0.0, 2.0]);
        let dy = t(&[f64::INFINITY, 3.0, 4.0]);
        assert_eq!(run(Op::ReluGrad, &[&x, &dy]), vec![0.0, 0.0, 4.0]);
    }

    #[test]
    fn sources_and_wrong_arity_are_errors_not_panics() {
        let bindings = Bindings::new();
        let ctx = Ctx { seed: 0, offset: 0, bindings: &bindings };
        assert!(apply(&Op::Input, &[], &ctx).is_err());
        assert!(apply(&Op::Add, &[&t(&[1.0])], &ctx).is_err());
    }
}
