//! Per-layer weights under each [`Sharing`] scheme.
//!
//! The encoder asks for "layer l's `attn.q` weight"; this file decides which
//! parameter nodes answer. Sharing is nothing but graph structure: several
//! layers reading one parameter node, or a layer's weight computed from a
//! shared bank by ordinary ops.

use super::Builder;
use crate::graph::{GraphError, Value};
use crate::op::{Init, Op};
use crate::shape::{Dim, Shape};
use crate::spec::Sharing;

impl Builder<'_> {
    /// The prefix of layer `l`'s own parameters: `layer3` or, when layers are
    /// shared in groups, `group0`.
    fn param_prefix(&self, l: u64) -> String {
        match self.spec.sharing {
            Sharing::CrossLayer { groups } => format!("group{}", l * groups / self.spec.layers),
            Sharing::Independent | Sharing::TemplateBank { .. } => format!("layer{l}"),
        }
    }

    /// Layer `l`'s weight matrix `slot` (e.g. `attn.q`), `[out, in]`;
    /// split along `split` over the tensor-parallel ranks when given.
    ///
    /// With a template bank, `W_l = reshape(α_l @ T)` where `T` is the bank
    /// `[templates, out·in]` shared by all layers and `α_l` `[1, templates]`
    /// is layer l's learned mixing row, initialised N(0, 1/templates) so that
    /// `W_l` starts with the spread of an ordinary weight.
    pub(super) fn layer_weight(
        &mut self,
        l: u64,
        slot: &str,
        out: u64,
        inp: u64,
        split: Option<usize>,
    ) -> Result<Value, GraphError> {
        match self.spec.sharing {
            Sharing::Independent | Sharing::CrossLayer { .. } => {
                let name = format!("{}.{slot}.weight", self.param_prefix(l));
                let init = self.normal();
                match split {
                    Some(axis) => self.sharded_param(&name, &[out, inp], axis, init),
                    None => self.param(&name, &[out, inp], init),
                }
            }
            // `check_tensor_parallel` refuses banks with more than one rank.
            Sharing::TemplateBank { templates } => {
                let init = self.normal();
                let bank = self.param(&format!("bank.{slot}.templates"), &[templates, out * inp], init)?;
                let mixing = Init::Normal { std: 1.0 / (templates as f64).sqrt() };
                let alpha = self.param(&format!("layer{l}.{slot}.mixing"), &[1, templates], mixing)?;
                let mm = Op::MatMul { transpose_a: false, transpose_b: false };
                let flat = self.graph.add(format!("layer{l}.{slot}.weight.flat"), mm, &[alpha, bank])?;
                let shape = Shape(vec![Dim::constant(out), Dim::constant(inp)]);
                self.graph.add(format!("layer{l}.{slot}.weight"), Op::Reshape { shape }, &[flat])
            }
        }
    }

    /// Layer `l`'s vector parameter `slot.name` (a bias, a norm's gamma or
    /// beta), split over the tensor-parallel ranks when `split`.
    pub(super) fn layer_vector(
        &mut self,
        l: u64,
        slot: &str,
        len: u64,
        init: Init,
        split: bool,
    ) -> Result<Value, GraphError> {
        let name = format!("{}.{slot}", self.param_prefix(l));
        if split { self.sharded_param(&name, &[len], 0, init) } else { self.param(&name, &[len], init) }
    }
}
