//! Graphviz output: one cluster per encoder layer, parameters as ellipses.

use std::collections::BTreeMap;
use std::fmt::Write;

use petgraph::visit::EdgeRef;

use crate::graph::Graph;
use crate::op::Op;

impl Graph {
    /// The graph in Graphviz DOT. Nodes named `layerN.…` are drawn inside a
    /// cluster per layer; edges are labelled with the value's type.
    pub fn to_dot(&self) -> String {
        let order = self.topo_order().unwrap_or_else(|| self.graph.node_indices().collect());
        let mut clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut out = String::new();
        let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        writeln!(out, "digraph {} {{", quote(&self.name)).unwrap();
        writeln!(out, "  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];").unwrap();
        for &n in &order {
            let node = self.node(n);
            let shape = match node.op {
                Op::Param { .. } => "ellipse",
                Op::Input | Op::Arange => "invhouse",
                _ => "box",
            };
            let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
            let label = format!("{}\\n{} : {}", node.name, node.op.name(), types.join(", "));
            let line = format!("{} [shape={shape}, label={}];", quote(&node.name), quote(&label));
            match node.name.split('.').next().filter(|p| p.starts_with("layer")) {
                Some(layer) => clusters.entry(layer.to_string()).or_default().push(line),
                None => writeln!(out, "  {line}").unwrap(),
            }
        }
        for (layer, lines) in &clusters {
            writeln!(out, "  subgraph {} {{\n    label={};", quote(&format!("cluster_{layer}")), quote(layer)).unwrap();
            for line in lines {
                writeln!(out, "    {line}").unwrap();
            }
            writeln!(out, "  }}").unwrap();
        }
        for &n in &order {
            for e in self.graph.edges_directed(n, petgraph::Direction::Outgoing) {
                let from = self.node(e.source());
                let ty = &from.outputs[e.weight().output as usize];
                let to = &self.node(e.target()).name;
                writeln!(out, "  {} -> {} [label={}];", quote(&from.name), quote(to), quote(&ty.to_string())).unwrap();
            }
        }
        out.push_str("}\n");
        out
    }
}
