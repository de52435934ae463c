//! Task heads and losses.

use super::{Builder, batch, seq};
use crate::dtype::DType;
use crate::graph::{GraphError, Value};
use crate::op::{Init, Op};
use crate::shape::{Dim, Shape, TensorType};
use crate::spec::Head;

impl Builder<'_> {
    pub(super) fn head(&mut self, x: Value) -> Result<(), GraphError> {
        match self.spec.head {
            Head::Mlm => self.mlm_head(x),
            Head::Classification { num_labels } => {
                let x = self.whole_sequence("encoder.output", x)?;
                let pooled = self.pooler(x)?;
                self.classifier(pooled, num_labels)
            }
            Head::Pooler => {
                let x = self.whole_sequence("encoder.output", x)?;
                let pooled = self.pooler(x)?;
                self.graph.set_output("sequence_output", x);
                self.graph.set_output("pooled", pooled);
                Ok(())
            }
        }
    }

    /// BERT's MLM head: dense + activation + LayerNorm at the embedding width,
    /// a decoder tied to the word embeddings, a bias; cross-entropy over the
    /// positions whose label is not -100. With sequence parallelism the
    /// transform runs on this rank's positions and the decoder's input is
    /// gathered (Megatron's order).
    fn mlm_head(&mut self, x: Value) -> Result<(), GraphError> {
        let spec = self.spec;
        let (e, v) = (spec.embedding_width(), spec.vocab_size);
        let normal = self.normal();
        let w = self.param("mlm.transform.weight", &[e, spec.hidden], normal)?;
        let b = self.param("mlm.transform.bias", &[e], Init::Zeros)?;
        let (w, b) = (self.sequence_param(w)?, self.sequence_param(b)?);
        let t = self.linear("mlm.transform", x, w, Some(b))?;
        let t = self.activation("mlm.act", t)?;
        let gamma = self.param("mlm.norm.gamma", &[e], Init::Ones)?;
        let beta = self.param("mlm.norm.beta", &[e], Init::Zeros)?;
        let t = self.layer_norm("mlm.norm", t, gamma, beta)?;
        let t = self.enter_parallel("mlm.decoder", t)?;
        // The decoder is tied to the word embeddings: the same parameter node
        // (with tensor parallelism, each rank's vocabulary shard of it).
        let columns = self.vocab_rows();
        let word = self.param("embeddings.word.weight", &[columns, e], Init::Zeros)?;
        let bias = self.sharded_param("mlm.decoder.bias", &[columns * self.t], 0, Init::Zeros)?;
        let logits = self.linear("mlm.logits", t, word, Some(bias))?;
        let rows = batch().product(&seq());
        let flat = Op::Reshape { shape: Shape(vec![rows.clone(), Dim::constant(columns)]) };
        let flat_logits = self.graph.add("mlm.logits.flat", flat, &[logits])?;
        let labels = self.token_input("labels")?;
        let flat_labels = self.graph.add("mlm.labels.flat", Op::Reshape { shape: Shape(vec![rows]) }, &[labels])?;
        let loss = self.vocab_cross_entropy(flat_logits, flat_labels, v)?;
        self.graph.set_output("logits", logits);
        self.graph.set_output("loss", loss);
        Ok(())
    }

    /// Cross-entropy of `[N, C]` logits against `[N]` labels ignoring -100;
    /// with tensor parallelism, of each rank's vocabulary columns, through
    /// the ranks' per-row statistics (the logits are never gathered).
    fn vocab_cross_entropy(&mut self, logits: Value, labels: Value, vocab: u64) -> Result<Value, GraphError> {
        let ignore_index = -100;
        if self.t == 1 {
            return self.graph.add("loss", Op::CrossEntropy { ignore_index }, &[logits, labels]);
        }
        let stats = Op::CrossEntropyStats { ranks: self.t, vocab };
        let local = self.graph.add("loss.stats", stats, &[logits, labels])?;
        let all = self.reduce_parallel("loss.stats", local)?;
        self.graph.add("loss", Op::CrossEntropyCombine { ignore_index }, &[all, labels, logits])
    }

    /// The first token's state through dense + tanh: `[batch, hidden]`.
    fn pooler(&mut self, x: Value) -> Result<Value, GraphError> {
        let h = self.spec.hidden;
        let first = self.graph.add("pooler.first_token", Op::Slice { axis: 1, start: 0, len: 1 }, &[x])?;
        let cls_shape = Shape(vec![batch(), Dim::constant(h)]);
        let cls = self.graph.add("pooler.cls", Op::Reshape { shape: cls_shape }, &[first])?;
        let normal = self.normal();
        let w = self.param("pooler.dense.weight", &[h, h], normal)?;
        let b = self.param("pooler.dense.bias", &[h], Init::Zeros)?;
        let dense = self.linear("pooler.dense", cls, w, Some(b))?;
        self.graph.add("pooler.output", Op::Tanh, &[dense])
    }

    /// Dropout + linear classifier; cross-entropy over `num_labels` classes,
    /// or mean squared error against float targets when `num_labels` is 1.
    fn classifier(&mut self, pooled: Value, num_labels: u64) -> Result<(), GraphError> {
        let h = self.spec.hidden;
        let x = self.dropout("classifier.dropout", pooled, self.spec.hidden_dropout, false)?;
        let normal = self.normal();
        let w = self.param("classifier.weight", &[num_labels, h], normal)?;
        let b = self.param("classifier.bias", &[num_labels], Init::Zeros)?;
        let logits = self.linear("classifier.logits", x, w, Some(b))?;
        let loss = if num_labels == 1 {
            let prediction =
                self.graph.add("classifier.prediction", Op::Reshape { shape: Shape(vec![batch()]) }, &[logits])?;
            let targets = self.graph.input("labels", self.float(vec![batch()]))?;
            self.graph.add("loss", Op::Mse, &[prediction, targets])?
        } else {
            let labels = self.graph.input("labels", TensorType::new(Shape(vec![batch()]), DType::I64))?;
            self.graph.add("loss", Op::CrossEntropy { ignore_index: -100 }, &[logits, labels])?
        };
        self.graph.set_output("logits", logits);
        self.graph.set_output("loss", loss);
        Ok(())
    }
}
