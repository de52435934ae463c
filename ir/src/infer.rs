//! Type inference: the typing rule of every op.
//!
//! [`infer`] computes an op's output types from its operand types. The graph
//! calls it when a node is added, and the verifier calls it again to check
//! that stored types still agree. Errors are sentences that name the operands
//! and the mismatch; the caller prefixes the node's name.

use crate::dtype::DType;
use crate::op::{Init, Op};
use crate::shape::{Dim, Shape, TensorType};

/// The length of a constant rank-1 tensor (a flat buffer).
fn rank1_len(t: &TensorType) -> Option<u64> {
    match t.shape.dims() {
        [d] => d.as_constant(),
        _ => None,
    }
}

/// The length of a collective's rank-1 operand, with `ranks ≥ 1`.
fn flat_len(op: &Op, t: &TensorType, ranks: u64) -> Result<u64, String> {
    match rank1_len(t) {
        Some(n) if ranks > 0 => Ok(n),
        _ => Err(format!("{} takes a constant rank-1 tensor over ≥ 1 ranks, got {t} over {ranks}", op.name())),
    }
}

/// `t` with axis `axis` cut to `1/ranks` (one tensor rank's slice).
fn sequence_split(op: &Op, t: &TensorType, ranks: u64, axis: usize) -> Result<TensorType, String> {
    let Some(d) = t.shape.dims().get(axis) else {
        return Err(format!("{} cuts axis {axis}, but {t} has {} axes", op.name(), t.shape.rank()));
    };
    let Some(part) = d.divided_by(ranks) else {
        return Err(format!("{}: axis {axis} of {t} (`{d}`) does not split over {ranks} ranks", op.name()));
    };
    let mut dims = t.shape.dims().to_vec();
    dims[axis] = part;
    Ok(TensorType::new(Shape(dims), t.dtype))
}

/// Sequence collectives move float activations `[B, S, …]` along axis 1.
fn float_sequence(op: &Op, t: &TensorType) -> Result<(), String> {
    if t.shape.rank() < 2 || !t.dtype.is_float() {
        return Err(format!("{} moves float activations [batch, seq, …] along the sequence, not {t}", op.name()));
    }
    Ok(())
}

/// The element count of `dims`, `None` where it overflows `u64`.
fn checked_count(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
}

/// An initialiser fits the tensor it initialises, of constant shape `dims`
/// (`None`: symbolic). The interpreter draws a tensor shard's or a tile's
/// whole tensor and cuts this node's part out of it, and writes a flat
/// buffer's members at their offsets: a plan file whose `whole`, cut or
/// offsets disagree with the node would make it draw past what the node
/// holds, or index past what it drew. Checked here, once per node, so
/// every graph read from a file is safe to initialise.
fn check_init(init: &Init, dims: Option<&[u64]>) -> Result<(), String> {
    let shape_of = |what: &str| dims.ok_or_else(|| format!("{what} initialises a tensor of constant shape"));
    let whole_count = |whole: &[u64]| {
        checked_count(whole).ok_or_else(|| format!("{init}: the whole tensor {whole:?} has more than 2⁶⁴ elements"))
    };
    match init {
        Init::Zeros | Init::Ones | Init::Constant { .. } | Init::Normal { .. } => Ok(()),
        Init::Flat { members, shards } => {
            let Some(&[len]) = dims.filter(|_| *shards > 0) else {
                return Err(format!("a flat buffer is a constant rank-1 tensor over ≥ 1 shards, not {dims:?}"));
            };
            let mut end = 0;
            for m in members.iter() {
                if m.offset < end {
                    return Err(format!("flat member `{}` at {} overlaps the one before it", m.name, m.offset));
                }
                end = checked_count(&m.shape).and_then(|n| m.offset.checked_add(n)).ok_or_else(|| {
                    format!("flat member `{}` at {} of shape {:?} ends past 2⁶⁴ elements", m.name, m.offset, m.shape)
                })?;
                check_init(&m.init, Some(&m.shape)).map_err(|e| format!("flat member `{}`: {e}", m.name))?;
            }
            if len.checked_mul(*shards).is_none_or(|whole| end > whole) {
                return Err(format!("the members need {end} elements, more than {len} × {shards} shards"));
            }
            Ok(())
        }
        Init::TensorShard { whole, axis, ranks, init: of } => {
            let dims = shape_of("a tensor shard")?;
            whole_count(whole)?;
            let cut = whole.get(*axis).filter(|&&n| *ranks > 0 && n % ranks == 0).map(|n| n / ranks);
            let Some(cut) = cut else {
                return Err(format!("{init}: axis {axis} of {whole:?} does not split over {ranks} ranks"));
            };
            let mut part = whole.to_vec();
            part[*axis] = cut;
            if part != dims {
                return Err(format!("{init}: one rank's part of {whole:?} is {part:?}, but the node is {dims:?}"));
            }
            check_init(of, Some(whole))
        }
        Init::Slice { whole, start, len, init: of, .. } => {
            let dims = shape_of("a tile")?;
            whole_count(whole)?;
            let fits = whole.first().is_some_and(|&rows| start.checked_add(*len).is_some_and(|end| end <= rows));
            if !fits {
                return Err(format!("{init}: rows {start}.. ({len} of them) lie outside {whole:?}"));
            }
            let part: Vec<u64> = std::iter::once(*len).chain(whole[1..].iter().copied()).collect();
            if part != dims {
                return Err(format!("{init}: the tile of {whole:?} is {part:?}, but the node is {dims:?}"));
            }
            check_init(of, Some(whole))
        }
    }
}

