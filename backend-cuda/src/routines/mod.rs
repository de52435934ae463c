//! The host runtime's routines as CUDA kernels: the instructions of a
//! training step that are neither row kernels nor GEMMs (the loss, the
//! embedding gather and its scatter-add, layout ops, fills, broadcast
//! arithmetic and its sums, casts, MSE, ALiBi on a tensor rank's heads, the
//! optimizer's scalars), so they run on
//! the GPU where their buffers lie instead of through a host round trip
//! that waits for both streams.
//!
//! Each is a CUDA C template in this folder (`common.cu` the helpers they
//! share), rendered per [`Routine`] (element or vector unit, dtypes) by text
//! specialisation like the multi-tensor AdamW: a source per distinct
//! specialisation, compiled once. Semantics are the host routines'
//! (`zeroplan_backend_cpu::routines`), dtype for dtype: 16-bit storage read
//! into f32, sums the host takes in f64 taken in double, results rounded the
//! way the host rounds them. Where the host refuses an id or label outside
//! its range, a kernel cannot stop the step: such rows count for nothing.
//!
//! **Launch**: [`THREADS`] per block, at most [`BLOCKS_PER_SM`] blocks per
//! multiprocessor, blocks looping over rows or grid-striding over elements
//! ([`grid`]). Each instruction is planned on the host ([`plan`]: launches,
//! grids, arguments over its buffers' addresses); the layout ops' axes are
//! merged and their copies widened to 16-byte units where alignment allows
//! ([`layout`]), the broadcasts' and sums' index spaces likewise ([`arith`]).

pub mod alibi;
pub mod arith;
pub mod device;
pub mod layout;
pub mod plan;

use zeroplan_ir::DType;

use crate::codegen::expr::c_type;
use crate::codegen::{DeviceProperties, prelude};

/// Threads per block (`ZP_ROUTINE_THREADS`).
pub const THREADS: u32 = 256;
/// The grid is at most this many blocks per multiprocessor: 2048 threads,
/// a Hopper SM's whole occupancy.
pub const BLOCKS_PER_SM: u32 = 8;

/// Why a routine cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutineError {
    /// A copy unit that is not 1, 2, 4, 8 or 16 bytes.
    #[error("a routine copies units of 1, 2, 4, 8 or 16 bytes, not {0}")]
    Unit(u32),
    /// A dtype where the routine reads or writes floats.
    #[error("{what} must be f32, bf16 or f16, not {dtype:?}")]
    Float {
        /// The operand.
        what: &'static str,
        /// The dtype given.
        dtype: DType,
    },
    /// A dtype where the routine reads integers.
    #[error("{what} must be i32 or i64, not {dtype:?}")]
    Int {
        /// The operand.
        what: &'static str,
        /// The dtype given.
        dtype: DType,
    },
}

