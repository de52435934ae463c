//! The verifier: checks that a graph is well formed and well typed.
//!
//! Run after every pass. It re-infers every node's types from its operands
//! and compares them with the stored ones, so a pass that rewires a node
//! without fixing its type is caught at the node it broke.

use rustc_hash::FxHashSet;

use crate::graph::{Graph, NodeIndex};
use crate::infer::infer;
use crate::op::Init;

/// A verification failure, naming the node and the mismatch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("node `{node}`: {message}")]
pub struct VerifyError {
    pub node: String,
    pub message: String,
}

/// The per-node part of [`Graph::verify`] over a graph's first nodes: the
/// first node whose own checks failed, if any. A caller with a core to
/// spare runs it ahead ([`Graph::check_nodes_while`]) and hands it to
/// [`Graph::verify_checked`].
#[derive(Debug, Clone)]
pub struct NodeChecks {
    /// The nodes checked: `0..checked`.
    checked: usize,
    first_failure: Option<(NodeIndex, VerifyError)>,
}

/// Nodes checked between two questions whether to go on: a few
/// milliseconds.
const CHECK_CHUNK: usize = 16_384;

impl Graph {
    /// Checks the whole graph; returns the first problem found, in
    /// topological order.
    ///
    /// Whether two nodes share a name is asked of the name index last, so
    /// a caller may build it on another thread meanwhile
    /// ([`Graph::index_names`]).
    pub fn verify(&self) -> Result<(), VerifyError> {
        self.verify_checked(NodeChecks { checked: 0, first_failure: None })
    }

    /// The per-node checks of [`Graph::verify`], a chunk of nodes at a
    /// time, asking `go_on` before each: `None` once it says stop. A
    /// planner checks a step this way while its memory plan finishes on
    /// another core, and stops when that is done rather than hold it up.
    pub fn check_nodes_while(&self, go_on: &dyn Fn() -> bool) -> Option<NodeChecks> {
        let mut checks = NodeChecks { checked: 0, first_failure: None };
        while checks.checked < self.nodes.len() {
            if !go_on() {
                return None;
            }
            let chunk = checks.checked..(checks.checked + CHECK_CHUNK).min(self.nodes.len());
            checks.checked = chunk.end;
            let failure = self.first_failure(chunk);
            if failure.is_some() {
                checks.first_failure = failure;
                break;
            }
        }
        Some(checks)
    }

    /// [`Graph::verify`], the nodes `checks` covers taken as it found them:
    /// `checks` must come from this graph, unchanged since but for nodes
    /// added after (those are checked here).
    pub fn verify_checked(&self, checks: NodeChecks) -> Result<(), VerifyError> {
        let first = checks.first_failure.or_else(|| self.first_failure(checks.checked..self.nodes.len()));
        match (first, self.duplicate_name()) {
            // Of two problems the earlier node's; at one node, its name's.
            (first, Some(d)) if first.as_ref().is_none_or(|(n, _)| d <= *n) => {
                let node = self.node(d).name.to_string();
                return Err(VerifyError { node, message: "two nodes have this name".into() });
            }
            (Some((_, error)), _) => return Err(error),
            _ => {}
        }
        let mut updated = FxHashSet::default();
        for (target, v) in &self.updates {
            let Some(node) = self.nodes.get(target.index()) else {
                return Err(VerifyError { node: self.name.clone(), message: "an update targets no node".into() });
            };
            let fail = |message: String| VerifyError { node: node.name.to_string(), message };
            if !matches!(node.op, crate::Op::Param { .. } | crate::Op::State { .. }) {
                return Err(fail("only parameters and states are updated".into()));
            }
            let value = self.nodes.get(v.node.index());
            if !updated.insert((*target, value.map(|n| n.phase))) {
                return Err(fail("updated twice in one phase".into()));
            }
            let ty = value.and_then(|n| n.outputs.get(v.output as usize));
            if ty != Some(&node.outputs[0]) {
                return Err(fail(format!("its update has another type ({ty:?})")));
            }
        }
        self.check_tiles()?;
        for (name, v) in &self.outputs {
            let exists = self.nodes.get(v.node.index()).is_some_and(|n| (v.output as usize) < n.outputs.len());
            if !exists {
                return Err(VerifyError { node: name.clone(), message: "graph output refers to no value".into() });
            }
        }
        Ok(())
    }

    /// The first of `nodes` whose own checks fail, with its error.
    fn first_failure(&self, nodes: std::ops::Range<usize>) -> Option<(NodeIndex, VerifyError)> {
        nodes.map(NodeIndex::new).find_map(|n| self.verify_node(n).err().map(|e| (n, e)))
    }

    /// The checks of one node: its name is not empty, its operands are
    /// outputs of nodes before it, and its stored types are the inferred.
    fn verify_node(&self, n: NodeIndex) -> Result<(), VerifyError> {
        let node = self.node(n);
        let fail = |message: String| VerifyError { node: node.name.to_string(), message };
        if node.name.is_empty() {
            return Err(fail("the node has no name".into()));
        }
        // An operand reads an output of a node added before: so the
        // order of addition is a topological one, and there is no cycle.
        for (i, v) in self.operands(n).iter().enumerate() {
            if v.node >= n {
                return Err(fail(format!("operand {i} reads a node added after it ({})", v.node.index())));
            }
            let source = self.node(v.node);
            if v.output as usize >= source.outputs.len() {
                return Err(fail(format!(
                    "operand {i} reads output {} of `{}`, which has {} outputs",
                    v.output,
                    source.name,
                    source.outputs.len()
                )));
            }
        }
        let operands = self.operands(n);
        let types: Vec<_> = operands.iter().map(|v| self.value_type(*v)).collect();
        let declared = if node.op.is_source() { node.outputs.to_vec() } else { Vec::new() };
        let inferred = infer(&node.op, &types, &declared).map_err(fail)?;
        if *inferred != *node.outputs {
            let show = |ts: &[crate::TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
            return Err(fail(format!(
                "stored type ({}) differs from the inferred type ({})",
                show(&node.outputs),
                show(&inferred)
            )));
        }
        Ok(())
    }
}

impl Graph {
    /// The tiles of a parameter partition its rows: all name the same
    /// whole, and their distinct row blocks cover `0..rows` without gap or
    /// overlap, as the tiling pass cuts them. Each tile's initialiser draws
    /// the whole tensor: this bounds what a plan file can make it draw by
    /// the tiles the graph itself holds.
    pub fn check_tiles(&self) -> Result<(), VerifyError> {
        let mut found = Vec::new();
        for node in &self.nodes {
            if let crate::Op::Param { init } | crate::Op::State { init } = &node.op {
                init.visit(&mut |i| {
                    if let Init::Slice { of, whole, start, len, .. } = i {
                        found.push((&**of, &**whole, *start, *len));
                    }
                });
            }
        }
        found.sort_unstable();
        found.dedup();
        for of in found.chunk_by(|a, b| a.0 == b.0) {
            let fail = |message: String| VerifyError { node: of[0].0.to_string(), message };
            let whole = of[0].1;
            if of.iter().any(|t| t.1 != whole) {
                return Err(fail("its tiles name different whole shapes".into()));
            }
            let mut end = 0;
            for &(_, _, start, len) in of {
                if start != end {
                    return Err(fail(format!("its tiles leave a gap or overlap at row {}", start.min(end))));
                }
                end = start + len;
            }
            if whole.first() != Some(&end) {
                return Err(fail(format!("its tiles cover {end} rows of {whole:?}")));
            }
        }
        Ok(())
    }
}