/// [`check_init`] for a parameter's or state's declared type `t`.
fn check_declared_init(init: &Init, t: &TensorType) -> Result<(), String> {
    let dims: Option<Vec<u64>> = t.shape.dims().iter().map(Dim::as_constant).collect();
    check_init(init, dims.as_deref())
}

/// The output types of `op` applied to operands of types `operands`.
///
/// Source ops (inputs, parameters, `arange`) have no operands: their type is
/// `declared`, which is checked here for what the op requires.
pub fn infer(op: &Op, operands: &[&TensorType], declared: &[TensorType]) -> Result<Vec<TensorType>, String> {
    if !op.arity().accepts(operands.len()) {
        return Err(format!("{} takes {} operands, got {}", op.name(), op.arity(), operands.len()));
    }
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Input => one(single_declared(op, declared)?),
        Op::Param { init } => {
            let t = single_declared(op, declared)?;
            require_float("the parameter", &t)?;
            check_declared_init(init, &t)?;
            if let Some(d) = t.shape.dims().iter().find(|d| d.as_constant().is_none()) {
                return Err(format!("parameters have constant shapes, but dimension `{d}` of {t} is symbolic"));
            }
            one(t)
        }
        Op::State { init } => {
            let t = single_declared(op, declared)?;
            check_declared_init(init, &t)?;
            one(t)
        }
        Op::Fill { .. } => one(single_declared(op, declared)?),
        Op::Arange => {
            let t = single_declared(op, declared)?;
            if t.shape.rank() != 1 || !t.dtype.is_int() {
                return Err(format!("arange produces a rank-1 integer tensor, not {t}"));
            }
            one(t)
        }
        Op::Embedding => {
            let (table, ids) = (operands[0], operands[1]);
            require_float("the embedding table", table)?;
            if table.shape.rank() != 2 {
                return Err(format!("the embedding table must be [rows, width], got {table}"));
            }
            if !ids.dtype.is_int() {
                return Err(format!("embedding ids must be integers, got {ids}"));
            }
            let mut dims = ids.shape.0.clone();
            dims.push(table.shape.0[1].clone());
            one(TensorType::new(Shape(dims), table.dtype))
        }
        Op::MatMul { transpose_a, transpose_b } => matmul(operands[0], operands[1], *transpose_a, *transpose_b),
        Op::Add | Op::Sub | Op::Mul => {
            let (a, b) = (operands[0], operands[1]);
            require_same_dtype(a, b)?;
            let shape = broadcast(&a.shape, &b.shape)
                .ok_or_else(|| format!("shapes {} and {} do not broadcast", a.shape, b.shape))?;
            one(TensorType::new(shape, a.dtype))
        }
        Op::Scale { .. } | Op::Gelu { .. } | Op::Silu | Op::Relu | Op::Tanh | Op::Softmax => {
            require_float("the operand", operands[0])?;
            one(operands[0].clone())
        }
        Op::Dropout { p, .. } => {
            require_float("the operand", operands[0])?;
            if !(0.0..1.0).contains(p) {
                return Err(format!("dropout probability must be in [0, 1), got {p}"));
            }
            one(operands[0].clone())
        }
        Op::Cast { to } => one(TensorType::new(operands[0].shape.clone(), *to)),
        Op::LayerNorm { eps } => {
            let (x, gamma, beta) = (operands[0], operands[1], operands[2]);
            require_float("the operand", x)?;
            if eps.is_nan() || *eps <= 0.0 {
                return Err(format!("layer_norm eps must be positive, got {eps}"));
            }
            let width = x.shape.last().ok_or("layer_norm needs an operand of rank ≥ 1, got a scalar")?;
            for (what, t) in [("gamma", gamma), ("beta", beta)] {
                require_same_dtype(x, t)?;
                if t.shape.dims() != [width.clone()] {
                    return Err(format!("{what} must be [{width}] to match the rows of {x}, got {t}"));
                }
            }
            one(x.clone())
        }
        Op::AttentionMask => {
            let (scores, mask) = (operands[0], operands[1]);
            require_float("the scores", scores)?;
            let [b, _, _, sk] = scores4(scores)?;
            if !mask.dtype.is_int() || mask.shape.dims() != [b.clone(), sk.clone()] {
                return Err(format!("the mask must be an integer [{b}, {sk}] for scores {scores}, got {mask}"));
            }
            one(scores.clone())
        }
        Op::AlibiBias { ranks } => {
            let scores = operands[0];
            if *ranks == 0 {
                return Err("alibi_bias needs at least one tensor rank".into());
            }
            require_float("the scores", scores)?;
            let [_, h, _, _] = scores4(scores)?;
            if h.as_constant().is_none() {
                return Err(format!("alibi_bias needs a constant head count, got `{h}`"));
            }
            one(scores.clone())
        }
        Op::FlashAttention { .. } => {
            let q = flash_attention(op, operands)?;
            let [b, h, s, _] = scores4(q)?;
            Ok(vec![q.clone(), TensorType::new(Shape(vec![b, h, s]), DType::F32)])
        }
        Op::FlashAttentionGrad { scale, alibi_ranks, dropout, stream } => {
            let forward =
                Op::FlashAttention { scale: *scale, alibi_ranks: *alibi_ranks, dropout: *dropout, stream: *stream };
            let outs = infer(&forward, &operands[..4], &[])?;
            for (what, t, want) in
                [("out", operands[4], &outs[0]), ("lse", operands[5], &outs[1]), ("dout", operands[6], &outs[0])]
            {
                if t != want {
                    return Err(format!("{what} must be the forward's {want}, got {t}"));
                }
            }
            let (q, k, v) = (operands[0], operands[1], operands[2]);
            Ok(vec![q.clone(), k.clone(), v.clone()])
        }
        Op::Reshape { shape } => {
            let x = operands[0];
            if x.shape.numel() != shape.numel() {
                return Err(format!(
                    "cannot reshape {} ({} elements) to {shape} ({} elements)",
                    x.shape,
                    x.shape.numel(),
                    shape.numel()
                ));
            }
            one(TensorType::new(shape.clone(), x.dtype))
        }
        Op::Transpose { perm } => {
            let x = operands[0];
            let mut seen = vec![false; x.shape.rank()];
            let valid = perm.len() == x.shape.rank()
                && perm.iter().all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
            if !valid {
                return Err(format!("{perm:?} is not a permutation of the {} axes of {x}", x.shape.rank()));
            }
            let dims = perm.iter().map(|&p| x.shape.0[p].clone()).collect();
            one(TensorType::new(Shape(dims), x.dtype))
        }
        Op::Split { axis, sizes } => {
            let x = operands[0];
            let dim = axis_dim(x, *axis)?;
            let total = sizes.iter().try_fold(0u64, |t, &s| t.checked_add(s));
            if sizes.is_empty() || sizes.contains(&0) || total.is_none() || dim.as_constant() != total {
                return Err(format!("split sizes {sizes:?} must be positive and sum to axis {axis} of {x}"));
            }
            Ok(sizes
                .iter()
                .map(|&s| {
                    let mut dims = x.shape.0.clone();
                    dims[*axis] = Dim::constant(s);
                    TensorType::new(Shape(dims), x.dtype)
                })
                .collect())
        }
        Op::Slice { axis, start, len } => {
            let x = operands[0];
            let dim = axis_dim(x, *axis)?;
            // A symbolic axis is checked when its symbols are bound.
            let fits = dim.as_constant().is_none_or(|n| start.checked_add(*len).is_some_and(|end| end <= n));
            if *len == 0 || !fits {
                return Err(format!("slice [{start}, {start}+{len}) is out of axis {axis} of {x}"));
            }
            let mut dims = x.shape.0.clone();
            dims[*axis] = Dim::constant(*len);
            one(TensorType::new(Shape(dims), x.dtype))
        }
        Op::Concat { axis } => concat(operands, *axis),
        Op::Flatten { len } => {
            let dtype = operands[0].dtype;
            let mut total = 0u64;
            for t in operands {
                if t.dtype != dtype {
                    return Err(format!("flatten needs operands of one dtype, got {} and {t}", operands[0]));
                }
                total +=
                    t.shape.numel().as_constant().ok_or_else(|| format!("flatten needs constant shapes, got {t}"))?;
            }
            if total > *len {
                return Err(format!("the operands hold {total} elements, more than the bucket's {len}"));
            }
            one(TensorType::new(Shape(vec![Dim::constant(*len)]), dtype))
        }
        Op::ReduceScatter { ranks } => {
            let n = flat_len(op, operands[0], *ranks)?;
            if n % ranks != 0 {
                return Err(format!(
                    "{} of {} over {ranks} ranks: the length must divide evenly",
                    op.name(),
                    operands[0]
                ));
            }
            one(TensorType::new(Shape(vec![Dim::constant(n / ranks)]), operands[0].dtype))
        }
        Op::AllGather { ranks } => {
            let n = flat_len(op, operands[0], *ranks)?;
            let whole = n
                .checked_mul(*ranks)
                .ok_or_else(|| format!("all_gather of {n} elements over {ranks} ranks: past 2⁶⁴ elements"))?;
            one(TensorType::new(Shape(vec![Dim::constant(whole)]), operands[0].dtype))
        }
        Op::AllReduce { ranks } => {
            if *ranks == 0 {
                return Err("all_reduce needs at least one rank".into());
            }
            one(operands[0].clone())
        }
        Op::Copy => one(operands[0].clone()),
        Op::TensorCopy { ranks } | Op::TensorAllReduce { ranks } => {
            if *ranks == 0 {
                return Err(format!("{} needs at least one rank", op.name()));
            }
            one(operands[0].clone())
        }
        Op::SequenceSlice { ranks, axis } => one(sequence_split(op, operands[0], *ranks, *axis)?),
        Op::SequenceReduceScatter { ranks } => {
            float_sequence(op, operands[0])?;
            one(sequence_split(op, operands[0], *ranks, 1)?)
        }
        Op::SequenceAllGather { ranks, .. } => {
            float_sequence(op, operands[0])?;
            if *ranks == 0 {
                return Err(format!("{} needs at least one rank", op.name()));
            }
            let mut dims = operands[0].shape.dims().to_vec();
            dims[1] = dims[1].product(&Dim::constant(*ranks));
            one(TensorType::new(Shape(dims), operands[0].dtype))
        }
        Op::VocabShard { ranks, rows } => {
            if *ranks == 0 || *rows == 0 || !operands[0].dtype.is_int() {
                return Err(format!("vocab_shard maps integer ids over ≥ 1 ranks of ≥ 1 rows, got {}", operands[0]));
            }
            one(operands[0].clone())
        }
        Op::CrossEntropyStats { ranks, vocab } => {
            let (logits, labels) = (operands[0], operands[1]);
            let (n, c) = logits_and_labels(logits, labels)?;
            let covers = c.as_constant().is_some_and(|c| *ranks > 0 && c * ranks >= *vocab && c * (ranks - 1) < *vocab);
            if !covers {
                return Err(format!("{ranks} ranks of {logits} do not cover a vocabulary of {vocab}, one shard each"));
            }
            let stats = Shape(vec![Dim::constant(*ranks), n, Dim::constant(3)]);
            one(TensorType::new(stats, logits.dtype))
        }
        Op::CrossEntropyCombine { .. } => {
            let (stats, labels, logits) = (operands[0], operands[1], operands[2]);
            let (n, _) = logits_and_labels(logits, labels)?;
            if stats.shape.rank() != 3 || stats.shape.dims()[1] != n || stats.shape.dims()[2] != Dim::constant(3) {
                return Err(format!("the statistics must be [ranks, {n}, 3], got {stats}"));
            }
            one(TensorType::new(Shape(vec![]), DType::F32))
        }
        Op::CrossEntropyShardGrad { .. } => {
            let (logits, labels, stats, dloss) = (operands[0], operands[1], operands[2], operands[3]);
            let (n, _) = logits_and_labels(logits, labels)?;
            if stats.shape.rank() != 3 || stats.shape.dims()[1] != n {
                return Err(format!("the statistics must be [ranks, {n}, 3], got {stats}"));
            }
            if dloss.shape.rank() != 0 {
                return Err(format!("dloss must be a scalar, got {dloss}"));
            }
            one(logits.clone())
        }
        Op::Fused { kernel } => {
            kernel.check()?;
            for (i, (arg, t)) in kernel.inputs.iter().zip(operands).enumerate() {
                if arg.ty != **t {
                    return Err(format!("operand {i} of kernel `{}` must be {}, got {t}", kernel.name, arg.ty));
                }
            }
            Ok(kernel.outputs.iter().map(|a| a.ty.clone()).collect())
        }
        Op::CrossEntropy { .. } => {
            let (logits, labels) = (operands[0], operands[1]);
            require_float("the logits", logits)?;
            let n = match logits.shape.dims() {
                [n, _] => n,
                _ => return Err(format!("cross_entropy logits must be [rows, classes], got {logits}")),
            };
            if !labels.dtype.is_int() || labels.shape.dims() != [n.clone()] {
                return Err(format!("cross_entropy labels must be integer [{n}] for logits {logits}, got {labels}"));
            }
            one(TensorType::new(Shape::scalar(), DType::F32))
        }
        Op::SumTo { shape } => {
            let x = operands[0];
            if broadcast(shape, &x.shape).as_ref() != Some(&x.shape) {
                return Err(format!("{} does not broadcast to {x}, so {x} cannot be summed to it", shape));
            }
            one(TensorType::new(shape.clone(), x.dtype))
        }
        Op::GeluGrad { .. } | Op::SiluGrad | Op::ReluGrad | Op::TanhGrad | Op::SoftmaxGrad => {
            let (x, dy) = (operands[0], operands[1]);
            require_float("the operand", x)?;
            if x != dy {
                return Err(format!("the forward value {x} and its gradient {dy} must have one type"));
            }
            one(x.clone())
        }
        Op::LayerNormGrad { eps } => {
            let (x, gamma, dy) = (operands[0], operands[1], operands[2]);
            let forward = infer(&Op::LayerNorm { eps: *eps }, &[x, gamma, gamma], &[])?;
            if &forward[0] != dy {
                return Err(format!("the gradient {dy} must have the type of the normalised value {x}"));
            }
            Ok(vec![x.clone(), gamma.clone(), gamma.clone()])
        }
        Op::AttentionMaskGrad => infer(&Op::AttentionMask, operands, declared),
        Op::SliceGrad { axis, start, axis_len } => {
            let dy = operands[0];
            let len = axis_dim(dy, *axis)?
                .as_constant()
                .ok_or_else(|| format!("slice_grad needs a constant axis {axis} in {dy}"))?;
            let fits = axis_len.as_constant().is_none_or(|n| start + len <= n);
            if !fits {
                return Err(format!("[{start}, {start}+{len}) does not fit an axis of {axis_len}"));
            }
            let mut dims = dy.shape.0.clone();
            dims[*axis] = axis_len.clone();
            one(TensorType::new(Shape(dims), dy.dtype))
        }
        Op::EmbeddingGrad { rows } => {
            let (dy, ids) = (operands[0], operands[1]);
            require_float("the gradient", dy)?;
            let width = dy.shape.last().ok_or("embedding_grad needs a gradient of rank ≥ 1")?;
            if !ids.dtype.is_int() || dy.shape.dims()[..dy.shape.rank() - 1] != *ids.shape.dims() {
                return Err(format!("the gradient {dy} must be the integer ids {ids} with one more axis"));
            }
            one(TensorType::new(Shape(vec![Dim::constant(*rows), width.clone()]), dy.dtype))
        }
        Op::CrossEntropyGrad { ignore_index } => {
            let (logits, labels, dloss) = (operands[0], operands[1], operands[2]);
            infer(&Op::CrossEntropy { ignore_index: *ignore_index }, &[logits, labels], &[])?;
            require_f32_scalar("dloss", dloss)?;
            one(logits.clone())
        }
        Op::MseGrad => {
            let (prediction, target, dloss) = (operands[0], operands[1], operands[2]);
            infer(&Op::Mse, &[prediction, target], &[])?;
            require_f32_scalar("dloss", dloss)?;
            one(prediction.clone())
        }
        Op::SquaredSum => {
            require_float("the operand", operands[0])?;
            one(f32_scalar())
        }
        Op::LrSchedule { peak, .. } => {
            require_f32_scalar("the step count", operands[0])?;
            if !(peak.is_finite() && *peak >= 0.0) {
                return Err(format!("the peak learning rate must be finite and ≥ 0, got {peak}"));
            }
            one(f32_scalar())
        }
        Op::GradScale { max_norm, micro_batches } => {
            require_f32_scalar("the squared norm", operands[0])?;
            require_f32_scalar("the loss scale", operands[1])?;
            if *micro_batches == 0 || max_norm.is_some_and(|n| n.is_nan() || n <= 0.0) {
                return Err(format!(
                    "grad_scale needs micro_batches ≥ 1 and a positive max_norm, got {micro_batches} and {max_norm:?}"
                ));
            }
            Ok(vec![f32_scalar(), f32_scalar()])
        }
        Op::AdamW { beta1, beta2, eps, weight_decay } => {
            let (param, grad, m, v) = (operands[0], operands[1], operands[2], operands[3]);
            require_float("the parameter", param)?;
            require_float("the gradient", grad)?;
            if grad.shape != param.shape || m != param || v != param {
                return Err(format!(
                    "adamw needs a gradient of the parameter's shape and moments of its type: param {param}, grad {grad}, m {m}, v {v}"
                ));
            }
            for (what, t) in
                [("lr", operands[4]), ("step", operands[5]), ("multiplier", operands[6]), ("finite", operands[7])]
            {
                require_f32_scalar(what, t)?;
            }
            let valid = (0.0..1.0).contains(beta1) && (0.0..1.0).contains(beta2) && *eps > 0.0 && *weight_decay >= 0.0;
            if !valid {
                return Err(format!(
                    "adamw needs betas in [0, 1), eps > 0 and weight decay ≥ 0, got {beta1}, {beta2}, {eps}, {weight_decay}"
                ));
            }
            Ok(vec![param.clone(), m.clone(), v.clone()])
        }
        Op::LossScaleUpdate { growth_interval, growth, backoff } => {
            for (what, t) in [("scale", operands[0]), ("good_steps", operands[1]), ("finite", operands[2])] {
                require_f32_scalar(what, t)?;
            }
            if *growth_interval == 0
                || growth.is_nan()
                || *growth < 1.0
                || backoff.is_nan()
                || *backoff <= 0.0
                || *backoff >= 1.0
            {
                return Err(format!(
                    "loss scaling needs growth_interval ≥ 1, growth ≥ 1 and backoff in (0, 1), got {growth_interval}, {growth}, {backoff}"
                ));
            }
            Ok(vec![f32_scalar(), f32_scalar()])
        }
        Op::Mse => {
            let (prediction, target) = (operands[0], operands[1]);
            require_float("the prediction", prediction)?;
            require_same_dtype(prediction, target)?;
            if prediction.shape.rank() != 1 || prediction.shape != target.shape {
                return Err(format!("mse needs two rank-1 tensors of one shape, got {prediction} and {target}"));
            }
            one(TensorType::new(Shape::scalar(), DType::F32))
        }
    }
}

