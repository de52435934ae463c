//! One evaluation pass: some of the graph's nodes, in topological order,
//! under one set of symbol bindings and one dropout offset.
//!
//! `evaluate` is one pass over every node; a training step is one pass per
//! micro-batch and one for the optimizer. A pass evaluates phase-free
//! sources (`param`, `state`, `fill`, `arange`) on demand, and refuses to
//! read any other value it did not compute, saying why ([`Why`]).

use crate::graph::NodeIndex;
use std::collections::HashMap;

use super::{Feeds, InterpError, Interpreter, Rounding, State, Values, bind, dispatch, nd};
use crate::graph::{Graph, Value};
use crate::op::Op;
use crate::shape::Bindings;
use crate::tensor::Tensor;

/// Why a pass is running, which decides what a missing operand means.
#[derive(Clone, Copy, Debug)]
pub(super) enum Why {
    /// `evaluate`: every node runs, in topological order.
    Evaluate,
    /// One micro-batch's forward and backward nodes.
    MicroBatch,
    /// The step's optimizer nodes.
    Optimizer { micro_batches: u64 },
}

/// One evaluation pass over some of the graph's nodes.
pub(super) struct Pass<'a> {
    interp: &'a Interpreter,
    graph: &'a Graph,
    state: &'a State,
    /// `None` in the optimizer pass, which has no micro-batch of its own.
    feeds: Option<&'a Feeds>,
    pub(super) bindings: Bindings,
    offset: u64,
    why: Why,
    pub(super) values: HashMap<NodeIndex, Vec<Tensor>>,
}

impl<'a> Pass<'a> {
    pub(super) fn new(
        interp: &'a Interpreter,
        graph: &'a Graph,
        state: &'a State,
        feeds: Option<&'a Feeds>,
        bindings: Bindings,
        offset: u64,
        why: Why,
    ) -> Pass<'a> {
        Pass { interp, graph, state, feeds, bindings, offset, why, values: HashMap::new() }
    }

    pub(super) fn into_values(self) -> Values {
        let by_name = self.values.into_iter().map(|(n, t)| (self.graph.node(n).name.to_string(), t)).collect();
        Values { by_name, bindings: self.bindings }
    }

    /// The tensor of `v`, evaluating a phase-free source on demand.
    pub(super) fn get(&mut self, v: Value) -> Result<&Tensor, InterpError> {
        if !self.values.contains_key(&v.node) {
            let node = self.graph.node(v.node);
            if !matches!(node.op, Op::Param { .. } | Op::State { .. } | Op::Fill { .. } | Op::Arange) {
                return Err(InterpError::new(&*node.name, "was read before it was evaluated"));
            }
            self.eval(v.node)?;
        }
        Ok(&self.values[&v.node][v.output as usize])
    }

    /// The `(target name, new value)` pairs of the updates whose value passes `which`.
    pub(super) fn updates(&mut self, which: impl Fn(&Value) -> bool) -> Result<Vec<(String, Tensor)>, InterpError> {
        let graph = self.graph;
        let mut out = Vec::new();
        for (target, v) in graph.updates.iter().filter(|(_, v)| which(v)) {
            out.push((graph.node(*target).name.to_string(), self.get(*v)?.clone()));
        }
        Ok(out)
    }

    /// Evaluates node `n` and stores its outputs.
    pub(super) fn eval(&mut self, n: NodeIndex) -> Result<(), InterpError> {
        let graph = self.graph;
        let node = graph.node(n);
        let fail = |m: String| InterpError::new(&*node.name, m);
        let expected = node
            .outputs
            .iter()
            .map(|t| bind::concrete_shape(&t.shape, &self.bindings).map(|s| (s, t.dtype)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let mut outs = if node.op.is_source() {
            vec![self.source(n, &expected[0].0)?]
        } else {
            let operands = graph.operands(n);
            for v in operands {
                self.require(n, *v)?;
            }
            let tensors: Vec<&Tensor> = operands.iter().map(|v| &self.values[&v.node][v.output as usize]).collect();
            let ctx = dispatch::Ctx { seed: self.interp.seed, offset: self.offset, bindings: &self.bindings };
            dispatch::apply(&node.op, &tensors, &ctx).map_err(fail)?
        };
        if outs.len() != expected.len() {
            return Err(fail(format!("computed {} outputs for {} declared types", outs.len(), expected.len())));
        }
        for (t, (shape, dtype)) in outs.iter_mut().zip(&expected) {
            if t.shape() != shape.as_slice() || t.dtype() != *dtype {
                return Err(fail(format!(
                    "computed {}{:?}, but the node's type is {dtype}{shape:?} under {}",
                    t.dtype(),
                    t.shape(),
                    bind::describe(&self.bindings)
                )));
            }
            if self.interp.rounding == Rounding::Native {
                t.round_to_dtype();
            }
        }
        self.values.insert(n, outs);
        Ok(())
    }

    /// Makes operand `v` of node `consumer` available, or says why it cannot be.
    fn require(&mut self, consumer: NodeIndex, v: Value) -> Result<(), InterpError> {
        if self.values.contains_key(&v.node) {
            return Ok(());
        }
        let producer = self.graph.node(v.node);
        if matches!(producer.op, Op::Param { .. } | Op::State { .. } | Op::Fill { .. } | Op::Arange) {
            return self.eval(v.node);
        }
        let why = match self.why {
            Why::Evaluate => "it was not evaluated first (is the topological order broken?)".to_string(),
            Why::MicroBatch => {
                format!("it is in the {} phase, which runs once after every micro-batch", producer.phase.name())
            }
            Why::Optimizer { micro_batches } => format!(
                "it is computed once per micro-batch ({} phase) and this step has {micro_batches}; \
                 accumulate it into a state",
                producer.phase.name()
            ),
        };
        Err(InterpError::new(&*self.graph.node(consumer).name, format!("reads `{}`, but {why}", producer.name)))
    }

    /// The value of source node `n` of concrete shape `shape`.
    fn source(&self, n: NodeIndex, shape: &[usize]) -> Result<Tensor, InterpError> {
        let node = self.graph.node(n);
        let fail = |m: String| InterpError::new(&*node.name, m);
        let dtype = node.outputs[0].dtype;
        let stored = |t: Option<&Tensor>, from: &str| -> Result<Tensor, InterpError> {
            let t = t.ok_or_else(|| fail(format!("has no value in the {from}")))?;
            if t.shape() != shape || t.dtype() != dtype {
                return Err(fail(format!(
                    "the {from} holds {}{:?}, but the node is {dtype}{shape:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            Ok(t.clone())
        };
        match &node.op {
            Op::Param { .. } | Op::State { .. } => stored(self.state.get(&*node.name), "state"),
            Op::Input => match self.feeds {
                Some(feeds) => stored(feeds.get(&*node.name), "feeds"),
                None => Err(fail("an input has no value in the optimizer phase of a multi-micro-batch step".into())),
            },
            Op::Arange => {
                let values = (0..shape[0] as i64).collect();
                Tensor::int(shape.to_vec(), dtype, values).map_err(|e| fail(e.0))
            }
            Op::Fill { value } => Ok(nd::full(shape.to_vec(), dtype, *value)),
            other => Err(fail(format!("{} is not a source", other.name()))),
        }
    }
}
