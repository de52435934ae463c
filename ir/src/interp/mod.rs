//! The reference interpreter: evaluates any [`Graph`] on the CPU with exact,
//! documented semantics for every [`Op`].
//!
//! It is the oracle every pass and backend is tested against, so clarity and
//! correctness come before speed. Each op family has its own file; this page
//! states the semantics they implement, exactly, in one place.
//!
//! # Rounding
//!
//! Every op computes in `f64`. In [`Rounding::F64`] nothing is ever rounded:
//! dtypes are labels only and `cast` between float dtypes relabels, which is
//! what gradient checks want. In [`Rounding::Native`] each float output is
//! then rounded once to its dtype (round to nearest even,
//! [`Tensor::round_to_dtype`]), as are parameters, states and inputs when
//! they are read: an exactly-rounded f32/bf16/f16 reference. A matmul or a
//! sum is therefore rounded once, after exact-ish `f64` accumulation, never
//! per partial sum.
//!
//! # Sources
//!
//! - `input`: the tensor fed under the node's name. The symbols (`batch`,
//!   `seq`) are bound by unifying each input's declared shape with its fed
//!   tensor's shape; a missing input, a wrong dtype or rank, or a size that
//!   contradicts an earlier binding is an error naming the input. Feeds that
//!   name no input are ignored.
//! - `param`, `state`: the value held under the node's name in the [`State`]
//!   (shape and dtype must match the declaration).
//! - `arange`: `0, 1, …, n−1` for the bound length `n`. `fill {value}`: every
//!   element `value` (truncated toward zero for an integer dtype).
//! - Initial values ([`Interpreter::init_state`]): `zeros`, `ones`,
//!   `constant {value}` (truncated toward zero for an integer dtype), and
//!   `normal {std}`: `std · z` with `z` from Box–Muller on one Philox draw,
//!   key = the seed, counter = (element index low 32 bits, high 32 bits,
//!   `0xFFFF_FFFF`, the 32-bit FNV-1a hash of the node's name) — keyed by
//!   name, so a pass that reorders or adds nodes leaves every parameter's
//!   initial value unchanged; `u1 = (w0 + 1)·2⁻³²` ∈ (0, 1],
//!   `u2 = w1·2⁻³²`, `z = √(−2 ln u1)·cos(2π u2)`. See [`random`].
//!
//! # Elementwise
//!
//! - `add`, `sub`, `mul`: NumPy broadcasting (align shapes from the right;
//!   each pair of sizes is equal or one of them is 1). Integer operands use
//!   integer arithmetic; overflow is an error. `sum_to {shape}` is the
//!   adjoint: it sums `x` over the axes that broadcasting `shape` to `x`'s
//!   shape would repeat.
//! - `scale {factor}`: `x·factor`.
//! - `gelu erf`: `0.5·x·(1 + erf(x/√2))`; `gelu tanh`:
//!   `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`; `silu`: `x·σ(x)`;
//!   `relu`: `max(0, x)` (NaN stays NaN); `tanh`. Each `*_grad` is `dy`
//!   times the exact derivative of its forward form (`gelu_grad tanh`
//!   differentiates the tanh form); `relu_grad` selects `dy` where `x > 0`
//!   and 0 elsewhere (so an infinite `dy` at `x ≤ 0` gives 0, as PyTorch's
//!   `threshold_backward`), and `tanh_grad (y, dy)` is `dy·(1 − y²)`.
//! - `cast {to}`: float → float relabels (and `Native` rounds); integer →
//!   float converts; float → integer truncates toward zero; NaN, ±∞ or a
//!   value outside the target integer type is an error, not a saturation.
//!
//! # Dense
//!
//! - `matmul {transpose_a, transpose_b}`: over the last two axes; the leading
//!   axes broadcast as in NumPy; a transpose flag swaps the last two axes of
//!   its own operand. Each output element is `Σ_k a[i,k]·b[k,j]`, summed in
//!   increasing `k` in `f64`.
//! - `embedding (table[V, E], ids[...])`: row gather; an id outside `[0, V)`
//!   is an error naming the id. `embedding_grad {rows}` scatter-adds the rows
//!   of `dy` into a zero `[rows, E]` table, in element order.
//!
//! # Rows (over the last axis)
//!
//! - `layer_norm {eps} (x, γ, β)`: with the row's mean `μ` and biased
//!   variance `σ² = Σ(x−μ)²/H` (two-pass), `x̂ = (x−μ)/√(σ²+eps)`,
//!   `y = x̂·γ + β`. `layer_norm_grad (x, γ, dy) → (dx, dγ, dβ)`: with
//!   `g = dy·γ` and `r = 1/√(σ²+eps)`, `dx = r·(g − mean(g) − x̂·mean(g·x̂))`,
//!   `dγ = Σ_rows dy·x̂`, `dβ = Σ_rows dy`.
//! - `softmax`: `exp(x − max) / Σ exp(x − max)`. A row that is entirely −∞
//!   (every key masked) gives **all zeros**, not NaN; a row holding a NaN
//!   gives all NaN. `softmax_grad (y, dy)`: `y·(dy − Σ dy·y)`.
//!
//! # Attention
//!
//! - `attention_mask (scores[B,H,Sq,Sk], mask[B,Sk])`: `scores[b,h,i,j]`
//!   becomes −∞ where `mask[b,j] == 0` (any nonzero mask value keeps the
//!   key). `attention_mask_grad (dy, mask)` zeroes the same entries of `dy`.
//! - `alibi_bias`: `scores[b,h,i,j] − m_h·|i−j|`. For a power of two `H`,
//!   `m_h = 2^(−8(h+1)/H)`; otherwise, with `n = 2^⌊log2 H⌋`, the `n` slopes
//!   for `n` followed by the even-indexed slopes (0, 2, 4, …) for `2n`, until
//!   there are `H` (ALiBi's reference code, MosaicBERT). See
//!   [`alibi_slopes`].
//! - `flash_attention {scale, alibi_ranks, dropout, stream} (q, k, v,
//!   mask)`: per (batch, head), the unfused chain on materialised `[S, S]`
//!   scores, step for step in its order: `s = (Σ_d q·k)·scale`, minus
//!   `m_h·|i−j|` with ALiBi, −∞ on masked keys, `softmax`, `dropout {p:
//!   dropout, stream}` on the flat `[B, H, S, S]` index, then `Σ_j p·v`; so
//!   in `F64` it equals the unfused graph bit for bit. `lse = log Σ_j
//!   exp(s)`, −∞ for a row whose every key is masked (whose `out` is 0).
//!   `flash_attention_grad` recomputes the probabilities from `q, k, v` and
//!   applies the unfused chain's adjoints in the same way; it reads `out`
//!   and `lse` for their shapes only. See [`flash_attention`].
//!
//! # Dropout
//!
//! `dropout {p, stream}`: element `e` (row-major index) is kept when
//! `u = (w0 >> 8)·2⁻²⁴ ≥ p`, where `w0` is the first word of
//! Philox4x32-10 with key `(seed as u32, (seed >> 32) as u32)` and counter
//! `(e as u32, (e >> 32) as u32, stream, offset as u32)`; a kept element is
//! multiplied by `1/(1−p)` (that factor computed in `f64`), the others are 0.
//! The same (seed, stream, offset, element) always gives the same mask, so a
//! recomputed forward and every backend reproduce it. See [`philox`] and
//! [`random::dropout_keeps`].
//!
//! # Layout
//!
//! Row-major throughout. `reshape` keeps the element order; `transpose
//! {perm}` gives output axis `d` the input axis `perm[d]`; `split` cuts an
//! axis into pieces; `slice {axis, start, len}` keeps `[start, start+len)`
//! (past the bound length of a symbolic axis is an error); `slice_grad`
//! places `dy` at that window of a zero tensor; `concat` joins in operand
//! order. Layout ops work on integer tensors too.
//!
//! # Losses (f32 scalars)
//!
//! - `cross_entropy {ignore_index} (logits[N,C], labels[N])`: the mean over
//!   the rows whose label ≠ `ignore_index` of `logsumexp(row) − row[label]`.
//!   With **no counted row the loss is 0** (PyTorch gives NaN). A label
//!   outside `[0, C)` that is not `ignore_index` is an error.
//!   `cross_entropy_grad (logits, labels, dloss)`:
//!   `dloss·(softmax(row) − onehot(label))/count` on counted rows, 0 on the
//!   others.
//! - `mse (p[N], t[N])`: `Σ(p−t)²/N` (0 when `N = 0`); `mse_grad`:
//!   `dloss·2(p−t)/N`.
//!
//! # Optimizer (f32 scalars steer it)
//!
//! - `squared_sum`: `Σ x²` in `f64`, one rounding to f32 in `Native`.
//! - `lr_schedule {peak, warmup_steps: W, total_steps}` on `s` completed
//!   steps: `peak·s/W` when `W > 0` and `s < W`; else, with `total_steps =
//!   Some(T)`, `peak·max(0, (T−s)/max(1, T−W))`; else `peak` (Hugging Face's
//!   `get_linear_schedule_with_warmup`, whose `max(1, ·)` guards `T = W`).
//! - `grad_scale {max_norm, micro_batches: k} (sq, S)`: if `sq` is not finite,
//!   `(multiplier 0, finite 0)`. Else `norm = √sq/(S·k)`,
//!   `clip = min(1, max_norm/(norm + 1e-6))` (1 without `max_norm`; PyTorch's
//!   `clip_grad_norm_`), `multiplier = clip/(S·k)`, `finite = 1`.
//! - `adamw {β1, β2, eps, wd} (p, g, m, v, lr, t, multiplier, finite)`: if
//!   `finite == 0`, `(p, m, v)` unchanged. Else `g' = g·multiplier`;
//!   `p ← p·(1 − lr·wd)`; `m ← β1·m + (1−β1)·g'`; `v ← β2·v + (1−β2)·g'²`;
//!   `p ← p − lr·(m/(1−β1^t)) / (√(v/(1−β2^t)) + eps)` (PyTorch's AdamW).
//! - `loss_scale_update {growth_interval, growth, backoff} (scale, good,
//!   finite)`: if `finite ≠ 0`, `good + 1`, and when that reaches
//!   `growth_interval`, `(scale·growth, 0)`; else `(scale·backoff, 0)`.
//!
//! # Fused kernels
//!
//! `fused {kernel}`: the [`crate::kernel::Kernel`] evaluated row by row,
//! every expression in `f64` with no rounding inside the kernel (only its
//! outputs are rounded in `Native`, so a fused graph may differ from the
//! unfused one there by the intermediate roundings; in `F64` they agree).
//! `keep {p, stream}` is exactly dropout's test above, on the element's
//! row-major index in the kernel shape; `alibi_penalty` is `m_h·|i−j|`.
//!
//! # A training step
//!
//! [`Interpreter::step`] runs `k` micro-batches. Micro-batch `i` evaluates
//! every `input` node and every forward- and backward-phase node with dropout
//! offset `step·k + i`, then applies the updates whose value is a forward- or
//! backward-phase node (gradient accumulators), all at once. Then the
//! optimizer-phase nodes run once (dropout offset `step·k`) and their updates
//! are applied. Sources (`param`, `state`, `fill`, `arange`) belong to no
//! micro-batch: each pass reads `param` and `state` from the state as it
//! stands when that pass starts, so the optimizer reads the accumulated
//! gradients. Any other forward/backward value, inputs included, exists once
//! per micro-batch: an optimizer node may read it only when `k == 1`.
//!
//! Run-time shape errors (a slice past a symbolic axis, an unbound symbol, a
//! bad id or label) are [`InterpError`]s naming the node; bad input never
//! panics.

