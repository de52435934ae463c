//! Buckets: the flat buffers ZeRO shards, communicates and updates whole.
//!
//! One bucket per layer (the name's first component, `layer3`, `embeddings`,
//! `mlm`; a tile of a large operator alone), weight-decay group and, with tensor parallelism, whether its
//! parameters are tensor shards, in the order the forward first reads its
//! parameters — so stage 3 gathers one bucket per layer, in forward order,
//! and backward reduces them in reverse. Each bucket is padded to a multiple
//! of `ranks × 128` elements, so every shard is equal and 256-byte aligned.

use std::collections::HashMap;
use zeroplan_ir::{FlatMember, Graph, Init, NodeIndex, Op};

use super::slots::Slot;

/// Elements a shard's length is a multiple of (256 bytes at 16 bits).
pub const SHARD_ALIGN: u64 = 128;

/// A flat buffer of parameters that share a layer and a weight decay.
pub(super) struct Bucket {
    pub name: String,
    /// The layer's index in forward order: stage 3 prefetches by layer.
    pub layer: usize,
    /// Indices into the slots, in member order.
    pub slots: Vec<usize>,
    pub members: Vec<FlatMember>,
    /// Padded length: a multiple of `ranks × SHARD_ALIGN`.
    pub len: u64,
    pub weight_decay: f64,
    /// A tile of a large operator (`passes::tiling`): a layer of its own.
    pub tile: bool,
}

impl Bucket {
    /// Elements the members occupy, from 0 to the end of the last.
    fn used(&self) -> u64 {
        self.members.last().map_or(0, |m| m.offset + m.len())
    }

    /// Elements of padding after the last member.
    pub fn padding(&self) -> u64 {
        self.len - self.used()
    }
}

/// The layer a parameter belongs to: `layer3.attn.q.weight` → `layer3`.
/// A tile of a large operator (`passes::tiling`) is a layer of its own, so
/// stage 3 gathers, frees and reduces it alone, one tile after another.
fn group<'a>(name: &'a str, init: &Init) -> &'a str {
    match init {
        Init::Slice { .. } => name,
        _ => name.split('.').next().unwrap_or(name),
    }
}

/// Groups `slots` into buckets for `ranks` ranks.
pub(super) fn buckets(graph: &Graph, order: &[NodeIndex], slots: &[Slot], ranks: u64) -> Vec<Bucket> {
    let mut position = vec![usize::MAX; graph.node_count()];
    for (i, n) in order.iter().enumerate() {
        position[n.index()] = i;
    }
    // Where the forward first reads each parameter (through its working
    // copy), found once a slot (a tiled step has one a tile): made again at
    // each comparison of the sort, the keys were a tenth of the pass.
    let first_use = |s: &Slot| {
        let read = s.working.unwrap_or(s.param);
        graph.users(read).iter().map(|u| position[u.index()]).min().unwrap_or(usize::MAX)
    };
    let mut keyed: Vec<(usize, usize, usize)> =
        slots.iter().enumerate().map(|(i, s)| (first_use(s), position[s.param.index()], i)).collect();
    keyed.sort_unstable();
    let by_use = keyed.into_iter().map(|(_, _, i)| i);
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut index: HashMap<(String, u64, bool), usize> = HashMap::new();
    let mut layers: HashMap<String, usize> = HashMap::new();
    for i in by_use {
        let slot = &slots[i];
        let node = graph.node(slot.param);
        let Op::Param { init } = &node.op else { unreachable!("slots hold parameters") };
        let layer = group(&node.name, init).to_string();
        // Tensor shards and replicated parameters count differently in the
        // global norm (`optimizer::norm_share`): never in one bucket.
        let sharded = init.tensor_shard_ranks().is_some();
        let key = (layer.clone(), slot.weight_decay.to_bits(), sharded);
        let next_layer = layers.len();
        let layer_index = *layers.entry(layer.clone()).or_insert(next_layer);
        let b = *index.entry(key).or_insert_with(|| {
            let suffix = if slot.weight_decay > 0.0 { "decay" } else { "no_decay" };
            let split = if sharded { ".tensor_shard" } else { "" };
            buckets.push(Bucket {
                name: format!("{layer}.{suffix}{split}"),
                layer: layer_index,
                slots: Vec::new(),
                members: Vec::new(),
                len: 0,
                weight_decay: slot.weight_decay,
                tile: matches!(init, Init::Slice { .. }),
            });
            buckets.len() - 1
        });
        let shape: Vec<u64> = node.outputs[0].shape.dims().iter().map(|d| d.as_constant().unwrap_or(0)).collect();
        let bucket = &mut buckets[b];
        let offset = bucket.used();
        bucket.members.push(FlatMember { name: node.name.to_string(), shape, offset, init: Box::new(init.clone()) });
        bucket.slots.push(i);
    }
    let unit = ranks * SHARD_ALIGN;
    for bucket in &mut buckets {
        bucket.len = bucket.used().div_ceil(unit).max(1) * unit;
    }
    buckets
}

/// The flat init of a bucket's members, this rank's `1/shards` of it.
pub(super) fn flat_init(bucket: &Bucket, shards: u64) -> Init {
    Init::Flat { members: bucket.members.as_slice().into(), shards }
}

/// A flat buffer of zeros laid out as the bucket (AdamW's moments): zeros
/// either way, but the members say which elements belong to which
/// parameter, so a checkpoint can be resharded.
pub(super) fn flat_zeros(bucket: &Bucket, shards: u64) -> Init {
    let members = bucket.members.iter().map(|m| FlatMember { init: Box::new(Init::Zeros), ..m.clone() }).collect();
    Init::Flat { members, shards }
}
