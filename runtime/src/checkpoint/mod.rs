//! Checkpoints and batch files in Hugging Face's safetensors format.
//!
//! [`load_weights`] fills a graph's parameters from a `model.safetensors` as
//! Hugging Face writes it (`BertModel`, `BertForMaskedLM`, ALBERT and
//! Megatron-BERT names; see [`names`]), converting each tensor to the
//! parameter's dtype; [`save_weights`] writes them back under the same names,
//! so the file loads in `transformers`. Models with no Hugging Face layout
//! here (MosaicBERT, template banks) are saved and loaded under zeroplan's own
//! parameter names.
//!
//! Loading is strict: a tensor the model needs but the file lacks, a tensor
//! the model has no place for, and a tensor of the wrong shape are all errors,
//! listed together. Two exceptions follow Hugging Face's fine-tuning practice:
//! the task head's parameters (`mlm.*`, `pooler.*`, `classifier.*`) may be
//! absent, and stay at their initial values ([`LoadReport::initialised`]);
//! and a head the graph does not have may be present, and is skipped
//! ([`LoadReport::ignored`]), as are buffers (`position_ids`), the MLM decoder
//! weight (tied to the word embeddings) and pre-training heads.
//! [`load_weights_with`] can also replace a head of another shape — a
//! classifier over another label count, when fine-tuning starts from another
//! task's checkpoint ([`LoadReport::replaced`]).
//!
//! Batch files ([`load_batch`], [`save_batch`]) hold a step's inputs by name.
//! [`training`] saves and resumes whole training runs, sharded per rank.

mod batch;
pub mod names;
mod safetensors_io;
pub mod training;

pub use batch::{BATCH_TENSORS, load_batch, save_batch};
pub use names::Family;

use names::{HfName, candidates, from_hf, is_head, is_ignored};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use zeroplan_ir::spec::ModelSpec;
use zeroplan_ir::{DType, Graph, Tensor};

/// A model's parameter values, by our parameter name.
pub type Weights = BTreeMap<String, Tensor>;

/// What [`load_weights`] did with each tensor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Our parameters set from the file, in graph order.
    pub loaded: Vec<String>,
    /// Task-head parameters the file lacks, left at their value in `weights`.
    pub initialised: Vec<String>,
    /// Task-head parameters whose tensor in the file has another shape, left
    /// at their value in `weights` ([`HeadShapes::Replace`]).
    pub replaced: Vec<String>,
    /// Tensors of the file (by their names there) skipped on purpose: buffers,
    /// the tied decoder weight, second names of a loaded tensor, heads the
    /// graph does not have.
    pub ignored: Vec<String>,
}

/// What loading does with a task-head tensor whose shape is not the graph's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadShapes {
    /// An error, as for every other tensor.
    Strict,
    /// The head is replaced: the tensor is skipped and the parameter keeps its
    /// value in the weights, as `transformers`' `ignore_mismatched_sizes` does
    /// when fine-tuning from another task's checkpoint (MNLI's three labels
    /// before RTE's two).
    Replace,
}

/// Why a checkpoint or batch could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("could not {doing} {}: {source}{}", path.display(), io_hint(doing, source))]
    Io {
        path: PathBuf,
        /// `read` or `write`.
        doing: &'static str,
        source: std::io::Error,
    },
    #[error(
        "{} is not a readable safetensors file: {reason}. It may be truncated or corrupt: download or save it again",
        path.display()
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0}")]
    Mismatch(Box<Mismatch>),
    #[error(
        "the weights do not fit graph `{graph}`:\n{}\nhow to fix: give a value of the graph's shape for every parameter \
         (build the graph and the weights from the same spec)",
        bullets(problems)
    )]
    Weights { graph: String, problems: Vec<String> },
    #[error(
        "graph `{graph}` cannot be saved or loaded under {layout}:\n{}\nhow to fix: build the graph from the spec \
         passed with it",
        bullets(problems)
    )]
    Graph { graph: String, layout: &'static str, problems: Vec<String> },
    #[error("{}: {message}", path.display())]
    Training { path: PathBuf, message: String },
    #[error("{} is not a usable batch:\n{}\nhow to fix: {}", path.display(), bullets(problems), batch::HOW_TO_FIX)]
    Batch { path: PathBuf, problems: Vec<String> },
}

