//! Token, position and segment embeddings.

use super::{Builder, seq};
use crate::dtype::DType;
use crate::graph::{GraphError, Value};
use crate::op::{Init, Op};
use crate::shape::{Shape, TensorType};
use crate::spec::{NormPlacement, PositionEncoding};

impl Builder<'_> {
    /// `[batch, seq, hidden]` embeddings of the input tokens.
    ///
    /// word (+ learned position) (+ token type), then LayerNorm (post-norm
    /// models only: Megatron-BERT has none here), dropout, and for ALBERT's
    /// factorised embeddings a projection from E to `hidden`. With sequence
    /// parallelism `[batch, seq/t, hidden]`: this rank's positions.
    pub(super) fn embeddings(&mut self) -> Result<Value, GraphError> {
        let spec = self.spec;
        let e = spec.embedding_width();
        let input_ids = self.token_input("input_ids")?;
        let normal = self.normal();
        let mut x = self.word_embeddings(input_ids)?;
        if spec.position == PositionEncoding::Learned {
            let ids = TensorType::new(Shape(vec![seq()]), DType::I64);
            let positions = self.graph.source("embeddings.position_ids", Op::Arange, ids)?;
            let positions = self.sequence_slice("embeddings.position_ids", positions, 0)?;
            let table = self.param("embeddings.position.weight", &[spec.max_position, e], normal.clone())?;
            let table = self.sequence_param(table)?;
            let pos = self.graph.add("embeddings.position", Op::Embedding, &[table, positions])?;
            x = self.graph.add("embeddings.with_position", Op::Add, &[x, pos])?;
        }
        if spec.type_vocab > 0 {
            let token_types = self.token_input("token_type_ids")?;
            let token_types = self.sequence_slice("token_type_ids", token_types, 1)?;
            let table = self.param("embeddings.token_type.weight", &[spec.type_vocab, e], normal.clone())?;
            let table = self.sequence_param(table)?;
            let types = self.graph.add("embeddings.token_type", Op::Embedding, &[table, token_types])?;
            x = self.graph.add("embeddings.with_token_type", Op::Add, &[x, types])?;
        }
        if spec.norm == NormPlacement::Post {
            let gamma = self.param("embeddings.norm.gamma", &[e], Init::Ones)?;
            let beta = self.param("embeddings.norm.beta", &[e], Init::Zeros)?;
            x = self.layer_norm("embeddings.norm", x, gamma, beta)?;
        }
        x = self.dropout("embeddings.dropout", x, spec.hidden_dropout, self.sp)?;
        if e != spec.hidden {
            let w = self.param("embeddings.project.weight", &[spec.hidden, e], normal)?;
            let b = self.param("embeddings.project.bias", &[spec.hidden], Init::Zeros)?;
            let (w, b) = (self.sequence_param(w)?, self.sequence_param(b)?);
            x = self.linear("embeddings.project", x, w, Some(b))?;
        }
        Ok(x)
    }

    /// The word embeddings of `ids`: one table, or with tensor parallelism a
    /// vocabulary shard per rank whose rows the ranks sum (each id's row is
    /// on exactly one rank; the others contribute zeros), of which each rank
    /// keeps its positions with sequence parallelism.
    fn word_embeddings(&mut self, ids: Value) -> Result<Value, GraphError> {
        let (e, normal) = (self.spec.embedding_width(), self.normal());
        let rows = self.vocab_rows();
        let table = self.sharded_param("embeddings.word.weight", &[rows * self.t, e], 0, normal)?;
        if self.t == 1 {
            return self.graph.add("embeddings.word", Op::Embedding, &[table, ids]);
        }
        let local = self.graph.add("embeddings.word.ids", Op::VocabShard { ranks: self.t, rows }, &[ids])?;
        let partial = self.graph.add("embeddings.word.partial", Op::Embedding, &[table, local])?;
        self.exit_parallel("embeddings.word", partial)
    }
}
