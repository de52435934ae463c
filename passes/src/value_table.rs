//! A table keyed by a graph's values, dense by node index.
//!
//! The passes keep a figure or a new value for every value of a 300k-node
//! step (the value map of a rebuild, a value's last use in the schedule)
//! and look one up for every operand of every node. Nearly every node has
//! one output, so output 0 lives in a slot indexed by its node (no hash,
//! no probe) and the few later outputs (`split`, fused kernels) in a hash
//! map beside it.

use rustc_hash::FxHashMap;
use zeroplan_ir::{Graph, Value};

#[derive(Clone, Debug)]
pub struct ValueTable<T> {
    first: Vec<Option<T>>,
    rest: FxHashMap<Value, T>,
}

impl<T> ValueTable<T> {
    /// A table with a slot for each node of `graph`.
    pub fn for_graph(graph: &Graph) -> ValueTable<T> {
        ValueTable::with_nodes(graph.node_count())
    }

    /// A table with a slot for each of `nodes` nodes.
    pub fn with_nodes(nodes: usize) -> ValueTable<T> {
        let mut first = Vec::new();
        first.resize_with(nodes, || None);
        ValueTable { first, rest: FxHashMap::default() }
    }

    /// Sets `value`'s entry; what it held before, if anything.
    pub fn insert(&mut self, value: Value, entry: T) -> Option<T> {
        if value.output > 0 {
            return self.rest.insert(value, entry);
        }
        let at = value.node.index();
        if at >= self.first.len() {
            self.first.resize_with(at + 1, || None);
        }
        self.first[at].replace(entry)
    }

    pub fn get(&self, value: &Value) -> Option<&T> {
        if value.output > 0 {
            return self.rest.get(value);
        }
        self.first.get(value.node.index()).and_then(Option::as_ref)
    }

    pub fn contains_key(&self, value: &Value) -> bool {
        self.get(value).is_some()
    }
}

impl ValueTable<usize> {
    /// Raises `value`'s entry to at least `at` (sets it where it has none).
    pub fn raise(&mut self, value: Value, at: usize) {
        let raised = self.get(&value).map_or(at, |&e| e.max(at));
        self.insert(value, raised);
    }
}

impl<T> std::ops::Index<&Value> for ValueTable<T> {
    type Output = T;

    /// The entry of `value`, which the pass has set.
    fn index(&self, value: &Value) -> &T {
        self.get(value).unwrap_or_else(|| panic!("{value:?} has no entry"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroplan_ir::NodeIndex;

    #[test]
    fn later_outputs_and_nodes_past_the_graph_have_entries_of_their_own() {
        let mut table = ValueTable::for_graph(&Graph::new("empty"));
        let v = |node: u32, output| Value { node: NodeIndex::new(node as usize), output };
        assert_eq!(table.insert(v(3, 0), 1), None);
        assert_eq!(table.insert(v(3, 1), 2), None);
        assert_eq!(table.insert(v(3, 0), 4), Some(1));
        assert_eq!((table.get(&v(3, 0)), table[&v(3, 1)]), (Some(&4), 2));
        assert!(!table.contains_key(&v(2, 0)) && !table.contains_key(&v(9, 0)) && !table.contains_key(&v(3, 2)));
        table.raise(v(3, 1), 1);
        table.raise(v(5, 0), 7);
        assert_eq!((table[&v(3, 1)], table[&v(5, 0)]), (2, 7));
    }
}