fn io_hint(doing: &str, source: &std::io::Error) -> &'static str {
    match (doing, source.kind()) {
        ("write", std::io::ErrorKind::NotFound) => " (does its directory exist?)",
        _ => "",
    }
}

fn bullets(lines: &[String]) -> String {
    lines.iter().map(|l| format!("  - {l}")).collect::<Vec<_>>().join("\n")
}

/// A checkpoint whose tensors do not fit the model: every problem at once.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub path: PathBuf,
    pub model: String,
    pub family: Family,
    /// The base-model prefix the file was read with (`bert.`), or empty.
    pub prefix: String,
    /// Tensors the model needs that the file lacks.
    pub missing: Vec<Missing>,
    /// Tensors of the file the model has no place for.
    pub unexpected: Vec<Found>,
    /// Tensors whose shape differs from the parameter's.
    pub wrong_shape: Vec<WrongShape>,
    /// Tensors of a dtype that cannot be read as weights.
    pub wrong_dtype: Vec<Found>,
}

/// A tensor the model needs: its name in the file, our name, its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Missing {
    pub name: String,
    pub param: String,
    pub expected: Vec<usize>,
}

/// A tensor of the file as found there.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WrongShape {
    pub name: String,
    pub param: String,
    pub expected: Vec<usize>,
    pub found: Vec<usize>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let under =
            if self.prefix.is_empty() { String::new() } else { format!(", base model under `{}`", self.prefix) };
        writeln!(
            f,
            "{} does not fit model `{}` (read with {}{under}):",
            self.path.display(),
            self.model,
            self.family.describe()
        )?;
        if !self.missing.is_empty() {
            writeln!(f, "  missing ({}):", self.missing.len())?;
            for m in &self.missing {
                writeln!(f, "    {}: expected {:?}{}", m.name, m.expected, param_note(&m.name, &m.param))?;
            }
        }
        if !self.unexpected.is_empty() {
            writeln!(f, "  unexpected ({}):", self.unexpected.len())?;
            for u in &self.unexpected {
                writeln!(f, "    {}: {} {:?}", u.name, u.dtype, u.shape)?;
            }
        }
        if !self.wrong_shape.is_empty() {
            writeln!(f, "  wrong shape ({}):", self.wrong_shape.len())?;
            for s in &self.wrong_shape {
                let note = param_note(&s.name, &s.param);
                writeln!(f, "    {}: expected {:?}, found {:?}{note}", s.name, s.expected, s.found)?;
            }
        }
        if !self.wrong_dtype.is_empty() {
            writeln!(f, "  not a float tensor ({}):", self.wrong_dtype.len())?;
            for d in &self.wrong_dtype {
                writeln!(f, "    {}: {} {:?} (weights are read from F32, F16, BF16 or F64)", d.name, d.dtype, d.shape)?;
            }
        }
        write!(f, "how to fix: ")?;
        if self.family == Family::Native && !self.missing.is_empty() && !self.unexpected.is_empty() {
            write!(
                f,
                "this model has no Hugging Face layout, so it is read under zeroplan's own parameter names, as \
                 save_weights writes them; load a checkpoint zeroplan saved, or "
            )?;
        }
        write!(
            f,
            "use a spec that matches the checkpoint (its Hugging Face config.json can be given as the spec): \
             layers, widths, vocab_size, max_position, type_vocab and the family's structure must agree"
        )?;
        if !self.wrong_dtype.is_empty() {
            write!(f, "; weights must be stored as floats")?;
        }
        Ok(())
    }
}

/// Our parameter's name, where the file's name differs from it.
fn param_note(name: &str, param: &str) -> String {
    if name == param { String::new() } else { format!(" (parameter `{param}`)") }
}

/// One parameter of the graph with the names it may have in a file.
struct Param {
    name: String,
    shape: Vec<usize>,
    dtype: DType,
    names: Vec<HfName>,
}

