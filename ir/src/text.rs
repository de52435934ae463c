//! The stable text form: one line per node, in deterministic topological order.
//!
//! ```text
//! %layer0.attn.q.mm: f32[batch, seq, 32] = matmul(%layer0.attn.norm_in, %layer0.attn.q.weight)
//! %layer0.ffn.gate, %layer0.ffn.up = split(...) {axis=2, sizes=[64, 64]}
//! ```
//! Values are `%name`, or `%name#i` for output `i` of a multi-output node.
//! Snapshot tests read this form, so changing it is a deliberate act.

use std::fmt::{self, Write};

use crate::graph::{Graph, Value};

impl Graph {
    /// How a value is written in the text form and in RON files.
    pub fn value_ref(&self, v: Value) -> String {
        let node = self.node(v.node);
        if node.outputs.len() == 1 { node.name.to_string() } else { format!("{}#{}", node.name, v.output) }
    }

    /// The graph's text form.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.write_text(&mut out).expect("writing to a String cannot fail");
        out
    }

    fn write_text(&self, out: &mut String) -> fmt::Result {
        writeln!(out, "graph {} {{", self.name)?;
        let order = self.topo_order();
        let mut phase = crate::graph::Phase::Forward;
        for n in order {
            let node = self.node(n);
            if node.phase != phase {
                phase = node.phase;
                writeln!(out, "  // {}", phase.name())?;
            }
            let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
            let ty = if types.len() == 1 { types[0].clone() } else { format!("({})", types.join(", ")) };
            write!(out, "  %{}: {} = {}", node.name, ty, node.op.name())?;
            let operands = self.operands(n);
            if !operands.is_empty() {
                let refs: Vec<String> = operands.iter().map(|v| format!("%{}", self.value_ref(*v))).collect();
                write!(out, "({})", refs.join(", "))?;
            }
            let attrs = node.op.attributes();
            if !attrs.is_empty() {
                let attrs: Vec<String> = attrs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(out, " {{{}}}", attrs.join(", "))?;
            }
            if node.place == crate::graph::Place::Host {
                out.push_str(" @host");
            }
            out.push('\n');
        }
        for (name, v) in &self.outputs {
            writeln!(out, "  output {name} = %{}", self.value_ref(*v))?;
        }
        for (target, v) in &self.updates {
            writeln!(out, "  update %{} <- %{}", self.node(*target).name, self.value_ref(*v))?;
        }
        writeln!(out, "}}")
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