mod attention;
mod bind;
mod dispatch;
mod elementwise;
mod embedding;
pub mod flash_attention;
mod kernel;
mod layout;
mod loss;
mod matmul;
mod nd;
mod optimizer;
mod pass;
pub mod philox;
pub mod random;
mod rows;
pub mod sequence_parallel;
pub mod tensor_parallel;

use crate::graph::NodeIndex;
use std::collections::BTreeMap;

use crate::graph::{Graph, Phase, Value};
use crate::op::{Init, Op};
use crate::shape::Bindings;
use crate::tensor::Tensor;
use pass::{Pass, Why};

pub use attention::{alibi_slopes, alibi_slopes_of_rank};
pub use elementwise::{gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad, relu, sigmoid, silu, silu_grad};
pub use loss::label_classes;
pub use optimizer::{grad_scale, loss_scale_update, lr_schedule};
pub use random::InitRank;

/// How float results are rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// All float math in f64, no rounding anywhere (dtypes are ignored, casts
    /// only relabel): for gradient checks.
    F64,
    /// Each op computes in f64 internally, then rounds each float output to
    /// its dtype ([`Tensor::round_to_dtype`]): an exactly-rounded
    /// f32/bf16/f16 reference.
    Native,
}

/// Input node name → value.
pub type Feeds = BTreeMap<String, Tensor>;
/// Param/State node name → value.
pub type State = BTreeMap<String, Tensor>;

