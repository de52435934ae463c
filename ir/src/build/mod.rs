//! From a [`ModelSpec`] to the forward graph: embeddings, encoder layers,
//! the task head and its loss.
//!
//! Conventions the passes and the weight loader rely on:
//! - Linear weights are stored `[out, in]`, as PyTorch and Hugging Face store
//!   them, and applied as `x @ Wᵀ` (`matmul` with `transpose_b`), so
//!   checkpoints load without copies and the MLM decoder can reuse the word
//!   embeddings `[vocab, E]` as its weight.
//! - Q, K and V (and a GLU's gate and up) are separate matmuls on the same
//!   input: whether to merge them is the rewrite pass's decision.
//! - A dropout of probability 0 is left out of the graph.
//! - Inputs: `input_ids`, `token_type_ids` (when `type_vocab > 0`) and
//!   `attention_mask`, all `i64[batch, seq]`, and `labels`.
//!
//! With tensor parallelism over `t` ranks ([`BuildOptions::tensor_parallel`])
//! the graph is one tensor rank's (Shoeybi et al., Megatron-LM, 2019): Q, K,
//! V and the feed-forward up (and gate) projections are column-parallel
//! (`1/t` of the heads and of the intermediate width per rank, behind a
//! `tensor_copy`), the attention output and feed-forward down projections
//! row-parallel (a `tensor_all_reduce` of the partial products, then the
//! bias); the word embeddings are vocabulary-parallel (`vocab_shard` ids,
//! a `tensor_all_reduce` of the rows), and so is the tied MLM decoder with a
//! cross-entropy that exchanges three numbers per row instead of the logits.
//! The vocabulary is padded up to a multiple of `t`. LayerNorms, biases after
//! a reduction, position and token-type embeddings and the pooler and
//! classifier are replicated: every tensor rank computes them identically.
//! Sharded parameters carry [`Init::TensorShard`].
//!
//! With sequence parallelism as well ([`BuildOptions::sequence_parallel`];
//! Korthikanti et al., 2022) the regions between the column- and
//! row-parallel blocks — LayerNorms, dropouts, residual adds, the row
//! projections' biases, the embeddings' sums, norm and projection, the MLM
//! transform — run on this rank's `[batch, seq/t, hidden]` slice of the
//! sequence (the type says `seq/t`, see [`crate::shape`]): the `tensor_copy`
//! before a column-parallel block becomes a `sequence_all_gather` and the
//! `tensor_all_reduce` after a row-parallel one a `sequence_reduce_scatter`.
//! Position and token-type ids are cut to the slice (`sequence_slice`);
//! attention still sees the whole sequence and mask. The parameters of those
//! regions get a partial gradient on each rank (from its positions only), so
//! each is read through a `tensor_copy` (`P.sequence_parallel`), whose
//! adjoint sums the gradient over the tensor ranks: afterwards it is
//! replicated, as the optimizer and the global norm expect. The pooler and
//! classifier read the whole sequence, gathered once.

mod embeddings;
mod encoder;
mod heads;
mod weights;

use crate::dropout_stream;
use crate::dtype::DType;
use crate::graph::{Graph, GraphError, Value};
use crate::op::{Init, Op};
use crate::shape::{Dim, Shape, TensorType};
use crate::spec::{ModelSpec, validate};

/// Choices that are not part of the model: the compute dtype.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Dtype of parameters and activations in the forward graph. Mixed
    /// precision (fp32 master weights) is the training graph's concern.
    pub dtype: DType,
    /// Tensor-parallel ranks `t` (1: none); the graph built is one tensor rank's.
    pub tensor_parallel: u64,
    /// Megatron's sequence parallelism over the same `t` ranks (needs `t > 1`):
    /// LayerNorm, dropout and residual regions on `[batch, seq/t, hidden]`.
    pub sequence_parallel: bool,
}

impl BuildOptions {
    /// One rank's whole model in `dtype`.
    pub fn new(dtype: DType) -> BuildOptions {
        BuildOptions { dtype, tensor_parallel: 1, sequence_parallel: false }
    }
}

impl Default for BuildOptions {
    fn default() -> BuildOptions {
        BuildOptions::new(DType::F32)
    }
}

/// Why a graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the spec is invalid: {}", .0.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))]
    InvalidSpec(Vec<crate::spec::FieldProblem>),
    #[error("building the graph failed at {0}")]
    Graph(#[from] GraphError),
    #[error("tensor parallelism over {ranks} ranks: {why}")]
    TensorParallel { ranks: u64, why: String },
}