/// What one routine source is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Routine {
    /// Strided copies and tiled transposes of `unit`-byte units.
    Layout {
        /// Bytes per unit: an element, or a vector of them.
        unit: u32,
    },
    /// Every unit set to a pattern.
    Fill {
        /// Bytes per unit (whole elements).
        unit: u32,
    },
    /// `0, 1, …` into an `out` buffer.
    Arange {
        /// The output's dtype.
        out: DType,
    },
    /// Multiplication by a constant.
    Scale {
        /// The input's dtype.
        x: DType,
        /// The output's dtype.
        out: DType,
    },
    /// A row gather of `unit`-byte units (table and output share a dtype).
    Embedding {
        /// Bytes per unit.
        unit: u32,
        /// The ids' dtype.
        ids: DType,
    },
    /// The gather's scatter-add.
    EmbeddingGrad {
        /// The gradient rows' dtype.
        dy: DType,
        /// The ids' dtype.
        ids: DType,
        /// The table gradient's dtype.
        out: DType,
    },
    /// The mean cross-entropy into an f32 scalar.
    CrossEntropy {
        /// The logits' dtype.
        logits: DType,
        /// The labels' dtype.
        labels: DType,
    },
    /// Add, subtract or multiply over broadcast shapes (the op an argument).
    Broadcast {
        /// The left operand's dtype.
        a: DType,
        /// The right operand's dtype.
        b: DType,
        /// The output's dtype.
        out: DType,
    },
    /// Sums over the axes broadcasting repeats.
    SumTo {
        /// The summed tensor's dtype.
        x: DType,
        /// The output's dtype.
        out: DType,
    },
    /// A conversion between any two dtypes.
    Cast {
        /// The input's dtype.
        x: DType,
        /// The output's dtype.
        out: DType,
    },
    /// The mean squared error into a scalar.
    Mse {
        /// The prediction's dtype.
        p: DType,
        /// The target's dtype.
        t: DType,
        /// The output's dtype.
        out: DType,
    },
    /// The mean squared error's gradient.
    MseGrad {
        /// The prediction's dtype.
        p: DType,
        /// The target's dtype.
        t: DType,
        /// The scalar gradient's dtype.
        dloss: DType,
        /// The output's dtype.
        out: DType,
    },
    /// ALiBi's bias on a tensor rank's heads.
    AlibiBias {
        /// The scores' dtype.
        x: DType,
        /// The output's dtype.
        out: DType,
    },
    /// The optimizer's one-thread scalar kernels: every dtype, chosen at run time.
    Scalars,
    /// The cross-entropy's gradient.
    CrossEntropyGrad {
        /// The logits' dtype.
        logits: DType,
        /// The labels' dtype.
        labels: DType,
        /// The scalar gradient's dtype.
        dloss: DType,
        /// The output's dtype.
        out: DType,
    },
}

/// A rendered routine: its source and the symbols of its kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedRoutine {
    /// What the source is specialised for.
    pub routine: Routine,
    /// The CUDA C NVRTC compiles.
    pub source: String,
    /// Each kernel's symbol, in the order [`Routine::kernels`] names them.
    pub entries: Vec<String>,
}

fn unit_type(unit: u32) -> Result<&'static str, RoutineError> {
    Ok(match unit {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        8 => "unsigned long long",
        16 => "uint4",
        other => return Err(RoutineError::Unit(other)),
    })
}

