//! Sequence-parallel re-gathering: the backward gathers a column-parallel
//! GEMM's input again instead of keeping the whole sequence from the
//! forward.
//!
//! With sequence parallelism each `sequence_all_gather` turns the rank's
//! slice `[b, s/t, h]` into the whole sequence `[b, s, h]` for a
//! column-parallel GEMM (Q/K/V, the feed-forward up and gate, the MLM
//! decoder), and that GEMM's weight gradient `dW = Xᵀ·dY` reads the
//! gathered `X` again in the backward. Kept from the forward it is `t`
//! times the slice. Megatron-LM (Korthikanti et al., 2022; its
//! `LinearWithGradAccumulationAndAsyncCommunication`) saves only the slice
//! and all-gathers it again in the backward, overlapped with the
//! input-gradient GEMM; so does this pass: each forward gather that a backward node reads
//! is cloned into the backward (`NAME.regather`) just before its first
//! backward reader ([`crate::backward_clones`]), and the backward reads the
//! clone. The forward's gathered tensor dies after its forward readers.
//!
//! It runs after `recompute`: a gather inside a recomputed region already
//! has a backward clone (`NAME.recompute`), so the forward gather has no
//! backward reader left and is not gathered again; a recomputed region
//! that starts at a GEMM reading a gather (the feed-forward region of
//! `optimal`) has a clone of that GEMM in the backward, which reads the
//! re-gathered input like the weight gradient does.

use rustc_hash::FxHashMap;
use zeroplan_ir::{Graph, NodeIndex, Op, Phase};

use crate::backward_clones::{clone_before_backward, read_by_backward};
use crate::manager::{Pass, PassContext, PassError};

/// The `regather` pass.
pub struct Regather;

impl Pass for Regather {
    fn name(&self) -> &'static str {
        "regather"
    }

    fn run(&self, graph: Graph, cx: &mut PassContext) -> Result<Graph, PassError> {
        let order = graph.topo_order();
        // Each forward gather is a group of its own.
        let gathers: FxHashMap<NodeIndex, NodeIndex> = order
            .iter()
            .filter(|&&n| {
                let node = graph.node(n);
                node.phase == Phase::Forward && matches!(node.op, Op::SequenceAllGather { .. })
            })
            .map(|&n| (n, n))
            .collect();
        if !read_by_backward(&graph, &order, &gathers) {
            cx.stat("gathers repeated", 0);
            return Ok(graph);
        }
        let cloned = clone_before_backward(graph, &gathers, "regather", cx)
            .map_err(|error| PassError::Graph { pass: "regather", error })?;
        cx.stat("gathers repeated", cloned.groups);
        Ok(cloned.graph)
    }
}
