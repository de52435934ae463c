//! What the search's choices share, compiled once per search.
//!
//! The passes through `training-step` depend on the model, the training
//! spec, the tensor-parallel layout, the tile count and the shape hint the
//! `rewrite` pass costs its merges at — not on the ZeRO stage, the offload
//! or the recomputation policy. The search tries 24 of those for each
//! layout (4 ZeRO stages and offloads × 3 policies, twice with an NVMe
//! tier), so each choice's short stacks resume from the shared graph
//! ([`Shared::prefix`]) instead of building and differentiating the model
//! again. A deep model compiled whole does not: copying its graph cost more
//! than compiling it ([`super::evaluate::Step::compile`]).
//!
//! Where `selective` recomputes nothing (the `attention` pass fused the
//! region it would recompute), the `recompute` pass returns its input and a
//! `selective` choice is its `none` twin's plan under another name: the
//! search plans the twin once ([`Shared::selective_is_none`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use zeroplan_ir::Graph;
use zeroplan_ir::spec::{ModelSpec, TrainingSpec};

use super::PlanError;
use crate::manager::PassOptions;
use crate::pipeline::{Resume, Target, compile_between};
use crate::recompute::Policy;

/// The last pass whose output every choice of a layout shares.
pub const SHARED_THROUGH: &str = "training-step";

/// The graphs the choices of one search share, keyed by what they depend
/// on. Cloning shares the store; [`super::plan`] starts each plan with an
/// empty one.
#[derive(Clone, Default)]
pub struct Shared {
    prefixes: Arc<Mutex<HashMap<Key, Arc<Graph>>>>,
    selective: Arc<Mutex<HashMap<Key, bool>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.prefixes.lock().map_or(0, |p| p.len());
        write!(f, "Shared {{ {entries} graphs }}")
    }
}

/// What the passes through [`SHARED_THROUGH`] read: the model and training
/// spec (as their debug text: both hold floats, so neither hashes), the
/// tensor-parallel ranks, sequence parallelism, tiles and the shape hint.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    model: String,
    train: String,
    tensor_parallel: Option<u64>,
    sequence_parallel: bool,
    tiles: Option<u64>,
    hint: Vec<(String, u64)>,
}

impl Key {
    fn of(model: &ModelSpec, train: &TrainingSpec, options: &PassOptions) -> Key {
        Key {
            model: format!("{model:?}"),
            train: format!("{train:?}"),
            tensor_parallel: options.tensor_parallel,
            sequence_parallel: options.sequence_parallel,
            tiles: options.tiles,
            hint: options.shape_hint.iter().map(|(s, v)| (s.clone(), *v)).collect(),
        }
    }
}

fn compile_error(e: impl std::fmt::Display) -> PlanError {
    PlanError::Compile(e.to_string())
}

impl Shared {
    /// `model`'s training step through [`SHARED_THROUGH`] under `options`,
    /// compiled on first use. Two threads asking at once may both compile
    /// it (the same graph; one is kept): cheaper than making one wait.
    pub fn prefix(
        &self,
        model: &ModelSpec,
        train: &TrainingSpec,
        options: &PassOptions,
    ) -> Result<Arc<Graph>, PlanError> {
        let key = Key::of(model, train, options);
        if let Some(graph) = self.prefixes.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(graph.clone());
        }
        let target = Target::Training(train);
        let graph = compile_between(model, &target, options.clone(), Resume::Build, Some(SHARED_THROUGH))
            .map_err(compile_error)?
            .graph;
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|e| e.into_inner());
        Ok(prefixes.entry(key).or_insert_with(|| Arc::new(graph)).clone())
    }

    /// The graphs compiled so far, taken out of the store: the planner
    /// frees them off its critical path (100T on 4,096 H200s: 60 ms of
    /// the main thread's end, the prefixes its probes resumed from).
    pub fn take_graphs(&self) -> Vec<Arc<Graph>> {
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|e| e.into_inner());
        prefixes.drain().map(|(_, graph)| graph).collect()
    }

    /// Whether the `recompute` pass under `selective` leaves the shared
    /// graph of `options` as it is, so that a `selective` choice plans as
    /// its `none` twin.
    pub fn selective_is_none(
        &self,
        model: &ModelSpec,
        train: &TrainingSpec,
        options: &PassOptions,
    ) -> Result<bool, PlanError> {
        let key = Key::of(model, train, options);
        if let Some(&same) = self.selective.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(same);
        }
        let prefix = self.prefix(model, train, options)?;
        let options = PassOptions { recompute: Policy::Selective, ..options.clone() };
        let from = Resume::After { graph: Box::new((*prefix).clone()), after: SHARED_THROUGH };
        let target = Target::Training(train);
        let recomputed = compile_between(model, &target, options, from, Some("recompute")).map_err(compile_error)?;
        // The pass adds the clones it recomputes, and returns its input when it makes none.
        let same = recomputed.graph.node_count() == prefix.node_count();
        self.selective.lock().unwrap_or_else(|e| e.into_inner()).insert(key, same);
        Ok(same)
    }
}