fn single_declared(op: &Op, declared: &[TensorType]) -> Result<TensorType, String> {
    match declared {
        [t] => Ok(t.clone()),
        _ => Err(format!("{} declares exactly one output type, got {}", op.name(), declared.len())),
    }
}

fn f32_scalar() -> TensorType {
    TensorType::new(Shape::scalar(), DType::F32)
}

fn require_f32_scalar(what: &str, t: &TensorType) -> Result<(), String> {
    if *t == f32_scalar() { Ok(()) } else { Err(format!("{what} must be an f32 scalar, got {t}")) }
}

/// `(N, C)` of float `[N, C]` logits with integer `[N]` labels.
fn logits_and_labels(logits: &TensorType, labels: &TensorType) -> Result<(Dim, Dim), String> {
    require_float("the logits", logits)?;
    match logits.shape.dims() {
        [n, c] if labels.dtype.is_int() && labels.shape.dims() == [n.clone()] => Ok((n.clone(), c.clone())),
        _ => Err(format!("logits must be [N, C] with integer labels [N], got {logits} and {labels}")),
    }
}

fn require_float(what: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype.is_float() { Ok(()) } else { Err(format!("{what} must be a float tensor, got {t}")) }
}

fn require_same_dtype(a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a.dtype == b.dtype { Ok(()) } else { Err(format!("dtypes differ: {a} and {b} (insert a cast)")) }
}