/// Evaluates graphs. `seed` drives dropout masks and parameter init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interpreter {
    pub rounding: Rounding,
    pub seed: u64,
}

/// A failure while evaluating a node (or reading the feed or state of one).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("node `{node}`: {message}")]
pub struct InterpError {
    pub node: String,
    pub message: String,
}

impl InterpError {
    fn new(node: impl Into<String>, message: impl Into<String>) -> InterpError {
        InterpError { node: node.into(), message: message.into() }
    }
}

/// Every evaluated node's outputs, by node name.
#[derive(Clone, Debug, Default)]
pub struct Values {
    by_name: BTreeMap<String, Vec<Tensor>>,
    bindings: Bindings,
}

impl Values {
    /// The first (usually only) output of `node`.
    pub fn output(&self, node: &str) -> Option<&Tensor> {
        self.by_name.get(node)?.first()
    }

    /// All outputs of `node` (several for `split`, `layer_norm_grad`, `adamw`…).
    pub fn outputs(&self, node: &str) -> Option<&[Tensor]> {
        self.by_name.get(node).map(Vec::as_slice)
    }

    /// The tensor of `v`. Panics if `v`'s node was not evaluated, like
    /// indexing: use [`Values::outputs`] to ask.
    pub fn value(&self, graph: &Graph, v: Value) -> &Tensor {
        let name: &str = &graph.node(v.node).name;
        let outs = self.by_name.get(name).unwrap_or_else(|| panic!("node `{name}` was not evaluated"));
        &outs[v.output as usize]
    }

