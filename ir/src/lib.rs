//! zeroplan's intermediate representations and model specs.
//!
//! - [`Graph`]: the dataflow graph of typed ops ([`Op`]), in topological order, with a
//!   verifier ([`Graph::verify`]), a stable text form ([`Graph::to_text`]) and
//!   RON files ([`Graph::to_ron`], [`Graph::from_ron`]).
//! - [`spec`]: BERT-family model specs, read from RON or a Hugging Face
//!   `config.json`, validated with errors that point into the file.
//! - [`build`]: a spec to the forward graph with its task head and loss.
//! - [`kernel`]: the kernel IR, the body of one fused row kernel (`fused` ops).
//!
//! This crate knows nothing of passes, backends or devices.

// Public items are not all documented yet: the lint is enforced crate by crate.
#![allow(missing_docs)]

pub mod build;
mod dot;
pub mod dropout_stream;
pub mod dtype;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod kernel;
mod name_index;
pub mod op;
pub mod plan;
pub mod reassemble;
mod serial;
pub mod shape;
pub mod spec;
pub mod splice;
pub mod tensor;
mod text;
mod verify;

pub use dtype::DType;
pub use graph::{Graph, GraphError, Node, NodeIndex, Phase, Place, Value};
pub use op::{FlatMember, GeluApproximation, Init, Op};
pub use serial::GraphFileError;
pub use shape::{Bindings, Dim, Shape, TensorType};
pub use tensor::{Tensor, TensorData, TensorError, to_bf16, to_f16};
pub use verify::{NodeChecks, VerifyError};