fn axis_dim(x: &TensorType, axis: usize) -> Result<&Dim, String> {
    x.shape.dims().get(axis).ok_or_else(|| format!("axis {axis} is out of range for {x}"))
}

/// Checks `(q, k, v, mask)` of fused attention and its attributes; returns `q`.
fn flash_attention<'t>(op: &Op, operands: &[&'t TensorType]) -> Result<&'t TensorType, String> {
    let (Op::FlashAttention { scale, alibi_ranks, dropout, .. }
    | Op::FlashAttentionGrad { scale, alibi_ranks, dropout, .. }) = op
    else {
        unreachable!("only fused attention's operands are checked here")
    };
    let (q, k, v, mask) = (operands[0], operands[1], operands[2], operands[3]);
    require_float("q", q)?;
    let [b, h, s, _] = <[Dim; 4]>::try_from(q.shape.0.clone())
        .map_err(|_| format!("q must be [batch, heads, seq, head_dim], got {q}"))?;
    if k != q || v != q {
        return Err(format!("q, k and v must have one type [batch, heads, seq, head_dim], got {q}, {k} and {v}"));
    }
    if !mask.dtype.is_int() || mask.shape.dims() != [b.clone(), s.clone()] {
        return Err(format!("the mask must be an integer [{b}, {s}] for q {q}, got {mask}"));
    }
    if !scale.is_finite() {
        return Err(format!("the score scale must be finite, got {scale}"));
    }
    if !(0.0..1.0).contains(dropout) {
        return Err(format!("dropout probability must be in [0, 1), got {dropout}"));
    }
    match alibi_ranks {
        Some(0) => return Err("ALiBi needs at least one tensor rank".into()),
        Some(_) if h.as_constant().is_none() => {
            return Err(format!("ALiBi needs a constant head count, got `{h}`"));
        }
        _ => {}
    }
    Ok(q)
}