    /// The graph output declared as `name` ([`Graph::outputs`]), which may
    /// differ from its node's name (`logits` is the node `mlm.logits`).
    pub fn graph_output(&self, graph: &Graph, name: &str) -> Option<&Tensor> {
        let (_, v) = graph.outputs.iter().find(|(n, _)| n == name)?;
        self.by_name.get(&*graph.node(v.node).name)?.get(v.output as usize)
    }

    /// The symbol values bound from the inputs.
    pub fn bindings(&self) -> &Bindings {
        &self.bindings
    }

    /// Node names and their outputs, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[Tensor])> {
        self.by_name.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }
}

/// What one training step returns: the graph outputs of the forward and
/// backward phases once per micro-batch, those of the optimizer phase once.
#[derive(Clone, Debug, Default)]
pub struct StepOutputs {
    pub micro_batches: Vec<BTreeMap<String, Tensor>>,
    pub optimizer: BTreeMap<String, Tensor>,
}

impl Interpreter {
    pub fn new(rounding: Rounding, seed: u64) -> Interpreter {
        Interpreter { rounding, seed }
    }

    /// Initial values of every Param and State node from its Init (see the
    /// module docs for `normal`). Shapes must be constant.
    pub fn init_state(&self, graph: &Graph) -> Result<State, InterpError> {
        self.init_rank_state(graph, None)
    }

    /// As [`Interpreter::init_state`], for data-parallel rank `rank` of a
    /// partitioned graph: each sharded flat buffer gets this rank's slice of
    /// the value the whole buffer would have, so every rank count starts
    /// from the same model.
    pub fn init_rank_state(&self, graph: &Graph, rank: Option<u64>) -> Result<State, InterpError> {
        self.init_missing(graph, InitRank { data: rank, tensor: None }, &State::new())
    }

    /// As [`Interpreter::init_rank_state`], for the params and states *not*
    /// in `given` only: a caller about to load a checkpoint does not pay for
    /// drawing the values it overwrites (1.6 s of Box–Muller at MiniLM's
    /// 22 M parameters). `rank` also names the tensor-parallel rank whose
    /// [`crate::Init::TensorShard`]s to draw (the interpreter itself runs
    /// one tensor rank, but the runtimes initialise through here).
    pub fn init_missing(&self, graph: &Graph, rank: InitRank, given: &State) -> Result<State, InterpError> {
        let mut state = State::new();
        self.init_each(
            graph,
            rank,
            |name, _| given.contains_key(name),
            |name, t| {
                state.insert(name.to_string(), t);
                Ok::<(), InterpError>(())
            },
        )?;
        Ok(state)
    }