/// Why `spec` cannot be split over `t` tensor-parallel ranks, if it cannot.
pub fn check_tensor_parallel(spec: &ModelSpec, t: u64) -> Result<(), String> {
    if t == 0 {
        return Err("at least one rank is needed".into());
    }
    if t == 1 {
        return Ok(());
    }
    if !spec.heads.is_multiple_of(t) {
        return Err(format!("the {} attention heads do not split evenly; use a divisor of {}", spec.heads, spec.heads));
    }
    if !spec.intermediate.is_multiple_of(t) {
        return Err(format!("the feed-forward width {} does not split evenly; use a divisor of it", spec.intermediate));
    }
    if let crate::spec::Sharing::TemplateBank { .. } = spec.sharing {
        return Err("template-bank weights are computed whole from the bank; they are not split (use t = 1)".into());
    }
    Ok(())
}

/// The forward graph of `spec`, verified. Symbols: `batch` and `seq`.
pub fn forward(spec: &ModelSpec, options: &BuildOptions) -> Result<Graph, BuildError> {
    validate(spec).map_err(BuildError::InvalidSpec)?;
    if !options.dtype.is_float() {
        return Err(GraphError {
            node: spec.name.clone(),
            op: "param",
            message: format!("compute dtype must be a float, not {}", options.dtype),
        }
        .into());
    }
    let t = options.tensor_parallel;
    check_tensor_parallel(spec, t).map_err(|why| BuildError::TensorParallel { ranks: t, why })?;
    if options.sequence_parallel && t == 1 {
        let why = "sequence parallelism splits the sequence over the tensor-parallel ranks: it needs more than one \
                   (use --tp 2 or more, or leave it off)";
        return Err(BuildError::TensorParallel { ranks: t, why: why.into() });
    }
    let mut b = Builder {
        spec,
        graph: Graph::new(spec.name.clone()),
        dtype: options.dtype,
        next_stream: 0,
        t,
        sp: options.sequence_parallel,
    };
    let x = b.embeddings()?;
    let x = b.encoder(x)?;
    b.head(x)?;
    b.graph.verify().map_err(|e| GraphError { node: e.node, op: "verify", message: e.message })?;
    Ok(b.graph)
}

/// Accumulates the graph; one method per block of the model.
struct Builder<'a> {
    spec: &'a ModelSpec,
    graph: Graph,
    dtype: DType,
    /// The next dropout site's random stream.
    next_stream: u32,
    /// Tensor-parallel ranks (1: none).
    t: u64,
    /// Sequence parallelism over the `t` ranks.
    sp: bool,
}

fn batch() -> Dim {
    Dim::symbol("batch")
}

fn seq() -> Dim {
    Dim::symbol("seq")
}