/// The graph's parameters, each with its shape and its names in `family`.
fn params_of(graph: &Graph, family: Family) -> Result<Vec<Param>, CheckpointError> {
    let mut params = Vec::new();
    let mut problems = Vec::new();
    for index in graph.params() {
        let node = graph.node(index);
        let ty = &node.outputs[0];
        let shape: Option<Vec<usize>> = ty.shape.0.iter().map(|d| d.as_constant().map(|n| n as usize)).collect();
        let names = candidates(family, &node.name);
        match shape {
            None => problems.push(format!("parameter `{}` has the symbolic shape {}", node.name, ty.shape)),
            Some(_) if names.is_empty() => problems.push(format!("parameter `{}` has no name there", node.name)),
            Some(shape) => params.push(Param { name: node.name.to_string(), shape, dtype: ty.dtype, names }),
        }
    }
    if problems.is_empty() {
        Ok(params)
    } else {
        Err(CheckpointError::Graph { graph: graph.name.clone(), layout: family.describe(), problems })
    }
}

/// Reads the checkpoint at `path` into `weights`, which holds a value for
/// every parameter of `graph` (from an initialiser, say): each parameter the
/// file has is replaced by the file's tensor, converted to the parameter's
/// dtype (rounded to nearest even). Nothing in `weights` changes unless the
/// whole file fits.
pub fn load_weights(
    path: &Path,
    spec: &ModelSpec,
    graph: &Graph,
    weights: &mut Weights,
) -> Result<LoadReport, CheckpointError> {
    load_weights_with(path, spec, graph, weights, HeadShapes::Strict)
}

/// As [`load_weights`], with `heads` saying whether a task-head tensor of
/// another shape is an error or replaced.
pub fn load_weights_with(
    path: &Path,
    spec: &ModelSpec,
    graph: &Graph,
    weights: &mut Weights,
    heads: HeadShapes,
) -> Result<LoadReport, CheckpointError> {
    let family = Family::of(spec);
    let params = params_of(graph, family)?;
    let bytes = safetensors_io::read(path)?;
    let file = safetensors_io::parse(path, &bytes)?;
    let in_file: BTreeSet<&str> = file.names().into_iter().collect();
    let prefix = family.base_prefix().filter(|p| in_file.iter().any(|n| n.starts_with(p))).unwrap_or("");

    let mut mismatch = Mismatch {
        path: path.to_path_buf(),
        model: spec.name.clone(),
        family,
        prefix: prefix.to_string(),
        missing: Vec::new(),
        unexpected: Vec::new(),
        wrong_shape: Vec::new(),
        wrong_dtype: Vec::new(),
    };
    let mut report = LoadReport::default();
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut values: Vec<(String, Tensor)> = Vec::new();
    for p in &params {
        let names: Vec<String> = p.names.iter().map(|n| n.with_prefix(prefix)).collect();
        let mut present = names.iter().filter(|n| in_file.contains(n.as_str()));
        let Some(name) = present.next() else {
            if is_head(&p.name) {
                report.initialised.push(p.name.clone());
            } else {
                mismatch.missing.push(Missing {
                    name: names[0].clone(),
                    param: p.name.clone(),
                    expected: p.shape.clone(),
                });
            }
            continue;
        };
        // Second names of the same tensor (the MLM decoder's bias) are skipped.
        for alias in present {
            used.insert(alias.clone());
            report.ignored.push(alias.clone());
        }
        used.insert(name.clone());
        let view = file.tensor(name).map_err(|e| safetensors_io::corrupt(path, e.to_string()))?;
        if view.shape() != p.shape.as_slice() {
            if heads == HeadShapes::Replace && is_head(&p.name) {
                report.replaced.push(p.name.clone());
                continue;
            }
            mismatch.wrong_shape.push(WrongShape {
                name: name.clone(),
                param: p.name.clone(),
                expected: p.shape.clone(),
                found: view.shape().to_vec(),
            });
            continue;
        }
        let Some(floats) = safetensors_io::floats(view.dtype(), view.data()) else {
            let dtype = format!("{:?}", view.dtype());
            mismatch.wrong_dtype.push(Found { name: name.clone(), shape: view.shape().to_vec(), dtype });
            continue;
        };
        let tensor = Tensor::float(p.shape.clone(), p.dtype, floats)
            .map_err(|e| safetensors_io::corrupt(path, format!("tensor `{name}`: {e}")))?;
        values.push((p.name.clone(), tensor));
    }
    for &name in &in_file {
        if used.contains(name) {
            continue;
        }
        let bare = name.strip_prefix(prefix).filter(|_| !prefix.is_empty()).unwrap_or(name);
        let other_head =
            from_hf(family, bare).is_some_and(|(ours, _)| is_head(&ours) && graph.node_by_name(&ours).is_none());
        if is_ignored(family, bare) || other_head {
            report.ignored.push(name.to_string());
        } else {
            let view = file.tensor(name).map_err(|e| safetensors_io::corrupt(path, e.to_string()))?;
            let dtype = format!("{:?}", view.dtype());
            mismatch.unexpected.push(Found { name: name.to_string(), shape: view.shape().to_vec(), dtype });
        }
    }
    if !(mismatch.missing.is_empty()
        && mismatch.unexpected.is_empty()
        && mismatch.wrong_shape.is_empty()
        && mismatch.wrong_dtype.is_empty())
    {
        return Err(CheckpointError::Mismatch(Box::new(mismatch)));
    }
    // The parameters left at their initial values must have one.
    let problems: Vec<String> = params
        .iter()
        .filter(|p| report.initialised.contains(&p.name) || report.replaced.contains(&p.name))
        .filter_map(|p| match weights.get(&p.name) {
            None => Some(format!(
                "`{}` is not taken from the checkpoint (a task-head parameter) and has no initial value in the weights",
                p.name
            )),
            Some(t) if t.shape() != p.shape.as_slice() => {
                Some(format!("`{}` has shape {:?} in the weights, the graph's is {:?}", p.name, t.shape(), p.shape))
            }
            Some(_) => None,
        })
        .collect();
    if !problems.is_empty() {
        return Err(CheckpointError::Weights { graph: graph.name.clone(), problems });
    }
    for (name, tensor) in values {
        report.loaded.push(name.clone());
        weights.insert(name, tensor);
    }
    report.ignored.sort();
    Ok(report)
}

