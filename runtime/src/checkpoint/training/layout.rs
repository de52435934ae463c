//! Which logical tensor every element of a rank's state belongs to: what
//! lets a checkpoint saved by R ranks at one ZeRO stage resume on R' ranks
//! at another.
//!
//! A program's persistent values are its param and state nodes. Without
//! data parallelism they are per parameter: `P`, `P.adam_m`, `P.adam_v`,
//! scalars such as `train.step`. The partition pass packs them into flat
//! buffers per bucket (`B.params`, `B.master`, `B.adam_m`, `B.adam_v`), each
//! recording its members (name, shape, offset) and over how many ranks it is
//! sharded. The *logical* view names every member as the per-parameter
//! program would:
//!
//! | slot | member `P` is the logical tensor |
//! |---|---|
//! | `B.master` | `P` (the fp32 master) |
//! | `B.params` | `P`, or — beside a `B.master` — the 16-bit copy of it (derived, not stored) |
//! | `B.adam_m`, `B.adam_v` | `P.adam_m`, `P.adam_v` |
//!
//! so both layouts, and any two partitionings, map onto the same logical
//! tensors. A state the step refills with a constant (a gradient
//! accumulator) holds nothing between steps and is left out.
//!
//! With tensor parallelism the ranks are `d` data × `t` tensor ranks, global
//! rank `data·t + tensor`. The slots above are one tensor rank's (the same
//! on each); its `d` data ranks' states join into that tensor rank's
//! logical tensors, and the `t` of those into the model's: a split
//! parameter and its moments side by side along the split axis without the
//! vocabulary padding ([`super::tensor_parallel`]), a replicated tensor
//! once (every tensor rank holds the same bits, which is checked).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::State;
use zeroplan_ir::spec::ModelSpec;
use zeroplan_ir::{Bindings, DType, Graph, Init, Op, Tensor};

use super::tensor_parallel::{self, Split, TensorParallel};

/// The logical tensors of a checkpoint, by their per-parameter name.
pub type Logical = BTreeMap<String, Tensor>;

/// A program's persistent values as a checkpoint records them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// One rank's param and state nodes (one tensor rank's, with tensor parallelism).
    pub slots: Vec<Slot>,
    /// The tensors split over tensor-parallel ranks; absent without them
    /// (and in the manifests of format 1, written before there were any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<TensorParallel>,
}

/// One param or state node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    pub name: String,
    /// This rank's shape (a shard's, for a sharded flat buffer).
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Refilled with a constant every step: nothing to keep between steps.
    pub transient: bool,
    pub flat: Option<Flat>,
}

