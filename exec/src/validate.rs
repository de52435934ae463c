//! The load-time gate: what a plan's program must satisfy before any
//! device runs an instruction of it.
//!
//! A plan file is input like any other — `train PLAN.ron` runs the program
//! it describes, and the file may have been edited, truncated or crafted.
//! Parsing it re-infers every node's type ([`zeroplan_ir::Graph`]'s RON
//! reader), so the graph type-checks; what this module checks is that the
//! *memory* the program describes is sound on this rank, so that no
//! instruction reads or writes outside its arenas:
//!
//! - [`buffers`]: every value has exactly one planned buffer, of the bytes
//!   its dtype × shape needs (counted with checked arithmetic, so a shape
//!   whose element count overflows is refused rather than wrapped), on the
//!   place its node runs, inside that place's arena, aligned to its dtype;
//!   a view lies inside the buffer it views, and a ZeRO shard is cut for
//!   this group's rank count;
//! - [`kernel_launch`], [`matmul`]: the launch of every compiled row kernel
//!   and every GEMM reaches only the elements of the buffers it is given,
//!   and a kernel's outputs alias nothing but an input of their own shape
//!   (an in-place update), which is what its code assumes;
//! - [`live_values_apart`] (within [`buffers`]): no two values share a
//!   byte of an arena while both are live, each value's life derived from
//!   the program, not taken from the plan ([`lives`], [`collide`]).
//!
//! Instruction selection ([`crate::select`]) calls the launch checks before
//! it compiles anything, so they hold for every device (the host's
//! Cranelift kernels and GEMMs, the CUDA device's NVRTC kernels and cuBLAS
//! calls). Whatever runs concurrently (the communication stream; a GPU's
//! streams) is ordered by the byte ranges of these validated buffers; see
//! docs/runtime.md, "The load-time contract".

mod collide;
mod lives;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::plan::Program;
use zeroplan_ir::{Bindings, Graph, Init, NodeIndex, Op, Place, Value};

use crate::buffers::{Buf, Rank, SelectError, of_offset};
use crate::instr::MatMulShape;

/// What every refusal ends with: the plan is not what `compile` writes.
const FIX: &str = "the plan file is corrupt or was edited: compile it again (`zeroplan compile`)";

fn invalid(at: String, message: String) -> SelectError {
    SelectError::Invalid { at, message: format!("{message}: {FIX}") }
}

fn place_name(place: Place) -> &'static str {
    match place {
        Place::Device => "device",
        Place::Host => "host",
    }
}

/// Every value's buffer as this rank sees it (views placed inside what they
/// view), once each has been checked as the
/// module docs say and no two live at once overlap. The only way a runner
/// gets buffers to run on.
pub fn buffers(
    program: &Program,
    order: &[NodeIndex],
    bindings: &Bindings,
    rank: Rank,
) -> Result<HashMap<Value, Buf>, SelectError> {
    let g = &program.graph;
    // A plan run on the wrong number of ranks is not corrupt: say how to run it.
    if let Some(ranks) = order.iter().find_map(|&n| match g.node(n).op {
        Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks }
            if ranks as usize != rank.ranks =>
        {
            Some(ranks)
        }
        _ => None,
    }) {
        let message = format!(
            "the plan runs on {ranks} data-parallel ranks, this group has {}: load it once per rank of a group of {ranks}",
            rank.ranks
        );
        return Err(SelectError::Invalid { at: "the plan".into(), message });
    }
    inits_cut_for(g, rank)?;
    let mut planned: HashMap<&str, &zeroplan_ir::plan::Buffer> = HashMap::new();
    for b in &program.buffers {
        if planned.insert(b.value.as_str(), b).is_some() {
            return Err(invalid(format!("the buffer of `{}`", b.value), "the plan lists it twice".into()));
        }
    }
    let mut bufs: HashMap<Value, Buf> = HashMap::new();
    for &n in order {
        let node = g.node(n);
        for (i, ty) in node.outputs.iter().enumerate() {
            let v = Value { node: n, output: i as u32 };
            let name = g.value_ref(v);
            let at = || format!("the buffer of `{name}`");
            let b = planned.get(name.as_str()).ok_or_else(|| SelectError::NoBuffer(name.clone()))?;
            let len = element_count(g, v, bindings).map_err(|m| invalid(at(), m))?;
            let bytes = len
                .checked_mul(ty.dtype.size_bytes() as usize)
                .ok_or_else(|| invalid(at(), format!("{len} elements of {} overflow this host", ty.dtype)))?;
            if b.bytes != bytes as u64 {
                return Err(invalid(at(), format!("{} bytes, but {ty} takes {bytes}", b.bytes)));
            }
            if b.place != node.place {
                let (has, runs) = (place_name(b.place), place_name(node.place));
                return Err(invalid(at(), format!("it lies in the {has} arena, but its node runs on the {runs}")));
            }
            let offset = usize::try_from(b.offset)
                .map_err(|_| invalid(at(), format!("offset {} does not fit this host", b.offset)))?;
            let mut buf = Buf { place: b.place, offset, len, dtype: ty.dtype };
            if node.op.is_view() {
                let of = bufs[&g.operands(n)[0]];
                let inside = view_inside(g, n, &of, &buf, bindings).map_err(|m| invalid(at(), m))?;
                // On the same place a view is the viewed bytes; on another, a copy of them.
                if of.place == buf.place {
                    buf.offset = inside;
                }
            }
            in_arena(program, &name, &buf)?;
            // Kernels and GEMMs read a buffer as a slice of its dtype.
            if !buf.offset.is_multiple_of(ty.dtype.size_bytes() as usize) {
                let message = format!("it starts at byte {}, not a multiple of {}'s size", buf.offset, ty.dtype);
                return Err(invalid(at(), message));
            }
            bufs.insert(v, buf);
        }
    }
    live_values_apart(g, order, &bufs)?;
    Ok(bufs)
}