fn scores4(scores: &TensorType) -> Result<[Dim; 4], String> {
    <[Dim; 4]>::try_from(scores.shape.0.clone())
        .map_err(|_| format!("attention scores must be [batch, heads, query, key], got {scores}"))
}

/// NumPy broadcasting: align from the right; each pair is equal or has a 1.
pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let at = |s: &Shape, i: usize| (i + s.rank()).checked_sub(rank).map_or(Dim::constant(1), |j| s.0[j].clone());
    let mut dims = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (at(a, i), at(b, i));
        dims.push(if x == y || y.is_one() {
            x
        } else if x.is_one() {
            y
        } else {
            return None;
        });
    }
    Some(Shape(dims))
}

fn matmul(a: &TensorType, b: &TensorType, ta: bool, tb: bool) -> Result<Vec<TensorType>, String> {
    require_float("matmul's left operand", a)?;
    require_same_dtype(a, b)?;
    if a.shape.rank() < 2 || b.shape.rank() < 2 {
        return Err(format!("matmul operands need rank ≥ 2, got {a} and {b}"));
    }
    let last_two = |s: &Shape, t: bool| {
        let n = s.rank();
        let (r, c) = (s.0[n - 2].clone(), s.0[n - 1].clone());
        if t { (c, r) } else { (r, c) }
    };
    let (m, k) = last_two(&a.shape, ta);
    let (k2, n) = last_two(&b.shape, tb);
    if k != k2 {
        return Err(format!("inner dimensions differ: {a} contributes K = {k}, {b} contributes K = {k2}"));
    }
    let batch_a = Shape(a.shape.0[..a.shape.rank() - 2].to_vec());
    let batch_b = Shape(b.shape.0[..b.shape.rank() - 2].to_vec());
    let mut batch = broadcast(&batch_a, &batch_b)
        .ok_or_else(|| format!("batch dimensions {batch_a} and {batch_b} do not broadcast"))?;
    batch.0.push(m);
    batch.0.push(n);
    Ok(vec![TensorType::new(batch, a.dtype)])
}

