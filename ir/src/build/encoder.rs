//! Encoder layers: self-attention and feed-forward blocks.

use super::{Builder, batch, seq};
use crate::graph::{GraphError, Value};
use crate::op::{Init, Op};
use crate::shape::{Dim, Shape};
use crate::spec::{FeedForward, NormPlacement, PositionEncoding};

impl Builder<'_> {
    /// All layers, then the final LayerNorm of pre-norm models.
    pub(super) fn encoder(&mut self, mut x: Value) -> Result<Value, GraphError> {
        let mask = self.token_input("attention_mask")?;
        for l in 0..self.spec.layers {
            x = self.attention_block(l, x, mask)?;
            x = self.feed_forward_block(l, x)?;
        }
        if self.spec.norm == NormPlacement::Pre {
            let h = self.spec.hidden;
            let gamma = self.param("encoder.norm.gamma", &[h], Init::Ones)?;
            let beta = self.param("encoder.norm.beta", &[h], Init::Zeros)?;
            x = self.layer_norm("encoder.norm", x, gamma, beta)?;
        }
        Ok(x)
    }

    /// A LayerNorm of layer `l` named `name` with parameters `slot.gamma/beta`.
    fn layer_norm_of(&mut self, l: u64, slot: &str, name: &str, x: Value) -> Result<Value, GraphError> {
        let h = self.spec.hidden;
        let gamma = self.layer_vector(l, &format!("{slot}.gamma"), h, Init::Ones, false)?;
        let beta = self.layer_vector(l, &format!("{slot}.beta"), h, Init::Zeros, false)?;
        self.layer_norm(name, x, gamma, beta)
    }

    /// Layer `l`'s column-parallel dense projection `slot`: `[in] → [out]`
    /// with bias, each tensor rank computing `out/t` of the outputs.
    fn column_linear(&mut self, l: u64, slot: &str, x: Value, out: u64, inp: u64) -> Result<Value, GraphError> {
        let w = self.layer_weight(l, slot, out, inp, Some(0))?;
        let b = self.layer_vector(l, &format!("{slot}.bias"), out, Init::Zeros, true)?;
        self.linear(&format!("layer{l}.{slot}"), x, w, Some(b))
    }

    /// Layer `l`'s row-parallel dense projection `slot`: each tensor rank
    /// multiplies its `in/t` inputs, the partial products are summed over
    /// the ranks, then the (replicated) bias is added. With sequence
    /// parallelism each rank keeps its slice of the sum, and adds the bias
    /// to that.
    fn row_linear(&mut self, l: u64, slot: &str, x: Value, out: u64, inp: u64) -> Result<Value, GraphError> {
        let w = self.layer_weight(l, slot, out, inp, Some(1))?;
        let b = self.layer_vector(l, &format!("{slot}.bias"), out, Init::Zeros, false)?;
        let b = self.sequence_param(b)?;
        let name = format!("layer{l}.{slot}");
        let product = self.linear(&format!("{name}.mm"), x, w, None)?;
        let summed = self.exit_parallel(&name, product)?;
        self.graph.add(name, Op::Add, &[summed, b])
    }

    /// Multi-head self-attention with its residual (and norm).
    fn attention_block(&mut self, l: u64, x: Value, mask: Value) -> Result<Value, GraphError> {
        let spec = self.spec;
        // This tensor rank's heads and their width.
        let (h, heads, dh) = (spec.hidden, spec.heads / self.t, spec.head_dim());
        let local = heads * dh;
        let p = format!("layer{l}.attn");
        let input = match spec.norm {
            NormPlacement::Pre => self.layer_norm_of(l, "attn.norm_in", &format!("{p}.norm_in"), x)?,
            NormPlacement::Post => x,
        };
        let input = self.enter_parallel(&p, input)?;
        let split = |b: &mut Self, which: &str| -> Result<Value, GraphError> {
            let projected = b.column_linear(l, &format!("attn.{which}"), input, h, h)?;
            let shape = Shape(vec![batch(), seq(), Dim::constant(heads), Dim::constant(dh)]);
            let heads_last = b.graph.add(format!("{p}.{which}.heads"), Op::Reshape { shape }, &[projected])?;
            b.graph.add(format!("{p}.{which}.bhsd"), Op::Transpose { perm: vec![0, 2, 1, 3] }, &[heads_last])
        };
        let q = split(self, "q")?;
        let k = split(self, "k")?;
        let v = split(self, "v")?;
        let scores_op = Op::MatMul { transpose_a: false, transpose_b: true };
        let mut s = self.graph.add(format!("{p}.scores"), scores_op, &[q, k])?;
        s = self.graph.add(format!("{p}.scaled"), Op::Scale { factor: 1.0 / (dh as f64).sqrt() }, &[s])?;
        if spec.position == PositionEncoding::Alibi {
            s = self.graph.add(format!("{p}.alibi"), Op::AlibiBias { ranks: self.t }, &[s])?;
        }
        s = self.graph.add(format!("{p}.masked"), Op::AttentionMask, &[s, mask])?;
        let mut probs = self.graph.add(format!("{p}.probs"), Op::Softmax, &[s])?;
        probs = self.dropout(&format!("{p}.probs_dropout"), probs, spec.attention_dropout, true)?;
        let pv = Op::MatMul { transpose_a: false, transpose_b: false };
        let context = self.graph.add(format!("{p}.context"), pv, &[probs, v])?;
        let bshd = self.graph.add(format!("{p}.context.bshd"), Op::Transpose { perm: vec![0, 2, 1, 3] }, &[context])?;
        let merged_shape = Shape(vec![batch(), seq(), Dim::constant(local)]);
        let merged = self.graph.add(format!("{p}.context.merged"), Op::Reshape { shape: merged_shape }, &[bshd])?;
        let out = self.row_linear(l, "attn.out", merged, h, h)?;
        let out = self.dropout(&format!("{p}.out_dropout"), out, spec.hidden_dropout, self.sp)?;
        self.residual(l, "attn", x, out)
    }

    /// The feed-forward block (MLP or GLU) with its residual (and norm).
    ///
    /// The GLU follows MosaicBERT: dropout on the gated product before the
    /// down projection, none after it. The MLP follows BERT: dropout after
    /// the down projection.
    fn feed_forward_block(&mut self, l: u64, x: Value) -> Result<Value, GraphError> {
        let spec = self.spec;
        let (h, i) = (spec.hidden, spec.intermediate);
        let p = format!("layer{l}.ffn");
        let input = match spec.norm {
            NormPlacement::Pre => self.layer_norm_of(l, "ffn.norm_in", &format!("{p}.norm_in"), x)?,
            NormPlacement::Post => x,
        };
        let input = self.enter_parallel(&p, input)?;
        let out = match spec.feed_forward {
            FeedForward::Mlp => {
                let up = self.column_linear(l, "ffn.up", input, i, h)?;
                let act = self.activation(&format!("{p}.act"), up)?;
                let down = self.row_linear(l, "ffn.down", act, h, i)?;
                self.dropout(&format!("{p}.dropout"), down, spec.hidden_dropout, self.sp)?
            }
            FeedForward::Glu => {
                let wg = self.layer_weight(l, "ffn.gate", i, h, Some(0))?;
                let gate = self.linear(&format!("{p}.gate"), input, wg, None)?;
                let wu = self.layer_weight(l, "ffn.up", i, h, Some(0))?;
                let up = self.linear(&format!("{p}.up"), input, wu, None)?;
                let act = self.activation(&format!("{p}.act"), gate)?;
                let glu = self.graph.add(format!("{p}.glu"), Op::Mul, &[act, up])?;
                let glu = self.dropout(&format!("{p}.dropout"), glu, spec.hidden_dropout, true)?;
                self.row_linear(l, "ffn.down", glu, h, i)?
            }
        };
        self.residual(l, "ffn", x, out)
    }

    /// `x + f(x)`, normalised after the sum in post-norm models.
    fn residual(&mut self, l: u64, block: &str, x: Value, fx: Value) -> Result<Value, GraphError> {
        let sum = self.graph.add(format!("layer{l}.{block}.residual"), Op::Add, &[x, fx])?;
        match self.spec.norm {
            NormPlacement::Post => {
                self.layer_norm_of(l, &format!("{block}.norm"), &format!("layer{l}.{block}.norm"), sum)
            }
            NormPlacement::Pre => Ok(sum),
        }
    }
}
