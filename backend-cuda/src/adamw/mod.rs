//! Multi-tensor AdamW: one launch steps every parameter of the model (or of
//! a ZeRO shard), rather than one launch per parameter.
//!
//! The update is the IR's `AdamW` op (`zeroplan_ir::interp` and `Op::AdamW`):
//! decoupled weight decay, bias correction at the 1-based step `t`, applied
//! to `grad · multiplier`, the identity when `finite` is 0 — `lr`, `t`,
//! `multiplier` and `finite` are read from device scalars (what the graph's
//! `lr_schedule` and `grad_scale` computed), so nothing waits on the host.
//! Parameters, `m` and `v` are f32 and updated in place (under mixed
//! precision the parameter is the f32 master); the gradient is f32, bf16 or
//! f16; optionally the new parameter's 16-bit working copy is written too
//! (the mixed-precision `cast`, fused).
//!
//! **Launch**: [`AdamWTable`] lists the tensors (64 bytes each: pointers,
//! length, first chunk, weight decay; upload it to the device) and cuts them
//! into [`CHUNK`]-element chunks; the grid is one block per chunk up to
//! [`BLOCKS_PER_SM`] per multiprocessor (blocks loop over chunks), 256
//! threads each. The template is `adamw.cu` in this folder.
//!
//! **Parameters**: `const ZpAdamTensor* table, int tensors, long long
//! chunks, const float* lr, const float* step, const float* multiplier,
//! const float* finite, double beta1, double beta2, double eps`.

mod device;

pub use device::{AdamWScalars, LoadedAdamW};
use zeroplan_ir::DType;

use crate::codegen::expr::c_type;
use crate::codegen::{DeviceProperties, prelude};

/// Elements per chunk (`ZP_CHUNK`).
pub const CHUNK: usize = 4096;
/// Threads per block (`ZP_ADAM_THREADS`).
pub const THREADS: u32 = 256;
/// The grid is at most this many blocks per multiprocessor.
pub const BLOCKS_PER_SM: u32 = 4;
/// Bytes of one table entry (`sizeof(ZpAdamTensor)`).
pub const ENTRY_BYTES: usize = 64;

/// Why a multi-tensor AdamW cannot be rendered or its table built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdamWError {
    /// A gradient dtype the kernel cannot read: the dtype asked for.
    #[error("multi-tensor AdamW reads f32, bf16 or f16 gradients, not {0:?}")]
    GradDtype(DType),
    /// A working copy that is not 16-bit: the dtype asked for.
    #[error("the working copy AdamW writes is bf16 or f16, not {0:?} (f32 training has none: pass None)")]
    WorkingDtype(DType),
    /// A tensor that does not fit the kernel it is tabled for.
    #[error("tensor {index} of the AdamW table: {message}")]
    Tensor {
        /// Its position in the list given.
        index: usize,
        /// What does not fit (a missing or unexpected working copy, a length).
        message: String,
    },
    /// More tensors than the kernel's `int` count holds: how many.
    #[error("the AdamW table holds {0} tensors, over the kernel's int: split it into several launches")]
    TooMany(usize),
}

/// What one AdamW source is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdamWKernel {
    /// The gradients' dtype.
    pub grad: DType,
    /// The 16-bit working copy written after the step, if any.
    pub working: Option<DType>,
}

/// The hyper-parameters every tensor of a launch shares (the partition pass
/// requires them shared); the weight decay is per tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    /// The first moment's decay rate.
    pub beta1: f64,
    /// The second moment's decay rate.
    pub beta2: f64,
    /// Added to `√v̂` so the update's denominator is never 0.
    pub eps: f64,
}

/// One tensor to step: device pointers and its decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWTensor {
    /// f32, updated in place.
    pub param: u64,
    /// The kernel's gradient dtype.
    pub grad: u64,
    /// f32, updated in place.
    pub m: u64,
    /// f32, updated in place.
    pub v: u64,
    /// The kernel's working dtype; `Some` exactly when the kernel has one.
    pub working: Option<u64>,
    /// Elements of every one of its buffers; an empty tensor is left out of
    /// the table.
    pub len: usize,
    /// Its decoupled weight decay (per tensor: biases and norms are
    /// usually left undecayed).
    pub weight_decay: f64,
}

/// The table a launch reads, as bytes to upload, and its sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdamWTable {
    /// [`ENTRY_BYTES`] per non-empty tensor, little-endian.
    pub bytes: Vec<u8>,
    /// Non-empty tensors in the table.
    pub tensors: i32,
    /// Chunks over all of them.
    pub chunks: i64,
}

