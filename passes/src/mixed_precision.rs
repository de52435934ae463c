//! Mixed precision: fp32 master weights behind 16-bit working copies.
//!
//! The forward graph is built in the compute dtype (bf16 or f16). This pass
//! makes every parameter an f32 master weight and inserts one `cast` to the
//! compute dtype, named `PARAM.bf16`, that every former user reads. The
//! optimizer updates the master weight; the working copy is what the
//! forward and backward compute with. Graphs already in f32 are returned
//! unchanged.

use zeroplan_ir::{DType, Graph, GraphError, Op, TensorType};

use crate::rebuild::{copy_node, copy_outputs, rebuilt};

/// `forward` with f32 master weights and 16-bit working copies.
pub fn master_weights(forward: &Graph) -> Result<Graph, GraphError> {
    let order = forward.topo_order();
    let (mut out, mut map) = rebuilt(forward, forward.node_count());
    for n in order {
        let node = forward.node(n);
        let compute = node.outputs[0].dtype;
        match &node.op {
            Op::Param { init } if compute != DType::F32 => {
                let master = TensorType::new(node.outputs[0].shape.clone(), DType::F32);
                let param = out.param(node.name.clone(), master, init.clone())?;
                let working = out.add(format!("{}.{compute}", node.name), Op::Cast { to: compute }, &[param])?;
                map.insert(zeroplan_ir::Value { node: n, output: 0 }, working);
            }
            _ => copy_node(forward, n, &mut out, &mut map)?,
        }
    }
    copy_outputs(forward, &mut out, &map);
    Ok(out)
}