/// Every parameter's and state's initialiser is cut for this rank's groups:
/// a flat buffer sharded over more than one rank over the data-parallel
/// group's ranks, a tensor shard over the tensor-parallel group's. Each is
/// initialised by drawing the whole tensor and cutting this rank's part,
/// so a cut for a crafted rank count would make a rank draw that many
/// times its own memory. A plan for another group size is not corrupt:
/// the error says how to run it.
fn inits_cut_for(g: &Graph, rank: Rank) -> Result<(), SelectError> {
    /// The first cut of `init` (or of one nested in it) for another group:
    /// its group's name, its rank count and the group's.
    fn other_cut(init: &Init, rank: Rank) -> Option<(&'static str, u64, usize)> {
        let mut found = None;
        init.visit(&mut |i| {
            let cut = match i {
                Init::Flat { shards, .. } if *shards > 1 && *shards as usize != rank.ranks => {
                    Some(("data", *shards, rank.ranks))
                }
                Init::TensorShard { ranks, .. } if *ranks as usize != rank.tensor_ranks => {
                    Some(("tensor", *ranks, rank.tensor_ranks))
                }
                _ => None,
            };
            found = found.or(cut);
        });
        found
    }
    // Every node of the graph, scheduled or not: the loader initialises them all.
    for node in g.nodes() {
        if let Op::Param { init } | Op::State { init } = &node.op
            && let Some((group, cut, has)) = other_cut(init, rank)
        {
            let message = format!(
                "`{}` is cut for {cut} {group}-parallel ranks, this group has {has}: load the plan once per rank of a group of {cut}",
                node.name
            );
            return Err(SelectError::Invalid { at: "the plan".into(), message });
        }
    }
    Ok(())
}

/// Refuses two values of `bufs` that share a byte of one arena at a
/// position of `order` where both are live, each value's life derived from
/// `g` ([`lives`]); an in-place update written before a read of the value
/// it overwrites is refused too. [`buffers`] runs it on every plan.
pub fn live_values_apart(g: &Graph, order: &[NodeIndex], bufs: &HashMap<Value, Buf>) -> Result<(), SelectError> {
    collide::refuse_collisions(g, order, &lives::storages(g, order, bufs)?)
}

/// The elements of `v` under `bindings`: the product of its bound
/// dimensions, checked (a shape's own monomial product is not).
fn element_count(g: &Graph, v: Value, bindings: &Bindings) -> Result<usize, String> {
    let ty = g.value_type(v);
    ty.shape.dims().iter().try_fold(1usize, |count, d| {
        let d = d.eval(bindings).ok_or_else(|| format!("dimension `{d}` of {ty} has no value"))?;
        usize::try_from(d).ok().and_then(|d| count.checked_mul(d)).ok_or_else(|| format!("{ty} has too many elements"))
    })
}