/// A flat buffer: its members, and over how many ranks it is sharded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Flat {
    pub shards: usize,
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl Member {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

impl Layout {
    /// The layout of `graph`'s param and state nodes, in node order;
    /// `model` is the model `graph` trains, whose one-rank shapes say how
    /// much of a tensor-parallel split is vocabulary padding.
    pub fn of(graph: &Graph, bindings: &Bindings, model: &ModelSpec) -> Result<Layout, String> {
        let refilled: BTreeSet<_> = graph
            .updates
            .iter()
            .filter(|(_, v)| matches!(graph.node(v.node).op, Op::Fill { .. }))
            .map(|(target, _)| *target)
            .collect();
        let mut slots = Vec::new();
        for n in graph.node_indices() {
            let node = graph.node(n);
            let init = match &node.op {
                Op::Param { init } | Op::State { init } => init,
                _ => continue,
            };
            let ty = &node.outputs[0];
            let shape = ty
                .shape
                .dims()
                .iter()
                .map(|d| d.eval(bindings).map(|v| v as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("`{}` has the unbound shape {}", node.name, ty.shape))?;
            let flat = match init {
                Init::Flat { members, shards } => Some(Flat {
                    shards: *shards as usize,
                    members: members
                        .iter()
                        .map(|m| Member {
                            name: m.name.clone(),
                            shape: m.shape.iter().map(|&d| d as usize).collect(),
                            offset: m.offset as usize,
                        })
                        .collect(),
                }),
                _ => None,
            };
            slots.push(Slot {
                name: node.name.to_string(),
                shape,
                dtype: ty.dtype,
                transient: refilled.contains(&n),
                flat,
            });
        }
        let mut layout = Layout { slots, tensor_parallel: None };
        layout.tensor_parallel = layout.tensor_splits(graph, model)?;
        Ok(layout)
    }

    /// The splits of `graph`'s tensor-shard parameters (bare or as flat
    /// buffer members) and of their moments, by logical name; `None` when
    /// nothing is split.
    fn tensor_splits(&self, graph: &Graph, model: &ModelSpec) -> Result<Option<TensorParallel>, String> {
        let mut shards = BTreeMap::new();
        let mut note = |name: &str, init: &Init| {
            if let Init::TensorShard { whole, axis, ranks, .. } = init {
                shards.insert(name.to_string(), (whole.iter().map(|&d| d as usize).collect::<Vec<_>>(), *axis, *ranks));
            }
        };
        for node in graph.nodes() {
            match &node.op {
                Op::Param { init: Init::Flat { members, .. } } | Op::State { init: Init::Flat { members, .. } } => {
                    members.iter().for_each(|m| note(&m.name, &m.init))
                }
                Op::Param { init } => note(&node.name, init),
                _ => {}
            }
        }
        let Some(&(_, _, ranks)) = shards.values().next() else { return Ok(None) };
        let one_rank = forward(model, &BuildOptions::default())
            .map_err(|e| format!("model `{}` does not build: {e}", model.name))?;
        let mut splits = BTreeMap::new();
        for (name, parameter) in self.logical_names() {
            let Some((padded, axis, t)) = shards.get(&parameter) else { continue };
            let whole = one_rank.node_by_name(&parameter).and_then(|n| graph_shape(&one_rank, n)).ok_or_else(|| {
                format!("the tensor shard `{parameter}` is not a parameter of model `{}`", model.name)
            })?;
            let split = Split { axis: *axis, padded: padded.clone(), logical: whole.get(*axis).copied().unwrap_or(0) };
            if *t != ranks || split.check(ranks as usize).is_err() || split.logical_shape() != whole {
                return Err(format!(
                    "the tensor shard `{parameter}` ({padded:?} over {t} ranks along axis {axis}) is not a split of \
                     model `{}`'s {whole:?} over {ranks} ranks",
                    model.name
                ));
            }
            splits.insert(name, split);
        }
        Ok(Some(TensorParallel { ranks: ranks as usize, splits }))
    }

    /// Every logical tensor the slots hold, with the parameter it belongs
    /// to (`P` for `P`, `P.adam_m` and `P.adam_v`; itself for a scalar).
    fn logical_names(&self) -> Vec<(String, String)> {
        let mut names = Vec::new();
        for slot in self.slots.iter().filter(|s| !s.transient) {
            match &slot.flat {
                Some(flat) => {
                    for m in &flat.members {
                        let (name, derived) = self.logical(slot, m);
                        if !derived {
                            names.push((name, m.name.clone()));
                        }
                    }
                }
                None => {
                    let parameter = [".adam_m", ".adam_v"]
                        .iter()
                        .find_map(|suffix| slot.name.strip_suffix(suffix))
                        .unwrap_or(&slot.name);
                    names.push((slot.name.clone(), parameter.to_string()));
                }
            }
        }
        names
    }

    /// Checks a layout read from a manifest (input, not trusted): sizes that
    /// do not overflow, flat buffers over at least one shard, members inside
    /// their buffer and not overlapping.
    pub fn check(&self) -> Result<(), String> {
        if let Some(tp) = &self.tensor_parallel {
            for (name, split) in &tp.splits {
                split.check(tp.ranks).map_err(|m| format!("the tensor-parallel split of `{name}`: {m}"))?;
            }
        }
        for slot in &self.slots {
            let fail = |m: String| Err(format!("slot `{}`: {m}", slot.name));
            let Some(len) = slot.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
                return fail(format!("shape {:?} overflows", slot.shape));
            };
            let Some(flat) = &slot.flat else { continue };
            if slot.shape.len() != 1 || flat.shards == 0 {
                return fail(format!(
                    "a flat buffer is rank 1 over ≥ 1 shards, not {:?} over {}",
                    slot.shape, flat.shards
                ));
            }
            let Some(whole) = len.checked_mul(flat.shards) else { return fail("its size overflows".into()) };
            let mut end = 0;
            for m in &flat.members {
                let size = m.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
                match size.and_then(|n| m.offset.checked_add(n)) {
                    Some(stop) if m.offset >= end && stop <= whole => end = stop,
                    _ => {
                        return fail(format!(
                            "member `{}` at {} does not fit in order within {whole}",
                            m.name, m.offset
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The logical name of `slot`'s member `m`, and whether the slot only
    /// holds a copy of it in a narrower dtype (params beside a master).
    fn logical(&self, slot: &Slot, m: &Member) -> (String, bool) {
        let (bucket, role) = slot.name.rsplit_once('.').unwrap_or(("", slot.name.as_str()));
        match role {
            "params" => {
                let master = format!("{bucket}.master");
                (m.name.clone(), self.slots.iter().any(|s| s.name == master && s.flat.is_some()))
            }
            "master" => (m.name.clone(), false),
            role => (format!("{}.{role}", m.name), false),
        }
    }

    /// The logical tensors of `states`, global rank `r`'s state at index
    /// `r`: a sharded buffer's shards joined in data-rank order, every
    /// member cut out, and then the tensor ranks' tensors joined.
    pub fn consolidate(&self, states: &[State]) -> Result<Logical, String> {
        let Some(tp) = &self.tensor_parallel else {
            return self.consolidate_data(&states.iter().collect::<Vec<_>>());
        };
        let t = tp.ranks;
        if t == 0 || states.is_empty() || !states.len().is_multiple_of(t) {
            return Err(format!("{} rank states do not make replicas of {t} tensor ranks", states.len()));
        }
        // Tensor rank k's data ranks are global ranks k, k + t, k + 2t, …
        let per_tensor_rank: Vec<Logical> = (0..t)
            .map(|k| self.consolidate_data(&states.iter().skip(k).step_by(t).collect::<Vec<_>>()))
            .collect::<Result<_, _>>()?;
        let mut logical = Logical::new();
        for (name, first) in &per_tensor_rank[0] {
            let parts: Vec<&Tensor> = per_tensor_rank.iter().map(|l| &l[name]).collect();
            let tensor = match tp.splits.get(name) {
                Some(split) => tensor_parallel::join(&parts, split).map_err(|m| format!("`{name}`: {m}"))?,
                None => {
                    if let Some(k) = parts.iter().position(|p| *p != first) {
                        return Err(format!(
                            "`{name}` is replicated, but tensor rank {k} holds other values than tensor rank 0: \
                             the save is damaged (or the ranks diverged)"
                        ));
                    }
                    first.clone()
                }
            };
            logical.insert(name.clone(), tensor);
        }
        Ok(logical)
    }

    /// The logical tensors of one tensor rank's data ranks, data rank `r`'s
    /// state at index `r`.
    fn consolidate_data(&self, states: &[&State]) -> Result<Logical, String> {
        let mut logical = Logical::new();
        for slot in self.slots.iter().filter(|s| !s.transient) {
            let of_rank = |r: usize| {
                states
                    .get(r)
                    .and_then(|s| s.get(&slot.name))
                    .ok_or_else(|| format!("rank {r}'s shard has no `{}`", slot.name))
            };
            let Some(flat) = &slot.flat else {
                logical.insert(slot.name.clone(), of_rank(0)?.clone());
                continue;
            };
            let mut whole = Vec::new();
            for r in 0..flat.shards {
                let values = of_rank(r)?.floats().ok_or_else(|| format!("`{}` is not a float tensor", slot.name))?;
                whole.extend_from_slice(values);
            }
            for m in &flat.members {
                let (name, derived) = self.logical(slot, m);
                if derived {
                    continue;
                }
                let values = whole
                    .get(m.offset..m.offset + m.len())
                    .ok_or_else(|| format!("member `{}` ends past `{}`", m.name, slot.name))?;
                logical.insert(name, Tensor::float(m.shape.clone(), slot.dtype, values.to_vec()).map_err(|e| e.0)?);
            }
        }
        Ok(logical)
    }

    /// Global rank `rank`'s state under this layout, from the logical
    /// tensors: every problem at once (a tensor the program needs that is
    /// absent or of another shape, one the program has no place for).
    pub fn distribute(&self, logical: &Logical, rank: usize) -> Result<State, Vec<String>> {
        self.cut(logical, rank, None)
    }

    /// Global rank `rank`'s `state` with the logical tensors `given` written
    /// in (some of them: a model's weights), the rest as `state` holds them.
    /// What a process of a launched run, which holds only its own rank's
    /// state, loads weights with.
    pub fn overwrite(&self, state: &State, given: &Logical, rank: usize) -> Result<State, Vec<String>> {
        self.cut(given, rank, Some(state))
    }

    /// Rank `rank`'s state from `logical`, and from `base` what `logical`
    /// lacks (with no `base`, everything must be in `logical`).
    fn cut(&self, logical: &Logical, rank: usize, base: Option<&State>) -> Result<State, Vec<String>> {
        let Some(tp) = &self.tensor_parallel else { return self.cut_data(logical, rank, base) };
        let t = tp.ranks.max(1);
        let (mut problems, mut misfit) = (Vec::new(), Vec::new());
        let mut local = Logical::new();
        for (name, tensor) in logical {
            let Some(split) = tp.splits.get(name) else {
                local.insert(name.clone(), tensor.clone());
                continue;
            };
            if tensor.shape() != split.logical_shape() {
                misfit.push(name);
                problems.push(format!(
                    "`{name}` is {:?} in the checkpoint, the program's is {:?}",
                    tensor.shape(),
                    split.logical_shape()
                ));
                continue;
            }
            match tensor_parallel::split(tensor, split, rank % t, t) {
                Ok(shard) => {
                    local.insert(name.clone(), shard);
                }
                Err(m) => problems.push(format!("`{name}`: {m}")),
            }
        }
        match self.cut_data(&local, rank / t, base) {
            Ok(state) if problems.is_empty() => Ok(state),
            Ok(_) => Err(problems),
            Err(more) => {
                // A split tensor of the wrong shape was left out above: not "absent" as well.
                let absent = |p: &String| misfit.iter().any(|name| *p == format!("no `{name}` in the checkpoint"));
                problems.extend(more.into_iter().filter(|p| !absent(p)));
                Err(problems)
            }
        }
    }

    /// Data rank `rank`'s state of one tensor rank's logical tensors, and
    /// of `base` where given for what they lack.
    fn cut_data(&self, logical: &Logical, rank: usize, base: Option<&State>) -> Result<State, Vec<String>> {
        let mut problems = Vec::new();
        let mut used = BTreeSet::new();
        let mut state = State::new();
        let mut take = |name: &str, shape: &[usize], problems: &mut Vec<String>| match logical.get(name) {
            None if base.is_some() => None,
            None => {
                problems.push(format!("no `{name}` in the checkpoint"));
                None
            }
            Some(t) if t.shape() != shape => {
                problems.push(format!("`{name}` is {:?} in the checkpoint, the program's is {shape:?}", t.shape()));
                None
            }
            Some(t) => {
                used.insert(name.to_string());
                Some(t)
            }
        };
        for slot in self.slots.iter().filter(|s| !s.transient) {
            let kept = base.map(|b| {
                b.get(&slot.name)
                    .filter(|t| t.shape() == slot.shape)
                    .ok_or_else(|| format!("this rank's state has no `{}` of shape {:?}", slot.name, slot.shape))
            });
            let kept = match kept.transpose() {
                Ok(kept) => kept,
                Err(problem) => {
                    problems.push(problem);
                    continue;
                }
            };
            let Some(flat) = &slot.flat else {
                let value = take(&slot.name, &slot.shape, &mut problems).map(|t| in_dtype(t, slot.dtype));
                if let Some(value) = value.or_else(|| kept.cloned()) {
                    state.insert(slot.name.clone(), value);
                }
                continue;
            };
            let len: usize = slot.shape.iter().product();
            if flat.shards > 1 && rank >= flat.shards {
                problems.push(format!("`{}` is sharded over {} ranks, not {}", slot.name, flat.shards, rank + 1));
                continue;
            }
            let at = if flat.shards > 1 { rank * len } else { 0 };
            let mut whole = vec![0.0; len * flat.shards];
            if let Some(values) = kept.and_then(Tensor::floats) {
                whole[at..at + len].copy_from_slice(values);
            }
            for m in &flat.members {
                let (name, _) = self.logical(slot, m);
                let Some(values) = take(&name, &m.shape, &mut problems).and_then(Tensor::floats) else { continue };
                whole[m.offset..m.offset + m.len()].copy_from_slice(values);
            }
            let part = whole[at..at + len].to_vec();
            state.insert(slot.name.clone(), Tensor::float(slot.shape.clone(), slot.dtype, part).expect("a float slot"));
        }
        problems.extend(
            logical.keys().filter(|k| !used.contains(*k)).map(|k| format!("the checkpoint's `{k}` has no place here")),
        );
        if problems.is_empty() { Ok(state) } else { Err(problems) }
    }
}

/// The constant shape of node `n` of `graph` (a parameter's always is).
fn graph_shape(graph: &Graph, n: zeroplan_ir::NodeIndex) -> Option<Vec<usize>> {
    graph.node(n).outputs[0].shape.dims().iter().map(|d| d.as_constant().map(|v| v as usize)).collect()
}

/// `t` in `dtype` (rounded to nearest even when narrower).
fn in_dtype(t: &Tensor, dtype: DType) -> Tensor {
    match t.floats() {
        Some(values) if dtype.is_float() && dtype != t.dtype() => {
            Tensor::float(t.shape().to_vec(), dtype, values.to_vec()).expect("same shape")
        }
        _ => t.clone(),
    }
}
