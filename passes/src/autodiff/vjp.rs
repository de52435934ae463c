//! The vector–Jacobian product of each op: given the gradients of a node's
//! outputs, the gradients of its operands.

use zeroplan_ir::{Dim, Graph, NodeIndex, Op, Shape, TensorType, Value};

use super::AutodiffError;

/// Gradients for the operands of node `n` (`None` where not `wanted` or
/// zero), given its output gradients `dys` (`None` = zero).
pub(super) fn vjp(
    g: &mut Graph,
    n: NodeIndex,
    dys: &[Option<Value>],
    wanted: &[bool],
) -> Result<Vec<Option<Value>>, AutodiffError> {
    let node = g.node(n).clone();
    let operands = g.operands(n).to_vec();
    let name = node.name.clone();
    let back = |i: usize| format!("{name}.back{i}");
    let not_differentiable = |why: &str| AutodiffError::NotDifferentiable {
        node: name.to_string(),
        op: node.op.name(),
        why: why.to_string(),
    };
    let this = Value { node: n, output: 0 };
    let want = |i: usize| wanted.get(i).copied().unwrap_or(false);
    // Every op but split and flash attention has one output; its gradient
    // is present here (flash attention's `out` gradient is: see below).
    let dy = || dys[0].expect("the single output's gradient");
    let mut grads: Vec<Option<Value>> = vec![None; operands.len()];
    match &node.op {
        Op::Input | Op::Param { .. } | Op::Arange | Op::State { .. } | Op::Fill { .. } => {}
        Op::Embedding => {
            if want(0) {
                let rows = constant(g.value_type(operands[0]).shape.dims()[0].clone(), || {
                    not_differentiable("the table's row count is symbolic")
                })?;
                grads[0] = Some(g.add(back(0), Op::EmbeddingGrad { rows }, &[dy(), operands[1]])?);
            }
        }
        Op::MatMul { transpose_a, transpose_b } => {
            let (a, b, (ta, tb)) = (operands[0], operands[1], (*transpose_a, *transpose_b));
            if want(0) {
                let raw = if !ta {
                    g.add(back(0), Op::MatMul { transpose_a: false, transpose_b: !tb }, &[dy(), b])?
                } else {
                    g.add(back(0), Op::MatMul { transpose_a: tb, transpose_b: true }, &[b, dy()])?
                };
                grads[0] = Some(sum_to(g, raw, a, &format!("{}.sum", back(0)))?);
            }
            if want(1) {
                grads[1] = Some(matmul_rhs_grad(g, &back(1), a, b, dy(), ta, tb)?);
            }
        }
        Op::Add | Op::Sub => {
            for i in 0..2 {
                if want(i) {
                    let mut grad = dy();
                    if i == 1 && node.op == Op::Sub {
                        grad = g.add(format!("{}.neg", back(1)), Op::Scale { factor: -1.0 }, &[grad])?;
                    }
                    grads[i] = Some(sum_to(g, grad, operands[i], &back(i))?);
                }
            }
        }
        Op::Mul => {
            for i in 0..2 {
                if want(i) {
                    let product = g.add(format!("{}.mul", back(i)), Op::Mul, &[dy(), operands[1 - i]])?;
                    grads[i] = Some(sum_to(g, product, operands[i], &back(i))?);
                }
            }
        }
        Op::Scale { factor } => grads[0] = Some(g.add(back(0), Op::Scale { factor: *factor }, &[dy()])?),
        Op::Gelu { approximation } => {
            grads[0] = Some(g.add(back(0), Op::GeluGrad { approximation: *approximation }, &[operands[0], dy()])?)
        }
        Op::Silu => grads[0] = Some(g.add(back(0), Op::SiluGrad, &[operands[0], dy()])?),
        Op::Relu => grads[0] = Some(g.add(back(0), Op::ReluGrad, &[operands[0], dy()])?),
        Op::Tanh => grads[0] = Some(g.add(back(0), Op::TanhGrad, &[this, dy()])?),
        Op::Cast { .. } => {
            let source = g.value_type(operands[0]).dtype;
            // A 16-bit working copy of a master weight passes its gradient
            // on in 16 bits (see the module docs); other casts cast back.
            let of_param = matches!(g.node(operands[0].node).op, Op::Param { .. });
            grads[0] = Some(if of_param { dy() } else { g.add(back(0), Op::Cast { to: source }, &[dy()])? });
        }
        Op::LayerNorm { eps } => {
            let all = g.add_multi(back(0), Op::LayerNormGrad { eps: *eps }, &[operands[0], operands[1], dy()])?;
            for i in 0..3 {
                if want(i) {
                    grads[i] = Some(all[i]);
                }
            }
        }
        Op::Softmax => grads[0] = Some(g.add(back(0), Op::SoftmaxGrad, &[this, dy()])?),
        // The same stream and offset draw the same mask: dropout's adjoint is itself.
        Op::Dropout { p, stream } => {
            grads[0] = Some(g.add(back(0), Op::Dropout { p: *p, stream: *stream }, &[dy()])?)
        }
        Op::AttentionMask => grads[0] = Some(g.add(back(0), Op::AttentionMaskGrad, &[dy(), operands[1]])?),
        // The bias is a constant of the positions: the gradient passes unchanged.
        Op::AlibiBias { .. } => grads[0] = Some(dy()),
        // One op for the three gradients, recomputing the probabilities
        // from `lse`; the integer mask gets none.
        Op::FlashAttention { scale, alibi_ranks, dropout, stream } => {
            if dys.get(1).is_some_and(Option::is_some) {
                return Err(not_differentiable(
                    "something differentiates through its log-sum-exp output, which only its own backward may read",
                ));
            }
            let op =
                Op::FlashAttentionGrad { scale: *scale, alibi_ranks: *alibi_ranks, dropout: *dropout, stream: *stream };
            let (out, lse) = (this, Value { node: n, output: 1 });
            let operands = [operands[0], operands[1], operands[2], operands[3], out, lse, dy()];
            let all = g.add_multi(back(0), op, &operands)?;
            for (i, grad) in all.into_iter().enumerate() {
                if want(i) {
                    grads[i] = Some(grad);
                }
            }
        }
        // Megatron's conjugate pair: `f`'s adjoint is `g` and `g`'s is `f`.
        Op::TensorCopy { ranks } => grads[0] = Some(g.add(back(0), Op::TensorAllReduce { ranks: *ranks }, &[dy()])?),
        Op::TensorAllReduce { .. } => grads[0] = Some(dy()),
        // Sequence parallelism's pairs (Korthikanti et al., 2022): the gather
        // into a tensor-parallel region and the reduce-scatter out of one are
        // each other's adjoints; the gather into replicated consumers and the
        // slice of a replicated tensor are too.
        Op::SequenceAllGather { ranks, partial_grad: true } => {
            grads[0] = Some(g.add(back(0), Op::SequenceReduceScatter { ranks: *ranks }, &[dy()])?)
        }
        Op::SequenceAllGather { ranks, partial_grad: false } => {
            grads[0] = Some(g.add(back(0), Op::SequenceSlice { ranks: *ranks, axis: 1 }, &[dy()])?)
        }
        Op::SequenceReduceScatter { ranks } => {
            let gather = Op::SequenceAllGather { ranks: *ranks, partial_grad: true };
            grads[0] = Some(g.add(back(0), gather, &[dy()])?)
        }
        Op::SequenceSlice { ranks, axis } => {
            // Ids (the usual operand) have no gradient.
            if want(0) && g.value_type(operands[0]).dtype.is_float() {
                if *axis != 1 {
                    return Err(not_differentiable("only a slice of axis 1 (the sequence) has a gathered adjoint"));
                }
                let gather = Op::SequenceAllGather { ranks: *ranks, partial_grad: false };
                grads[0] = Some(g.add(back(0), gather, &[dy()])?);
            }
        }
        // Integer ids: nothing to differentiate.
        Op::VocabShard { .. } => {}
        // The statistics' gradient reaches the logits through the combine's
        // third operand (below), in one op: they get none of their own.
        Op::CrossEntropyStats { .. } => {}
        Op::CrossEntropyCombine { ignore_index } => {
            if want(2) {
                let Some(Op::CrossEntropyStats { ranks, vocab }) = statistics_of(g, operands[0]) else {
                    return Err(not_differentiable("its first operand is not the gathered cross_entropy_stats"));
                };
                let op = Op::CrossEntropyShardGrad { ignore_index: *ignore_index, ranks, vocab };
                grads[2] = Some(g.add(back(2), op, &[operands[2], operands[1], operands[0], dy()])?);
            }
        }
        Op::Reshape { .. } => {
            let shape = g.value_type(operands[0]).shape.clone();
            grads[0] = Some(g.add(back(0), Op::Reshape { shape }, &[dy()])?);
        }
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            grads[0] = Some(g.add(back(0), Op::Transpose { perm: inverse }, &[dy()])?);
        }
        Op::Split { axis, .. } => {
            let mut pieces = Vec::with_capacity(dys.len());
            for (i, d) in dys.iter().enumerate() {
                pieces.push(match d {
                    Some(d) => *d,
                    None => {
                        let ty: TensorType = node.outputs[i].clone();
                        g.source(format!("{}.zero{i}", back(0)), Op::Fill { value: 0.0 }, ty)?
                    }
                });
            }
            grads[0] = Some(g.add(back(0), Op::Concat { axis: *axis }, &pieces)?);
        }
        Op::Slice { axis, start, .. } => {
            let axis_len = g.value_type(operands[0]).shape.dims()[*axis].clone();
            grads[0] = Some(g.add(back(0), Op::SliceGrad { axis: *axis, start: *start, axis_len }, &[dy()])?);
        }
        Op::Concat { axis } => {
            let mut start = 0;
            for (i, v) in operands.iter().enumerate() {
                let len = constant(g.value_type(*v).shape.dims()[*axis].clone(), || {
                    not_differentiable("a concatenated size is symbolic")
                })?;
                if want(i) {
                    grads[i] = Some(g.add(back(i), Op::Slice { axis: *axis, start, len }, &[dy()])?);
                }
                start += len;
            }
        }
        Op::CrossEntropy { ignore_index } => {
            let op = Op::CrossEntropyGrad { ignore_index: *ignore_index };
            grads[0] = Some(g.add(back(0), op, &[operands[0], operands[1], dy()])?);
        }
        Op::Mse => {
            if want(1) {
                return Err(not_differentiable("the regression target depends on a parameter"));
            }
            grads[0] = Some(g.add(back(0), Op::MseGrad, &[operands[0], operands[1], dy()])?);
        }
        Op::SumTo { .. }
        | Op::GeluGrad { .. }
        | Op::SiluGrad
        | Op::ReluGrad
        | Op::TanhGrad
        | Op::LayerNormGrad { .. }
        | Op::SoftmaxGrad
        | Op::AttentionMaskGrad
        | Op::FlashAttentionGrad { .. }
        | Op::SliceGrad { .. }
        | Op::EmbeddingGrad { .. }
        | Op::CrossEntropyGrad { .. }
        | Op::CrossEntropyShardGrad { .. }
        | Op::MseGrad
        | Op::SquaredSum
        | Op::LrSchedule { .. }
        | Op::GradScale { .. }
        | Op::AdamW { .. }
        | Op::LossScaleUpdate { .. } => {
            return Err(not_differentiable("backward and optimizer ops have no gradient here"));
        }
        Op::Fused { .. } => {
            return Err(not_differentiable("fused kernels have no gradient: fusion runs after autodiff"));
        }
        Op::Flatten { .. } | Op::AllReduce { .. } | Op::ReduceScatter { .. } | Op::AllGather { .. } | Op::Copy => {
            return Err(not_differentiable("data-parallel ops have no gradient: partitioning runs after autodiff"));
        }
    }
    Ok(grads)
}

