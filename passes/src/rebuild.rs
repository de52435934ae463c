//! Copying nodes from one graph into another, mapping operands: the way
//! passes build a transformed graph without mutating the input.

use smallvec::SmallVec;
use zeroplan_ir::shape::TensorType;
use zeroplan_ir::{Graph, GraphError, NodeIndex, Op, Value};

use crate::value_table::ValueTable;

/// Old values to new values, for every node of the graph a pass rebuilds.
pub type ValueMap = ValueTable<Value>;

/// An empty graph named as `src` with room for `nodes` nodes and a quarter
/// more, and a value map with a slot for each of `src`'s nodes: a pass that
/// rebuilds a 300k-node step would otherwise move every node, touching
/// fresh pages for the moved table, and rehash every name each time the
/// tables double — and one that adds a few nodes (`regather` adds 5 %)
/// would double them once. Room not filled is address space, not memory.
pub fn rebuilt(src: &Graph, nodes: usize) -> (Graph, ValueMap) {
    let nodes = nodes + nodes / 4;
    let out = Graph::with_capacity(src.name.clone(), nodes);
    (out, ValueMap::for_graph(src))
}

/// One node's operands, or their types, on the stack: a rebuild copies
/// every node of a 300k-node step, most with at most three operands.
type Operands<T> = SmallVec<[T; 4]>;

/// Adds a copy of `src`'s node `n` to `dst` (same name, op and place, phase
/// of `dst`), with operands translated through `map`, and maps its outputs.
pub fn copy_node(src: &Graph, n: NodeIndex, dst: &mut Graph, map: &mut ValueMap) -> Result<(), GraphError> {
    let reads = src.operands(n);
    let operands: Operands<Value> = reads.iter().map(|v| map[v]).collect();
    copy_reading(src, n, reads, &operands, dst, map)
}

/// [`copy_node`] over the pass's own `operands` in place of the node's:
/// its outputs are inferred again only where an operand's type changed
/// ([`Graph::add_copy`]).
pub fn copy_node_over(
    src: &Graph,
    n: NodeIndex,
    operands: &[Value],
    dst: &mut Graph,
    map: &mut ValueMap,
) -> Result<(), GraphError> {
    copy_reading(src, n, src.operands(n), operands, dst, map)
}

/// The copy of `n`, which reads `reads` in `src`, over `operands`.
fn copy_reading(
    src: &Graph,
    n: NodeIndex,
    reads: &[Value],
    operands: &[Value],
    dst: &mut Graph,
    map: &mut ValueMap,
) -> Result<(), GraphError> {
    let was: Operands<&TensorType> = reads.iter().map(|&v| src.value_type(v)).collect();
    let node = src.node(n);
    let copy = dst
        .at_place(node.place, |dst| dst.add_copy(node.name.clone(), node.op.clone(), operands, &was, &node.outputs))?;
    map_outputs(n, copy, node.outputs.len(), map);
    Ok(())
}

/// [`copy_node`] with the pass's own `op` and `operands` in place of the
/// node's: same name, place and (for sources) declared type.
pub fn copy_node_as(
    src: &Graph,
    n: NodeIndex,
    op: Op,
    operands: &[Value],
    dst: &mut Graph,
    map: &mut ValueMap,
) -> Result<(), GraphError> {
    let node = src.node(n);
    let declared = if op.is_source() { node.outputs.to_vec() } else { Vec::new() };
    let copy = dst.at_place(node.place, |dst| dst.add_node(node.name.clone(), op, operands, declared))?;
    map_outputs(n, copy, node.outputs.len(), map);
    Ok(())
}

/// Maps each of the `outputs` outputs of `n` to the same output of `copy`.
fn map_outputs(n: NodeIndex, copy: NodeIndex, outputs: usize, map: &mut ValueMap) {
    for output in 0..outputs as u32 {
        map.insert(Value { node: n, output }, Value { node: copy, output });
    }
}

/// Re-declares `src`'s outputs in `dst` through `map`.
pub fn copy_outputs(src: &Graph, dst: &mut Graph, map: &ValueMap) {
    for (name, v) in &src.outputs {
        dst.set_output(name.clone(), map[v]);
    }
}