impl Builder<'_> {
    fn float(&self, dims: Vec<Dim>) -> TensorType {
        TensorType::new(Shape(dims), self.dtype)
    }

    /// A parameter created on first use and found by name afterwards, which
    /// is how one weight serves several layers.
    fn param(&mut self, name: &str, dims: &[u64], init: Init) -> Result<Value, GraphError> {
        if let Some(node) = self.graph.node_by_name(name) {
            return Ok(Value { node, output: 0 });
        }
        let ty = self.float(dims.iter().map(|&d| Dim::constant(d)).collect());
        self.graph.param(name, ty, init)
    }

    /// A parameter whose whole shape is `whole`, split along `axis` over
    /// the tensor-parallel ranks (whole when there is one).
    fn sharded_param(&mut self, name: &str, whole: &[u64], axis: usize, init: Init) -> Result<Value, GraphError> {
        if self.t == 1 {
            return self.param(name, whole, init);
        }
        let mut local = whole.to_vec();
        local[axis] /= self.t;
        let init = Init::TensorShard { whole: whole.into(), axis, ranks: self.t, init: std::sync::Arc::new(init) };
        self.param(name, &local, init)
    }

    /// Megatron's `f` before a column-parallel region (nothing with one
    /// rank): with sequence parallelism, the gather of the ranks' slices.
    fn enter_parallel(&mut self, name: &str, x: Value) -> Result<Value, GraphError> {
        if self.t == 1 {
            return Ok(x);
        }
        if self.sp {
            let gather = Op::SequenceAllGather { ranks: self.t, partial_grad: true };
            return self.graph.add(format!("{name}.sequence_all_gather"), gather, &[x]);
        }
        self.graph.add(format!("{name}.tensor_copy"), Op::TensorCopy { ranks: self.t }, &[x])
    }

    /// Megatron's `g` after a row-parallel region: the sum of the ranks'
    /// partial results, or with sequence parallelism each rank's slice of it.
    fn exit_parallel(&mut self, name: &str, x: Value) -> Result<Value, GraphError> {
        if self.t > 1 && self.sp {
            let scatter = Op::SequenceReduceScatter { ranks: self.t };
            return self.graph.add(format!("{name}.sequence_reduce_scatter"), scatter, &[x]);
        }
        self.reduce_parallel(name, x)
    }

    /// The whole sequence for replicated consumers (the pooler): gathered
    /// with sequence parallelism, where each rank then keeps its slice of
    /// the (equal) gradients; `x` itself otherwise.
    fn whole_sequence(&mut self, name: &str, x: Value) -> Result<Value, GraphError> {
        if !self.sp {
            return Ok(x);
        }
        let gather = Op::SequenceAllGather { ranks: self.t, partial_grad: false };
        self.graph.add(format!("{name}.sequence_all_gather"), gather, &[x])
    }

    /// This rank's slice of a `[.., seq, ..]` tensor of ids along `axis`
    /// with sequence parallelism; `ids` itself otherwise.
    fn sequence_slice(&mut self, name: &str, ids: Value, axis: usize) -> Result<Value, GraphError> {
        if !self.sp {
            return Ok(ids);
        }
        self.graph.add(format!("{name}.sequence_slice"), Op::SequenceSlice { ranks: self.t, axis }, &[ids])
    }

    /// A replicated parameter read in a sequence-parallel region: through a
    /// `tensor_copy` (one per parameter, shared by its readers), whose
    /// adjoint sums the ranks' partial gradients. `p` itself otherwise.
    fn sequence_param(&mut self, p: Value) -> Result<Value, GraphError> {
        if !self.sp {
            return Ok(p);
        }
        let name = format!("{}.sequence_parallel", self.graph.node(p.node).name);
        if let Some(node) = self.graph.node_by_name(&name) {
            return Ok(Value { node, output: 0 });
        }
        self.graph.add(name, Op::TensorCopy { ranks: self.t }, &[p])
    }

    /// The sum of the ranks' partial results (nothing with one rank).
    fn reduce_parallel(&mut self, name: &str, x: Value) -> Result<Value, GraphError> {
        if self.t == 1 {
            return Ok(x);
        }
        self.graph.add(format!("{name}.tensor_all_reduce"), Op::TensorAllReduce { ranks: self.t }, &[x])
    }

    /// Rows of the word embedding table per tensor rank: the vocabulary
    /// padded up to a multiple of the ranks, split evenly.
    fn vocab_rows(&self) -> u64 {
        self.spec.vocab_size.div_ceil(self.t)
    }

    fn normal(&self) -> Init {
        Init::Normal { std: self.spec.initializer_range }
    }

    /// `x @ weightᵀ (+ bias)`, named `name`; the matmul alone is `name.mm`
    /// when there is a bias.
    fn linear(&mut self, name: &str, x: Value, weight: Value, bias: Option<Value>) -> Result<Value, GraphError> {
        let mm = Op::MatMul { transpose_a: false, transpose_b: true };
        match bias {
            None => self.graph.add(name, mm, &[x, weight]),
            Some(bias) => {
                let product = self.graph.add(format!("{name}.mm"), mm, &[x, weight])?;
                self.graph.add(name, Op::Add, &[product, bias])
            }
        }
    }

    /// A LayerNorm; always in a sequence-parallel region when there is one.
    fn layer_norm(&mut self, name: &str, x: Value, gamma: Value, beta: Value) -> Result<Value, GraphError> {
        let (gamma, beta) = (self.sequence_param(gamma)?, self.sequence_param(beta)?);
        self.graph.add(name, Op::LayerNorm { eps: self.spec.layer_norm_eps }, &[x, gamma, beta])
    }

    /// Dropout with its own random stream; identity (no node) when `p` is 0.
    /// `sharded`: `x` is split over the tensor ranks (each holds other
    /// elements), so the site is marked to draw a mask per tensor rank
    /// ([`crate::dropout_stream`]); otherwise every rank draws the same one.
    fn dropout(&mut self, name: &str, x: Value, p: f64, sharded: bool) -> Result<Value, GraphError> {
        if p == 0.0 {
            return Ok(x);
        }
        let site = self.next_stream;
        if site >= dropout_stream::MAX_SITES {
            let message = format!("more than {} dropout sites do not fit the stream word", dropout_stream::MAX_SITES);
            return Err(GraphError { node: name.into(), op: "dropout", message });
        }
        self.next_stream += 1;
        let stream = dropout_stream::site_stream(site, sharded && self.t > 1);
        self.graph.add(name, Op::Dropout { p, stream }, &[x])
    }

    fn activation(&mut self, name: &str, x: Value) -> Result<Value, GraphError> {
        use crate::op::GeluApproximation;
        use crate::spec::Activation;
        let op = match self.spec.activation {
            Activation::Gelu => Op::Gelu { approximation: GeluApproximation::Erf },
            Activation::GeluTanh => Op::Gelu { approximation: GeluApproximation::Tanh },
            Activation::Relu => Op::Relu,
            Activation::Silu => Op::Silu,
        };
        self.graph.add(name, op, &[x])
    }

    /// An `i64[batch, seq]` input.
    fn token_input(&mut self, name: &str) -> Result<Value, GraphError> {
        self.graph.input(name, TensorType::new(Shape(vec![batch(), seq()]), DType::I64))
    }
}