/// The `cross_entropy_stats` op behind a combine's statistics (through the
/// tensor all-reduce that gathers them).
fn statistics_of(g: &Graph, mut v: Value) -> Option<Op> {
    loop {
        match &g.node(v.node).op {
            Op::TensorAllReduce { .. } => v = g.operands(v.node)[0],
            op @ Op::CrossEntropyStats { .. } => return Some(op.clone()),
            _ => return None,
        }
    }
}

fn constant(d: Dim, err: impl FnOnce() -> AutodiffError) -> Result<u64, AutodiffError> {
    d.as_constant().ok_or_else(err)
}

/// `grad` summed down to the shape of `operand` (undoing broadcasting), or
/// `grad` itself when the shapes agree.
fn sum_to(g: &mut Graph, grad: Value, operand: Value, name: &str) -> Result<Value, AutodiffError> {
    let shape = g.value_type(operand).shape.clone();
    if g.value_type(grad).shape == shape {
        return Ok(grad);
    }
    Ok(g.add(name, Op::SumTo { shape }, &[grad])?)
}

/// The gradient of matmul's right operand. For a weight matrix applied to
/// activations `[..., M, K]`, the leading axes are folded into the rows
/// first, so the weight gradient is one GEMM with a `batch·seq` reduction
/// axis rather than a batched product summed afterwards.
fn matmul_rhs_grad(
    g: &mut Graph,
    name: &str,
    a: Value,
    b: Value,
    dc: Value,
    ta: bool,
    tb: bool,
) -> Result<Value, AutodiffError> {
    let a_shape = g.value_type(a).shape.clone();
    let (a, dc) = if g.value_type(b).shape.rank() == 2 && a_shape.rank() > 2 && !ta {
        let rows = a_shape.dims()[..a_shape.rank() - 1].iter().fold(Dim::constant(1), |acc, d| acc.product(d));
        let k = a_shape.last().expect("rank > 2").clone();
        let n = g.value_type(dc).shape.last().expect("rank > 2").clone();
        let a2 = g.add(format!("{name}.lhs"), Op::Reshape { shape: Shape(vec![rows.clone(), k]) }, &[a])?;
        let dc2 = g.add(format!("{name}.dout"), Op::Reshape { shape: Shape(vec![rows, n]) }, &[dc])?;
        (a2, dc2)
    } else {
        (a, dc)
    };
    let raw = if !tb {
        g.add(name, Op::MatMul { transpose_a: !ta, transpose_b: false }, &[a, dc])?
    } else {
        g.add(name, Op::MatMul { transpose_a: true, transpose_b: ta }, &[dc, a])?
    };
    sum_to(g, raw, b, &format!("{name}.sum"))
}