fn float(what: &'static str, dtype: DType) -> Result<&'static str, RoutineError> {
    if dtype.is_float() { Ok(c_type(dtype)) } else { Err(RoutineError::Float { what, dtype }) }
}

fn int(what: &'static str, dtype: DType) -> Result<&'static str, RoutineError> {
    if dtype.is_int() { Ok(c_type(dtype)) } else { Err(RoutineError::Int { what, dtype }) }
}

const COMMON: &str = include_str!("common.cu");

impl Routine {
    /// The template and the suffixes of its kernels (`""`: the one kernel).
    fn template(&self) -> (&'static str, &'static [&'static str]) {
        match self {
            Routine::Layout { .. } => (include_str!("layout.cu"), &["copy", "tiled"]),
            Routine::Fill { .. } => (include_str!("fill.cu"), &[""]),
            Routine::Arange { .. } => (include_str!("arange.cu"), &[""]),
            Routine::Scale { .. } => (include_str!("scale.cu"), &[""]),
            Routine::Embedding { .. } => (include_str!("embedding.cu"), &[""]),
            Routine::EmbeddingGrad { .. } => (include_str!("embedding_grad.cu"), &["rank", "offsets", "order", "sum"]),
            Routine::CrossEntropy { .. } => (include_str!("cross_entropy.cu"), &["rows", "mean"]),
            Routine::CrossEntropyGrad { .. } => (include_str!("cross_entropy_grad.cu"), &["count", "rows"]),
            Routine::Broadcast { .. } => (include_str!("broadcast.cu"), &["", "vec4"]),
            Routine::SumTo { .. } => (include_str!("sum_to.cu"), &["rows", "cols", "finish"]),
            Routine::Cast { .. } => (include_str!("cast.cu"), &[""]),
            Routine::Mse { .. } => (include_str!("mse.cu"), &["partials", "mean"]),
            Routine::AlibiBias { .. } => (include_str!("alibi_bias.cu"), &[""]),
            Routine::MseGrad { .. } => (include_str!("mse_grad.cu"), &[""]),
            Routine::Scalars => (include_str!("scalars.cu"), &["lr_schedule", "grad_scale", "loss_scale_update"]),
        }
    }

    /// The suffixes naming its kernels, in launch order.
    pub fn kernels(&self) -> &'static [&'static str] {
        self.template().1
    }

    /// The typedefs of the specialisation, which also check its dtypes.
    fn types(&self) -> Result<Vec<(&'static str, &'static str)>, RoutineError> {
        Ok(match *self {
            Routine::Layout { unit } | Routine::Fill { unit } => vec![("zp_unit_t", unit_type(unit)?)],
            Routine::Arange { out } => vec![("zp_out_t", c_type(out))],
            Routine::Scale { x, out } => {
                vec![("zp_in_t", float("the input", x)?), ("zp_out_t", float("the output", out)?)]
            }
            Routine::Embedding { unit, ids } => {
                vec![("zp_unit_t", unit_type(unit)?), ("zp_id_t", int("the ids", ids)?)]
            }
            Routine::EmbeddingGrad { dy, ids, out } => vec![
                ("zp_dy_t", float("the gradient", dy)?),
                ("zp_id_t", int("the ids", ids)?),
                ("zp_out_t", float("the table's gradient", out)?),
            ],
            Routine::CrossEntropy { logits, labels } => {
                vec![("zp_logits_t", float("the logits", logits)?), ("zp_label_t", int("the labels", labels)?)]
            }
            Routine::CrossEntropyGrad { logits, labels, dloss, out } => vec![
                ("zp_logits_t", float("the logits", logits)?),
                ("zp_label_t", int("the labels", labels)?),
                ("zp_dloss_t", float("the loss's gradient", dloss)?),
                ("zp_out_t", float("the output", out)?),
            ],
            Routine::Broadcast { a, b, out } => vec![
                ("zp_a_t", float("the left operand", a)?),
                ("zp_b_t", float("the right operand", b)?),
                ("zp_out_t", float("the output", out)?),
            ],
            Routine::SumTo { x, out } | Routine::AlibiBias { x, out } => {
                vec![("zp_in_t", float("the input", x)?), ("zp_out_t", float("the output", out)?)]
            }
            Routine::Cast { x, out } => vec![("zp_in_t", c_type(x)), ("zp_out_t", c_type(out))],
            Routine::Mse { p, t, out } => vec![
                ("zp_p_t", float("the prediction", p)?),
                ("zp_t_t", float("the target", t)?),
                ("zp_out_t", float("the output", out)?),
            ],
            Routine::MseGrad { p, t, dloss, out } => vec![
                ("zp_p_t", float("the prediction", p)?),
                ("zp_t_t", float("the target", t)?),
                ("zp_dloss_t", float("the loss's gradient", dloss)?),
                ("zp_out_t", float("the output", out)?),
            ],
            Routine::Scalars => Vec::new(),
        })
    }

    /// The dtypes it reads or writes as values (16-bit ones need their headers).
    fn dtypes(&self) -> Vec<DType> {
        match *self {
            Routine::Layout { .. } | Routine::Fill { .. } | Routine::Embedding { .. } => Vec::new(),
            Routine::Arange { out } => vec![out],
            Routine::Scale { x, out } => vec![x, out],
            Routine::EmbeddingGrad { dy, out, .. } => vec![dy, out],
            Routine::CrossEntropy { logits, .. } => vec![logits],
            Routine::CrossEntropyGrad { logits, dloss, out, .. } => vec![logits, dloss, out],
            Routine::Broadcast { a, b, out } => vec![a, b, out],
            Routine::SumTo { x, out } | Routine::Cast { x, out } | Routine::AlibiBias { x, out } => vec![x, out],
            Routine::Mse { p, t, out } => vec![p, t, out],
            Routine::MseGrad { p, t, dloss, out } => vec![p, t, dloss, out],
            Routine::Scalars => vec![DType::BF16, DType::F16],
        }
    }

    /// The symbol the kernels' names start with: the family and its types.
    pub fn symbol(&self) -> String {
        let name = |d: DType| d.name();
        match *self {
            Routine::Layout { unit } => format!("zp_layout_u{unit}"),
            Routine::Fill { unit } => format!("zp_fill_u{unit}"),
            Routine::Arange { out } => format!("zp_arange_{}", name(out)),
            Routine::Scale { x, out } => format!("zp_scale_{}_{}", name(x), name(out)),
            Routine::Embedding { unit, ids } => format!("zp_embedding_u{unit}_{}", name(ids)),
            Routine::EmbeddingGrad { dy, ids, out } => {
                format!("zp_embedding_grad_{}_{}_{}", name(dy), name(ids), name(out))
            }
            Routine::CrossEntropy { logits, labels } => format!("zp_cross_entropy_{}_{}", name(logits), name(labels)),
            Routine::CrossEntropyGrad { logits, labels, dloss, out } => {
                format!("zp_cross_entropy_grad_{}_{}_{}_{}", name(logits), name(labels), name(dloss), name(out))
            }
            Routine::Broadcast { a, b, out } => format!("zp_broadcast_{}_{}_{}", name(a), name(b), name(out)),
            Routine::SumTo { x, out } => format!("zp_sum_to_{}_{}", name(x), name(out)),
            Routine::Cast { x, out } => format!("zp_cast_{}_{}", name(x), name(out)),
            Routine::Mse { p, t, out } => format!("zp_mse_{}_{}_{}", name(p), name(t), name(out)),
            Routine::AlibiBias { x, out } => format!("zp_alibi_bias_{}_{}", name(x), name(out)),
            Routine::MseGrad { p, t, dloss, out } => {
                format!("zp_mse_grad_{}_{}_{}_{}", name(p), name(t), name(dloss), name(out))
            }
            Routine::Scalars => "zp_scalars".to_string(),
        }
    }

    /// The CUDA C: the prelude's helpers, the types, the shared helpers, the template.
    pub fn render(&self) -> Result<RenderedRoutine, RoutineError> {
        let types = self.types()?;
        let dtypes = self.dtypes();
        let uses = |d: DType| dtypes.contains(&d);
        let mut s = format!("// zeroplan routine {:?}.\n", self);
        s.push_str(&prelude::types_and_math(uses(DType::BF16), uses(DType::F16)));
        s.push_str("\n// ── This specialisation ──\n");
        for (name, ty) in types {
            s.push_str(&format!("typedef {ty} {name};\n"));
        }
        s.push('\n');
        s.push_str(COMMON);
        s.push('\n');
        let (template, kernels) = self.template();
        let symbol = self.symbol();
        s.push_str(&template.replace("$NAME", &symbol));
        let entries =
            kernels.iter().map(|k| if k.is_empty() { symbol.clone() } else { format!("{symbol}_{k}") }).collect();
        Ok(RenderedRoutine { routine: *self, source: s, entries })
    }
}

/// Blocks for `work` independent blocks' worth of work on `device`: at
/// least one, at most [`BLOCKS_PER_SM`] per multiprocessor (blocks loop).
pub fn grid(work: u64, device: &DeviceProperties) -> u32 {
    let cap = u64::from(device.multiprocessors.max(1) * BLOCKS_PER_SM);
    work.clamp(1, cap) as u32
}

/// Blocks for a grid-stride loop over `n` elements, a thread each.
pub fn grid_for(n: u64, device: &DeviceProperties) -> u32 {
    grid(n.div_ceil(u64::from(THREADS)), device)
}

#[cfg(test)]
mod tests;