/// The rendered source and its symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedAdamW {
    /// What the source is specialised for.
    pub kernel: AdamWKernel,
    /// The CUDA C NVRTC compiles.
    pub source: String,
    /// The kernel's symbol in the source ([`AdamWKernel::symbol`]).
    pub entry: String,
}

const TEMPLATE: &str = include_str!("adamw.cu");

impl AdamWKernel {
    /// Whether the kernel can be rendered: f32, bf16 or f16 gradients, and
    /// a working copy (if any) of bf16 or f16.
    pub fn check(&self) -> Result<(), AdamWError> {
        if !matches!(self.grad, DType::F32 | DType::BF16 | DType::F16) {
            return Err(AdamWError::GradDtype(self.grad));
        }
        match self.working {
            Some(w) if !matches!(w, DType::BF16 | DType::F16) => Err(AdamWError::WorkingDtype(w)),
            _ => Ok(()),
        }
    }

    /// The kernel's C symbol, which names its dtypes: each specialisation
    /// has its own.
    pub fn symbol(&self) -> String {
        let working = self.working.map_or(String::new(), |w| format!("_working_{}", w.name()));
        format!("zp_multi_tensor_adamw_grad_{}{working}", self.grad.name())
    }

    /// The CUDA C: the prelude's helpers, the types, the template.
    pub fn render(&self) -> Result<RenderedAdamW, AdamWError> {
        self.check()?;
        let uses = |d: DType| self.grad == d || self.working == Some(d);
        let mut s = format!(
            "// zeroplan multi-tensor AdamW: {:?} gradients, working copy {}.\n",
            self.grad,
            self.working.map_or("none".to_string(), |w| format!("{w:?}"))
        );
        s.push_str(&prelude::types_and_math(uses(DType::BF16), uses(DType::F16)));
        s.push_str(&format!(
            "\n// ── This specialisation ──\ntypedef {} zp_grad_t;\ntypedef {} zp_working_t;\nconstexpr bool ZP_WORKING = {};\n\n",
            c_type(self.grad),
            self.working.map_or("float", c_type),
            self.working.is_some()
        ));
        let entry = self.symbol();
        s.push_str(&TEMPLATE.replace("$ENTRY", &entry));
        Ok(RenderedAdamW { kernel: *self, source: s, entry })
    }

    /// The table of `tensors` for this kernel: empty tensors left out, each
    /// entry's first chunk counted.
    pub fn table(&self, tensors: &[AdamWTensor]) -> Result<AdamWTable, AdamWError> {
        self.check()?;
        let mut bytes = Vec::with_capacity(tensors.len() * ENTRY_BYTES);
        let (mut count, mut chunks) = (0usize, 0usize);
        for (index, t) in tensors.iter().enumerate() {
            let error = |message: &str| AdamWError::Tensor { index, message: message.to_string() };
            if t.len == 0 {
                continue;
            }
            if [t.param, t.grad, t.m, t.v].contains(&0) {
                return Err(error("a null pointer (param, grad, m or v)"));
            }
            let working = match (t.working, self.working) {
                (Some(0), _) => return Err(error("a null working-copy pointer")),
                (Some(w), Some(_)) => w,
                (None, None) => 0,
                (Some(_), None) => return Err(error("a working copy, but the kernel was rendered without one")),
                (None, Some(_)) => return Err(error("no working copy, but the kernel writes one for every tensor")),
            };
            if !t.weight_decay.is_finite() {
                return Err(error(&format!("weight decay {} is not finite", t.weight_decay)));
            }
            let len = i64::try_from(t.len).map_err(|_| error("over 2⁶³ elements"))?;
            for word in [t.param, t.grad, t.m, t.v, working] {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(&(chunks as i64).to_le_bytes());
            bytes.extend_from_slice(&t.weight_decay.to_le_bytes());
            count += 1;
            chunks += t.len.div_ceil(CHUNK);
        }
        let tensors = i32::try_from(count).map_err(|_| AdamWError::TooMany(count))?;
        Ok(AdamWTable { bytes, tensors, chunks: chunks as i64 })
    }
}

impl AdamWTable {
    /// `(grid, block)` on `device`; a grid of 0 means nothing to launch.
    pub fn launch(&self, device: &DeviceProperties) -> (u32, u32) {
        let cap = device.multiprocessors.max(1) * BLOCKS_PER_SM;
        (self.chunks.min(cap as i64) as u32, THREADS)
    }
}

#[cfg(test)]
mod tests;
