//! RON (de)serialisation of graphs.
//!
//! The file lists nodes in topological order, operands by name, so it reads
//! like the text form and diffs well. Loading rebuilds the graph through
//! [`Graph::add_node`], which re-infers every type, and then compares with the
//! types in the file: a hand-edited file that no longer type-checks is
//! rejected at the node that broke.

use serde::{Deserialize, Serialize};

use crate::graph::{Graph, Phase, Place, Value};
use crate::op::Op;
use crate::shape::TensorType;

#[derive(Serialize, Deserialize)]
struct GraphFile {
    name: String,
    nodes: Vec<NodeEntry>,
    outputs: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    updates: Vec<(String, String)>,
}

#[derive(Serialize, Deserialize)]
struct NodeEntry {
    name: String,
    op: Op,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    operands: Vec<String>,
    outputs: Vec<TensorType>,
    #[serde(default, skip_serializing_if = "is_forward")]
    phase: Phase,
    #[serde(default, skip_serializing_if = "is_device")]
    place: Place,
}

fn is_forward(phase: &Phase) -> bool {
    *phase == Phase::Forward
}

fn is_device(place: &Place) -> bool {
    *place == Place::Device
}

/// Why a RON graph could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GraphFileError {
    #[error("{0}")]
    Syntax(#[from] ron::error::SpannedError),
    #[error("node `{node}`: {message}")]
    Node { node: String, message: String },
}

impl Graph {
    /// The graph as pretty-printed RON.
    pub fn to_ron(&self) -> String {
        let pretty = ron::ser::PrettyConfig::default().depth_limit(3).compact_arrays(true);
        ron::ser::to_string_pretty(&self.to_file(), pretty).expect("graphs serialise")
    }

    /// The graph as JSON, in the same layout as the RON file.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.to_file()).expect("graphs serialise")
    }

    fn to_file(&self) -> GraphFile {
        let order = self.topo_order();
        let nodes = order
            .into_iter()
            .map(|n| {
                let node = self.node(n);
                NodeEntry {
                    name: node.name.to_string(),
                    op: node.op.clone(),
                    operands: self.operands(n).iter().copied().map(|v| self.value_ref(v)).collect(),
                    outputs: node.outputs.to_vec(),
                    phase: node.phase,
                    place: node.place,
                }
            })
            .collect();
        let outputs = self.outputs.iter().map(|(name, v)| (name.clone(), self.value_ref(*v))).collect();
        let updates =
            self.updates.iter().map(|(target, v)| (self.node(*target).name.to_string(), self.value_ref(*v))).collect();
        GraphFile { name: self.name.clone(), nodes, outputs, updates }
    }

    /// Reads a graph written by [`Graph::to_ron`].
    pub fn from_ron(text: &str) -> Result<Graph, GraphFileError> {
        Graph::from_file(ron::from_str(text)?)
    }

    fn from_file(file: GraphFile) -> Result<Graph, GraphFileError> {
        let mut graph = Graph::new(file.name);
        let node_error = |node: &str, message: String| GraphFileError::Node { node: node.to_string(), message };
        for entry in file.nodes {
            let operands = entry
                .operands
                .iter()
                .map(|r| {
                    graph
                        .resolve(r)
                        .ok_or_else(|| node_error(&entry.name, format!("operand `{r}` is not defined before it")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let declared = if entry.op.is_source() { entry.outputs.clone() } else { Vec::new() };
            graph.phase = entry.phase;
            graph.place = entry.place;
            let index = graph
                .add_node(entry.name.clone(), entry.op, &operands, declared)
                .map_err(|e| node_error(&entry.name, e.message))?;
            if *graph.node(index).outputs != *entry.outputs {
                return Err(node_error(&entry.name, "the stored types differ from the inferred ones".into()));
            }
        }
        if let Some(n) = graph.duplicate_name() {
            return Err(node_error(&graph.node(n).name, "a node of this name is defined before it".into()));
        }
        for (name, r) in file.outputs {
            let v =
                graph.resolve(&r).ok_or_else(|| node_error(&name, format!("output refers to unknown value `{r}`")))?;
            graph.set_output(name, v);
        }
        for (target, r) in file.updates {
            let t =
                graph.node_by_name(&target).ok_or_else(|| node_error(&target, "update of an unknown node".into()))?;
            let v = graph
                .resolve(&r)
                .ok_or_else(|| node_error(&target, format!("update refers to unknown value `{r}`")))?;
            graph.set_update(t, v).map_err(|e| node_error(&target, e.message))?;
        }
        graph.check_tiles().map_err(|e| node_error(&e.node, e.message))?;
        graph.phase = Phase::Forward;
        graph.place = Place::Device;
        Ok(graph)
    }

    /// Finds the value written `name` or `name#i`.
    pub fn resolve(&self, reference: &str) -> Option<Value> {
        let (name, output) = match reference.rsplit_once('#') {
            Some((name, i)) => (name, i.parse().ok()?),
            None => (reference, 0),
        };
        let node = self.node_by_name(name)?;
        let count = self.node(node).outputs.len();
        let well_formed = (output as usize) < count && (count == 1) != reference.contains('#');
        well_formed.then_some(Value { node, output })
    }
}

/// Graphs embed in other files (plans) in the layout of their own file.
impl Serialize for Graph {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_file().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Graph {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Graph, D::Error> {
        Graph::from_file(GraphFile::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}