fn concat(operands: &[&TensorType], axis: usize) -> Result<Vec<TensorType>, String> {
    let first = operands[0];
    axis_dim(first, axis)?;
    let mut total = Dim::constant(0);
    for t in operands {
        let same_elsewhere = t.shape.rank() == first.shape.rank()
            && t.dtype == first.dtype
            && (0..first.shape.rank()).all(|i| i == axis || t.shape.0[i] == first.shape.0[i]);
        if !same_elsewhere {
            return Err(format!("concat operands must agree except on axis {axis}: {first} and {t}"));
        }
        total = total
            .checked_add(&t.shape.0[axis])
            .ok_or_else(|| format!("axis {axis} sizes cannot be added symbolically: {total} + {}", t.shape.0[axis]))?;
    }
    let mut dims = first.shape.0.clone();
    dims[axis] = total;
    Ok(vec![TensorType::new(Shape(dims), first.dtype)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape;

    fn t(shape: Shape, dtype: DType) -> TensorType {
        TensorType::new(shape, dtype)
    }

    #[test]
    fn matmul_broadcasts_batch_and_checks_k() {
        let x = t(shape![Dim::symbol("batch"), Dim::symbol("seq"), 64], DType::F32);
        let w = t(shape![64, 32], DType::F32);
        let op = Op::MatMul { transpose_a: false, transpose_b: false };
        let out = infer(&op, &[&x, &w], &[]).unwrap();
        assert_eq!(out[0].to_string(), "f32[batch, seq, 32]");
        let bad = t(shape![32, 64], DType::F32);
        let err = infer(&op, &[&x, &bad], &[]).unwrap_err();
        assert!(err.contains("K = 64") && err.contains("K = 32"), "{err}");
        let tb = Op::MatMul { transpose_a: false, transpose_b: true };
        assert_eq!(
            infer(&tb, &[&x, &bad], &[]).unwrap()[0].shape,
            shape![Dim::symbol("batch"), Dim::symbol("seq"), 32]
        );
    }

    #[test]
    fn a_flat_member_past_two_to_the_64_elements_is_refused() {
        // A crafted plan file's member: its element count, or its end,
        // wraps u64 (a debug build panicked, a release build wrapped past
        // the bounds check).
        let member = |shape: Vec<u64>, offset| crate::op::FlatMember {
            name: "w".into(),
            shape,
            offset,
            init: Box::new(crate::op::Init::Zeros),
        };
        let flat = t(shape![16], DType::F32);
        for (m, shards) in
            [(member(vec![1 << 32, 1 << 32], 0), 1), (member(vec![4], u64::MAX - 1), 1), (member(vec![4], 0), u64::MAX)]
        {
            let op = Op::Param { init: crate::op::Init::Flat { members: [m].into(), shards } };
            let err = infer(&op, &[], std::slice::from_ref(&flat)).unwrap_err();
            assert!(err.contains("2⁶⁴") || err.contains("more than 16"), "{err}");
        }
        let fits = Op::Param { init: crate::op::Init::Flat { members: [member(vec![4, 4], 0)].into(), shards: 1 } };
        assert!(infer(&fits, &[], std::slice::from_ref(&flat)).is_ok());
    }

    #[test]
    fn reshape_checks_symbolic_element_counts() {
        let x = t(shape![Dim::symbol("batch"), Dim::symbol("seq"), 12], DType::F32);
        let flat = Op::Reshape { shape: shape!["batch*seq".parse::<Dim>().unwrap(), 12] };
        assert!(infer(&flat, &[&x], &[]).is_ok());
        let wrong = Op::Reshape { shape: shape![Dim::symbol("batch"), 12] };
        assert!(infer(&wrong, &[&x], &[]).unwrap_err().contains("cannot reshape"));
    }

    #[test]
    fn split_and_concat_are_inverse_in_type() {
        let x = t(shape![Dim::symbol("seq"), 96], DType::BF16);
        let parts = infer(&Op::Split { axis: 1, sizes: vec![32, 64] }, &[&x], &[]).unwrap();
        assert_eq!(parts.len(), 2);
        let refs: Vec<&TensorType> = parts.iter().collect();
        assert_eq!(infer(&Op::Concat { axis: 1 }, &refs, &[]).unwrap()[0], x);
    }

    #[test]
    fn dtype_mismatch_names_both_sides() {
        let a = t(shape![4], DType::F32);
        let b = t(shape![4], DType::BF16);
        let err = infer(&Op::Add, &[&a, &b], &[]).unwrap_err();
        assert!(err.contains("f32[4]") && err.contains("bf16[4]"), "{err}");
    }
}
