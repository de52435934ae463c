//! The plan's buffers as a rank sees them: every value's byte range in its
//! place's arena, views placed inside what they view (a shard inside its
//! flat buffer at this rank's slice). [`crate::validate::buffers`] makes
//! them from a plan, checking each.

use zeroplan_ir::{Bindings, DType, Graph, NodeIndex, Op, Place, Shape};

/// Where one tensor lives: a byte range of a place's arena, checked against
/// the arena's size when the program is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    /// The arena it lies in: the device's memory or the host's.
    pub place: Place,
    /// Its first byte, from the start of the arena.
    pub offset: usize,
    /// Elements, of `dtype`.
    pub len: usize,
    /// The elements' type, which fixes their size and how routines read them.
    pub dtype: DType,
}

impl Buf {
    /// Its size in bytes: `len` elements of `dtype`.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size_bytes() as usize
    }

    /// Whether the two byte ranges share a byte.
    pub fn overlaps(&self, other: &Buf) -> bool {
        self.place == other.place
            && self.offset < other.offset + other.bytes()
            && other.offset < self.offset + self.bytes()
            && self.bytes() > 0
            && other.bytes() > 0
    }
}

/// Why a program cannot be loaded: a buffer the plan lacks or misplaces,
/// or a node the device cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// A node no instruction can be selected for on this rank or device.
    #[error("node `{node}` ({op}): {message}")]
    Node {
        /// The node's name.
        node: String,
        /// Its op's name.
        op: &'static str,
        /// Why it cannot run.
        message: String,
    },
    /// The device itself failed to load the program (allocation, a
    /// library, a step pass), in its own words.
    #[error("{0}")]
    Device(String),
    /// A value the schedule needs has no buffer in the plan (or no bound
    /// size): the named value.
    #[error("the plan has no buffer for `{0}`: compile the plan again")]
    NoBuffer(String),
    /// A buffer or an instruction that breaks the load-time contract
    /// ([`crate::validate`]): where, and what is wrong.
    #[error("{at}: {message}")]
    Invalid {
        /// The buffer or step at fault, named by its value or node.
        at: String,
        /// What is wrong, and the fix.
        message: String,
    },
    /// A buffer that runs past the end of its arena.
    #[error(
        "the buffer of `{value}` ({offset}+{bytes} bytes) lies outside the {place} arena of {arena} bytes: \
         the plan file is corrupt or was edited: compile it again (`zeroplan compile`)"
    )]
    OutOfArena {
        /// The value whose buffer it is.
        value: String,
        /// The buffer's first byte in the arena.
        offset: u64,
        /// The buffer's size.
        bytes: u64,
        /// The arena's place, `device` or `host`.
        place: &'static str,
        /// The arena's size in bytes, as the plan gives it.
        arena: u64,
    },
}

/// This rank among the ranks of a program: `index` of the `ranks`
/// data-parallel ranks (ZeRO shards, `all_reduce` …) and `tensor` of the
/// `tensor_ranks` tensor-parallel ranks (Megatron-LM shards,
/// `tensor_all_reduce`, the vocabulary-parallel ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    /// This rank's index in its data-parallel group, in `0..ranks`: which
    /// ZeRO shard it holds.
    pub index: usize,
    /// The data-parallel ranks the program was planned for.
    pub ranks: usize,
    /// This rank's index in its tensor-parallel group, in `0..tensor_ranks`:
    /// which Megatron-LM shard it holds.
    pub tensor: usize,
    /// The tensor-parallel ranks of one model replica.
    pub tensor_ranks: usize,
}

impl Rank {
    /// Fills this rank into `graph` where the graph leaves it to the load:
    /// the stream words of the dropout sites the builder marked sharded,
    /// so each tensor rank draws its own masks there
    /// ([`zeroplan_ir::dropout_stream`], Megatron-LM's model-parallel RNG
    /// tracker). Every other choice that differs per rank (which ZeRO or
    /// Megatron-LM shard a buffer holds) is made where it is read:
    /// [`buffers`] and [`crate::select`]. Returns how many streams changed.
    pub fn specialise(self, graph: &mut Graph) -> Result<usize, String> {
        zeroplan_ir::dropout_stream::graph_for_tensor_rank(graph, self.tensor as u64, self.tensor_ranks as u64)
    }
}

/// Where a view starts inside the buffer it views; `None` where that
/// overflows (a crafted plan: [`crate::validate::buffers`] refuses it).
pub fn of_offset(of: &Buf, op: &Op, g: &Graph, n: NodeIndex, bindings: &Bindings) -> Option<usize> {
    let size = of.dtype.size_bytes() as usize;
    let skipped = match op {
        Op::Slice { axis: 0, start, .. } => {
            let shape = concrete(&g.value_type(g.operands(n)[0]).shape, bindings).unwrap_or_default();
            let row = shape.iter().skip(1).try_fold(1usize, |r, &d| r.checked_mul(d))?;
            usize::try_from(*start).ok()?.checked_mul(row)?
        }
        // Reshapes: the whole buffer.
        _ => 0,
    };
    skipped.checked_mul(size)?.checked_add(of.offset)
}

/// `shape` with its symbols bound.
pub fn concrete(shape: &Shape, bindings: &Bindings) -> Option<Vec<usize>> {
    shape.dims().iter().map(|d| d.eval(bindings).map(|v| v as usize)).collect()
}

/// The value of a `fill` node that no node reads and that updates a state:
/// the memory plan gives it its target's buffer, and it is written there
/// when its phase ends (an accumulator's zeroing).
pub fn constant_update(g: &Graph, n: NodeIndex) -> Option<f64> {
    match g.node(n).op {
        Op::Fill { value } if g.users(n).is_empty() && g.updates.iter().any(|(_, v)| v.node == n) => Some(value),
        _ => None,
    }
}