/// Where view `n` starts inside `of`, the buffer it views, once checked to
/// lie wholly inside it (a view on another place is copied from there).
fn view_inside(g: &Graph, n: NodeIndex, of: &Buf, view: &Buf, bindings: &Bindings) -> Result<usize, String> {
    if view.dtype != of.dtype {
        return Err(format!("a {} view of a {} buffer", view.dtype, of.dtype));
    }
    let start = of_offset(of, &g.node(n).op, g, n, bindings).ok_or("its start overflows")?;
    let end = view.bytes().checked_add(start).ok_or("its end overflows")?;
    if start < of.offset || end > of.offset + of.bytes() {
        return Err(format!(
            "it views bytes {start}..{end}, outside the {}..{} it is a view of",
            of.offset,
            of.offset + of.bytes()
        ));
    }
    Ok(start)
}

/// Refuses a buffer that runs past the end of its arena (checked: a crafted
/// offset must not wrap around into it).
fn in_arena(program: &Program, value: &str, buf: &Buf) -> Result<(), SelectError> {
    let arena = match buf.place {
        Place::Device => program.arena_bytes,
        Place::Host => program.host_arena_bytes,
    };
    if (buf.offset as u64).checked_add(buf.bytes() as u64).is_none_or(|end| end > arena) {
        return Err(SelectError::OutOfArena {
            value: value.to_string(),
            offset: buf.offset as u64,
            bytes: buf.bytes() as u64,
            place: place_name(buf.place),
            arena,
        });
    }
    Ok(())
}

/// Checks that `kernel` launched over `dims` reaches only the elements of
/// `inputs` and `outputs` (each argument's extent along its axes is its
/// buffer's length, in its dtype), and that an output aliases nothing but
/// an input of its own shape and dtype (an in-place update) — the contract
/// of every device's compiled kernel.
pub fn kernel_launch(kernel: &Kernel, dims: &[usize], inputs: &[Buf], outputs: &[Buf]) -> Result<(), String> {
    if dims.len() != kernel.shape.rank() || dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() {
        return Err(format!("kernel `{}` launched over {dims:?}, not its shape {}", kernel.name, kernel.shape));
    }
    for (what, args, bufs) in [("input", &kernel.inputs, inputs), ("output", &kernel.outputs, outputs)] {
        if args.len() != bufs.len() {
            return Err(format!("kernel `{}` has {} {what}s, given {} buffers", kernel.name, args.len(), bufs.len()));
        }
        for (i, (arg, buf)) in args.iter().zip(bufs).enumerate() {
            let extent: usize = arg.axes.iter().map(|&a| dims.get(a).copied().unwrap_or(0)).product();
            if extent != buf.len || arg.ty.dtype != buf.dtype {
                return Err(format!(
                    "kernel `{}` {what} {i} ({}) reaches {extent} elements of {}, its buffer holds {} of {}",
                    kernel.name, arg.name, arg.ty.dtype, buf.len, buf.dtype
                ));
            }
        }
    }
    for (o, out) in outputs.iter().enumerate() {
        let in_place = |b: &Buf| b == out;
        if let Some(i) = inputs.iter().position(|b| b.overlaps(out) && !in_place(b)) {
            return Err(format!("kernel `{}` output {o} overlaps input {i} without being it", kernel.name));
        }
        if let Some(p) = outputs[..o].iter().position(|b| b.overlaps(out)) {
            return Err(format!("kernel `{}` outputs {p} and {o} overlap", kernel.name));
        }
    }
    Ok(())
}

/// Checks that the GEMMs of `shape` read only `a`'s and `b`'s elements and
/// write only `out`'s: every batch's matrices lie inside their buffers.
pub fn matmul(shape: &MatMulShape, a: &Buf, b: &Buf, out: &Buf) -> Result<(), String> {
    let reach = |count: Option<usize>, rows: usize, cols: usize| count?.checked_mul(rows)?.checked_mul(cols);
    let highest = |pick: fn(&(usize, usize)) -> usize| shape.batches.iter().map(pick).max().map(|i| i + 1);
    let (m, n, k) = (shape.m, shape.n, shape.k);
    for (what, need, buf) in [
        ("left operand", reach(highest(|p| p.0).or(Some(0)), m, k), a),
        ("right operand", reach(highest(|p| p.1).or(Some(0)), k, n), b),
        ("product", reach(Some(shape.batches.len()), m, n), out),
    ] {
        match need {
            Some(need) if need <= buf.len => {}
            _ => return Err(format!("the GEMM's {what} reaches past its buffer of {} elements", buf.len)),
        }
    }
    Ok(())
}