    /// As [`Interpreter::init_missing`], one node at a time and without the
    /// nodes `skip` names: `f` takes each initial value as it is drawn, so a
    /// runtime writing them into its memory holds one at a time (bert-base's
    /// states as `f64` tensors all at once are 3.5 GB), and one whose fresh
    /// memory reads as zero skips the `zeros` states.
    pub fn init_each<E: From<InterpError>>(
        &self,
        graph: &Graph,
        rank: InitRank,
        skip: impl Fn(&str, &Init) -> bool,
        mut f: impl FnMut(&str, Tensor) -> Result<(), E>,
    ) -> Result<(), E> {
        for n in graph.topo_order() {
            let node = graph.node(n);
            let init = match &node.op {
                Op::Param { init } | Op::State { init } if !skip(&node.name, init) => init,
                _ => continue,
            };
            let fail = |m: String| InterpError::new(&*node.name, m);
            let ty = &node.outputs[0];
            let shape = bind::concrete_shape(&ty.shape, &Bindings::new()).map_err(fail)?;
            let stream = random::name_stream(&node.name);
            let mut t = random::init(init, shape, ty.dtype, self.seed, stream, rank).map_err(fail)?;
            if self.rounding == Rounding::Native {
                t.round_to_dtype();
            }
            f(&node.name, t)?;
        }
        Ok(())
    }

    /// Evaluates every node once, all phases, in topological order. Sources:
    /// Param/State from `state`, Input from `feeds`, Arange/Fill from their
    /// types. `offset` is the dropout offset. Applies no update.
    pub fn evaluate(&self, graph: &Graph, state: &State, feeds: &Feeds, offset: u64) -> Result<Values, InterpError> {
        let order = graph.topo_order();
        let inputs: Vec<NodeIndex> = order.iter().copied().filter(|&n| is_input(graph, n)).collect();
        let bindings = bind::bind_inputs(graph, &inputs, feeds)?;
        let mut pass = Pass::new(self, graph, state, Some(feeds), bindings, offset, Why::Evaluate);
        for n in order {
            pass.eval(n)?;
        }
        Ok(pass.into_values())
    }

    /// One training step of `k = micro_batches.len()` micro-batches (see the
    /// module docs): per micro-batch the forward and backward nodes and their
    /// updates, then the optimizer nodes once and their updates. On error
    /// `state` may hold the updates of the micro-batches that completed.
    pub fn step(
        &self,
        graph: &Graph,
        state: &mut State,
        micro_batches: &[Feeds],
        step: u64,
    ) -> Result<StepOutputs, InterpError> {
        let k = micro_batches.len() as u64;
        if k == 0 {
            return Err(InterpError::new(&graph.name, "a step needs at least one micro-batch"));
        }
        let order = graph.topo_order();
        let phase = |v: &Value| graph.node(v.node).phase;
        let inputs: Vec<NodeIndex> = order.iter().copied().filter(|&n| is_input(graph, n)).collect();
        let mut outputs = StepOutputs::default();
        let mut single_pass = None;

        for (i, feeds) in micro_batches.iter().enumerate() {
            let bindings = bind::bind_inputs(graph, &inputs, feeds)?;
            let offset = step.wrapping_mul(k).wrapping_add(i as u64);
            let mut pass = Pass::new(self, graph, state, Some(feeds), bindings, offset, Why::MicroBatch);
            for &n in &order {
                if is_input(graph, n) || graph.node(n).phase != Phase::Optimizer {
                    pass.eval(n)?;
                }
            }
            let updates = pass.updates(|v| phase(v) != Phase::Optimizer)?;
            let mut results = BTreeMap::new();
            for (name, v) in graph.outputs.iter().filter(|(_, v)| phase(v) != Phase::Optimizer) {
                results.insert(name.clone(), pass.get(*v)?.clone());
            }
            outputs.micro_batches.push(results);
            let (values, bindings) = (pass.values, pass.bindings);
            state.extend(updates);
            if k == 1 {
                single_pass = Some((values, bindings));
            }
        }

        // With one micro-batch the optimizer may read its values; params and
        // states are re-read from the updated state either way.
        let (mut values, bindings) = single_pass.unwrap_or_default();
        values.retain(|&n, _| !matches!(graph.node(n).op, Op::Param { .. } | Op::State { .. }));
        let offset = step.wrapping_mul(k);
        let mut pass = Pass::new(self, graph, state, None, bindings, offset, Why::Optimizer { micro_batches: k });
        pass.values = values;
        for &n in &order {
            if graph.node(n).phase == Phase::Optimizer && !is_input(graph, n) {
                pass.eval(n)?;
            }
        }
        let updates = pass.updates(|v| phase(v) == Phase::Optimizer)?;
        for (name, v) in graph.outputs.iter().filter(|(_, v)| phase(v) == Phase::Optimizer) {
            outputs.optimizer.insert(name.clone(), pass.get(*v)?.clone());
        }
        state.extend(updates);
        Ok(outputs)
    }
}

fn is_input(graph: &Graph, n: NodeIndex) -> bool {
    matches!(graph.node(n).op, Op::Input)
}
