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

mod embeddings;
mod encoder;
mod heads;
mod weights;

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
}

impl Default for BuildOptions {
    fn default() -> BuildOptions {
        BuildOptions { dtype: DType::F32 }
    }
}

/// Why a graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the spec is invalid: {}", .0.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))]
    InvalidSpec(Vec<crate::spec::FieldProblem>),
    #[error("building the graph failed at {0}")]
    Graph(#[from] GraphError),
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
    let mut b = Builder { spec, graph: Graph::new(spec.name.clone()), dtype: options.dtype, next_stream: 0 };
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

    fn layer_norm(&mut self, name: &str, x: Value, gamma: Value, beta: Value) -> Result<Value, GraphError> {
        self.graph.add(name, Op::LayerNorm { eps: self.spec.layer_norm_eps }, &[x, gamma, beta])
    }

    /// Dropout with its own random stream; identity (no node) when `p` is 0.
    fn dropout(&mut self, name: &str, x: Value, p: f64) -> Result<Value, GraphError> {
        if p == 0.0 {
            return Ok(x);
        }
        let stream = self.next_stream;
        self.next_stream += 1;
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