/// Zeros for `graph`'s task-head parameters (`mlm.*`, `pooler.*`,
/// `classifier.*`): the values [`load_weights`] keeps where a file lacks a
/// head, without the seconds a random initialisation of every parameter
/// takes at a real model's size. A symbolic shape is left out, for
/// `load_weights` to name.
pub fn head_zeros(graph: &Graph) -> Weights {
    graph
        .params()
        .into_iter()
        .map(|n| graph.node(n))
        .filter(|node| is_head(&node.name))
        .filter_map(|node| {
            let ty = &node.outputs[0];
            let shape = ty.shape.dims().iter().map(|d| d.as_constant().map(|d| d as usize)).collect::<Option<_>>()?;
            Some((node.name.to_string(), Tensor::full(shape, ty.dtype, 0.0)))
        })
        .collect()
}

/// Writes every parameter of `graph` from `weights` to `path` under Hugging
/// Face names (zeroplan's own for models without a Hugging Face layout), in
/// the parameter's dtype. Graphs with a task head (MLM, classification) put
/// the base model under `bert.`/`albert.`, as `BertForMaskedLM` does; the bare
/// encoder is saved as `BertModel` is. The MLM decoder weight is not written:
/// it is the word embeddings. The file is written whole or not at all.
pub fn save_weights(path: &Path, spec: &ModelSpec, graph: &Graph, weights: &Weights) -> Result<(), CheckpointError> {
    let family = Family::of(spec);
    let params = params_of(graph, family)?;
    let task_head = params.iter().any(|p| p.name.starts_with("mlm.") || p.name.starts_with("classifier."));
    let prefix = if task_head { family.base_prefix().unwrap_or("") } else { "" };
    let mut problems = Vec::new();
    let mut entries = Vec::with_capacity(params.len());
    for p in &params {
        match weights.get(&p.name) {
            None => problems.push(format!("`{}` has no value", p.name)),
            Some(t) if t.shape() != p.shape.as_slice() => {
                problems.push(format!("`{}` has shape {:?}, the graph's is {:?}", p.name, t.shape(), p.shape))
            }
            Some(t) if !t.dtype().is_float() => {
                problems.push(format!("`{}` is an integer tensor ({}), parameters are floats", p.name, t.dtype()))
            }
            Some(t) => {
                entries.push(safetensors_io::Entry { name: p.names[0].with_prefix(prefix), tensor: t, dtype: p.dtype })
            }
        }
    }
    if !problems.is_empty() {
        return Err(CheckpointError::Weights { graph: graph.name.clone(), problems });
    }
    safetensors_io::write(path, entries, &[]).map(drop)
}
