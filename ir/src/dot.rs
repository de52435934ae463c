//! Graphviz output: one cluster per encoder layer, parameters as ellipses,
//! each fused kernel a cluster of its body, recomputed nodes marked.
//!
//! A fused node is drawn as a cluster holding its kernel's body, one scalar
//! expression a line (its loads, the expressions, what each output
//! stores), so the graph shows what was fused. One node per kernel, not
//! one per expression: Graphviz lays out a training step of thousands of
//! nodes only so far. Nodes the `recompute` pass made (`NAME.recompute`,
//! and kernels fused from them) are filled red.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::graph::{Graph, Node};
use crate::kernel::Kernel;
use crate::op::Op;

/// Attributes of recomputed nodes and kernels, and of other kernels.
const RECOMPUTED: [(&str, &str); 3] = [("style", "filled"), ("fillcolor", "#f6d5d5"), ("color", "#c44e52")];
const KERNEL: [(&str, &str); 3] = [("style", "rounded,filled"), ("fillcolor", "#e3ecf8"), ("color", "#4c72b0")];

/// `attributes` as DOT: `sep` is `, ` in a node's list, `; ` in a cluster.
fn attributes(attributes: [(&str, &str); 3], sep: &str) -> String {
    attributes.iter().map(|(k, v)| format!("{k}={}", quote(v))).collect::<Vec<_>>().join(sep)
}

/// A DOT string. Backslashes are left alone: labels break lines with `\n`.
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\\\""))
}

/// Whether the recompute pass made `node` (or a kernel fused from such).
fn recomputed(node: &Node) -> bool {
    node.name.contains(".recompute")
}

/// The cluster of fused node `node` running `kernel`, indented by `pad`:
/// the kernel's body, one expression a line, in a node of the node's name.
fn kernel_cluster(node: &Node, kernel: &Kernel, pad: &str) -> String {
    let style = attributes(if recomputed(node) { RECOMPUTED } else { KERNEL }, "; ");
    let mut title = format!("fused {}", node.name);
    if let Some(mm) = &kernel.epilogue_of {
        title += &format!("\\nepilogue of {mm}");
    }
    // The text form less its `kernel … {` and `}` lines, left-justified.
    let text = kernel.to_text();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let body = lines[1..lines.len().saturating_sub(1)].join("\\l") + "\\l";
    let mut out = String::new();
    writeln!(out, "{pad}subgraph {} {{", quote(&format!("cluster_{}", node.name))).unwrap();
    writeln!(out, "{pad}  label={}; {style};", quote(&title)).unwrap();
    writeln!(
        out,
        "{pad}  {} [shape=box, style=filled, fillcolor=white, fontsize=8, label={}];",
        quote(&node.name),
        quote(&body)
    )
    .unwrap();
    write!(out, "{pad}}}").unwrap();
    out
}

impl Graph {
    /// The graph in Graphviz DOT. Nodes named `layerN.…` are drawn inside a
    /// cluster per layer; edges are labelled with the value's type.
    pub fn to_dot(&self) -> String {
        let order = self.topo_order();
        let mut clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut out = String::new();
        writeln!(out, "digraph {} {{", quote(&self.name)).unwrap();
        // `newrank`: dot's older ranking fails ("trouble in init_rank") on
        // training steps drawn in clusters.
        writeln!(out, "  rankdir=TB; newrank=true;\n  node [fontname=\"monospace\", fontsize=10];").unwrap();
        writeln!(out, "  label=\"blue clusters: fused kernels; red: recomputed\"; labelloc=t;").unwrap();
        for &n in &order {
            let node = self.node(n);
            let layer = node.name.split('.').next().filter(|p| p.starts_with("layer"));
            let pad = if layer.is_some() { "    " } else { "  " };
            let block = match &node.op {
                Op::Fused { kernel } => kernel_cluster(node, kernel, pad),
                op => {
                    let shape = match op {
                        Op::Param { .. } => "ellipse",
                        Op::Input | Op::Arange => "invhouse",
                        _ => "box",
                    };
                    let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
                    let label = format!("{}\\n{} : {}", node.name, op.name(), types.join(", "));
                    let style =
                        if recomputed(node) { format!(", {}", attributes(RECOMPUTED, ", ")) } else { String::new() };
                    format!("{pad}{} [shape={shape}, label={}{style}];", quote(&node.name), quote(&label))
                }
            };
            match layer {
                Some(layer) => clusters.entry(layer.to_string()).or_default().push(block),
                None => writeln!(out, "{block}").unwrap(),
            }
        }
        for (layer, blocks) in &clusters {
            writeln!(out, "  subgraph {} {{\n    label={};", quote(&format!("cluster_{layer}")), quote(layer)).unwrap();
            for block in blocks {
                writeln!(out, "{block}").unwrap();
            }
            writeln!(out, "  }}").unwrap();
        }
        for &n in &order {
            let to = self.node(n);
            for v in self.operands(n) {
                let from = self.node(v.node);
                let ty = &from.outputs[v.output as usize];
                writeln!(out, "  {} -> {} [label={}];", quote(&from.name), quote(&to.name), quote(&ty.to_string()))
                    .unwrap();
            }
        }
        out.push_str("}\n");
        out
    }
}
