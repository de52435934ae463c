//! The graph's name index: each node's name to its index, for the lookups
//! passes and plan files make by name and the check that names are unique.
//!
//! It is built from the node table when first asked for ([`NameIndex::build`])
//! and kept up to date from then on: most graphs a pass builds are never
//! looked up by name, and hashing each of a tiled step's million names, pass
//! after pass, took a sixth of the CPU time of planning one.
//!
//! A slot holds the node's index alone (4 bytes); the name is the node's,
//! read through the node table to compare and, when the table grows, to
//! hash again. A map from a shared name to the index would hold 24 bytes a
//! slot: on a million-node step, at the power-of-two capacity a pass
//! reserves, 48 MiB of fresh pages per rebuilt graph rather than 8.
//!
//! Hashing is seeded per index (foldhash), not Fx: names come from plan and
//! graph files, which are untrusted, and names made to collide must not
//! make loading one quadratic; a file written offline cannot know the seed.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::graph::{Node, NodeIndex};

#[derive(Clone, Debug, Default)]
pub(crate) struct NameIndex {
    table: HashTable<NodeIndex>,
    seed: foldhash::quality::RandomState,
    /// The first node, in order, whose name an earlier node had when the
    /// index was built: the index keeps the earlier one.
    duplicate: Option<NodeIndex>,
}

impl NameIndex {
    /// The index of every node of `nodes`.
    pub(crate) fn build(nodes: &[Node]) -> NameIndex {
        let mut index = NameIndex { table: HashTable::with_capacity(nodes.len()), ..NameIndex::default() };
        for (i, node) in nodes.iter().enumerate() {
            let n = NodeIndex::new(i);
            if index.insert(nodes, &node.name, n).is_err() && index.duplicate.is_none() {
                index.duplicate = Some(n);
            }
        }
        index
    }

    /// The first node whose name an earlier node had when the index was
    /// built; a node added since under a taken name was refused.
    pub(crate) fn duplicate(&self) -> Option<NodeIndex> {
        self.duplicate
    }

    pub(crate) fn reserve(&mut self, nodes: &[Node], more: usize) {
        let seed = &self.seed;
        self.table.reserve(more, |&i| seed.hash_one(&*nodes[i.index()].name));
    }

    pub(crate) fn get(&self, nodes: &[Node], name: &str) -> Option<NodeIndex> {
        self.table.find(self.seed.hash_one(name), |&i| *nodes[i.index()].name == *name).copied()
    }

    /// Records `name` as node `index`'s, where `nodes` holds every node
    /// indexed so far; the node taking `name` already, if one does.
    pub(crate) fn insert(&mut self, nodes: &[Node], name: &str, index: NodeIndex) -> Result<(), NodeIndex> {
        let seed = &self.seed;
        let same = |&i: &NodeIndex| *nodes[i.index()].name == *name;
        match self.table.entry(seed.hash_one(name), same, |&i| seed.hash_one(&*nodes[i.index()].name)) {
            Entry::Occupied(taken) => Err(*taken.get()),
            Entry::Vacant(slot) => {
                slot.insert(index);
                Ok(())
            }
        }
    }

    /// Forgets that node `index` goes by `name`.
    pub(crate) fn remove(&mut self, name: &str, index: NodeIndex) {
        if let Ok(found) = self.table.find_entry(self.seed.hash_one(name), |&i| i == index) {
            found.remove();
        }
    }
}
