//! Fused (FlashAttention-2-style) attention as a parameterised CUDA C
//! template rendered from Rust: the forward `(q, k, v, mask) → (out, lse)`
//! and the backward `(q, k, v, mask, out, lse, dout) → (dq, dk, dv)` of the
//! IR's `FlashAttention`/`FlashAttentionGrad` ops, without ever storing the
//! `[B, H, S, S]` probabilities.
//!
//! **Semantics** (the reference interpreter's): `q, k, v` are `[B, H, S, D]`
//! contiguous; scores `s_ij = scale·q_i·k_j`, minus ALiBi's `m_h·|i − j|`
//! (the slopes of `zeroplan_ir::interp::alibi_slopes_of_rank`, with the
//! tensor-parallel head offset), `−∞` where `mask[b, j] == 0`;
//! `P = softmax(s)`; `out = dropout(P)·v` with exactly the Philox mask the
//! generated dropout kernels draw for a `[B, H, S, S]` tensor's flat index
//! (same seed, stream, offset); `lse_i = log Σ_j exp(s_ij)` in f32. A row
//! whose keys are all masked gives `out = 0`, `lse = −∞` and zero gradients.
//!
//! **What a source depends on** ([`AttentionKernel`]): the head dim (32 or
//! 64; 128 on tensor cores), the storage dtype (f32, bf16, f16; arithmetic
//! in f32), the mask's integer type, whether ALiBi and dropout are on,
//! whether the products run on tensor cores, and the pass. Everything
//! else — batch, heads, sequence length, the scale, the tensor rank, the
//! dropout probability and stream — is a kernel argument
//! ([`AttentionArgs`]), so one compiled module serves every shape; the
//! Philox seed and counter word are read from device memory (`zp_rng`),
//! so a CUDA graph that recorded the launch draws each step's masks.
//!
//! **Two implementations**, chosen when the op is specialised for a device
//! ([`FlashAttention::kernel`]): bf16 and f16 operands on sm_80 or newer run
//! their products (`Q·Kᵀ`, `P·V`, and the backward's `dO·Vᵀ`, `dS·K`,
//! `P·dO`, `dS·Q`) on tensor cores, `mma.sync` m16n8k16 with f32
//! accumulation and `ldmatrix` fragment loads (`mma.cu`, `mma_forward.cu`,
//! `mma_backward.cu`); f32 operands, and any device before sm_80, keep the
//! CUDA-core kernels (`fma.cu`, `forward.cu`, `backward.cu`), whose f32
//! products the tensor cores' 16-bit operands would round. `common.cu` is
//! shared. The files' comments give the algorithms.
//!
//! **Launch** ([`AttentionKernel::launch`]): every kernel runs [`THREADS`]
//! threads (4 warps) on a grid `(⌈S/rows⌉, B·H)`; a block owns `rows` rows
//! of one head (query rows for the forward and dQ, key rows for dK/dV) and
//! walks the other side in tiles staged in static shared memory
//! ([`KernelLaunch::shared_bytes`]). CUDA cores: 16 rows (4 a warp), tiles
//! of 64 rows (forward) or 32 (backward) as f32 (38,144 B forward, 25,344 B
//! dQ, 26,112 B dK/dV at D = 64). Tensor cores: 64 rows (16 a warp: one m16
//! tile), tiles in the storage type of [`AttentionKernel::tile`] rows, sized
//! to fit 128 registers a thread (18,464 B forward, 28,192 B dQ, 27,904 B
//! dK/dV at D = 64; at D = 128 the backward's two other-side operands share
//! one buffer, [`AttentionKernel::one_operand_buffer`]). Every kernel fits 4
//! blocks in an A100's 164 KiB of shared memory.
//!
//! **Parameters** of every entry, in order: the tensor pointers (forward:
//! `q, k, v, mask, out, lse`; dQ: `q, k, v, mask, out, lse, dout, dq`;
//! dK/dV: `q, k, v, mask, out, lse, dout, dk, dv`), then `int heads, int
//! seq, float scale, int head_offset, int total_heads, unsigned
//! keep_threshold, float keep_scale, unsigned stream` ([`AttentionArgs`]
//! in that order), `const unsigned long long* zp_rng` (dropout's seed and
//! counter word, two words in device memory).

mod device;
mod launch;

pub use device::{BackwardTensors, ForwardTensors, LoadedAttention};
pub use launch::{AttentionLaunch, KernelLaunch, MAX_BLOCKS_Y, THREADS};
use zeroplan_ir::DType;

use crate::codegen::expr::c_type;
use crate::codegen::{DeviceProperties, prelude};

/// Why an attention kernel cannot be rendered, launched or given arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttentionError {
    /// A head dim the template has no tiles for: the dim asked for.
    #[error(
        "fused attention supports head dims 32 and 64 (and 128 on tensor cores: bf16/f16 on sm_80+), not {0}: use the unfused attention (matmul, softmax, matmul) for other head sizes"
    )]
    HeadDim(usize),
    /// Tensor cores asked of operands they do not take: the dtype.
    #[error("the tensor-core attention kernels take bf16 or f16 operands, not {0:?}: f32 runs on CUDA cores")]
    TensorCoreDtype(DType),
    /// Tensor-core kernels launched on a device before sm_80: its `(major, minor)`.
    #[error(
        "the tensor-core attention kernels need sm_80 or newer (mma.sync m16n8k16 with bf16/f16), the device is sm_{}{}: specialise the op for this device",
        .0.0, .0.1
    )]
    TensorCoreArch((i32, i32)),
    /// A storage dtype the template cannot load: the dtype asked for.
    #[error("fused attention stores q, k, v in f32, bf16 or f16, not {0:?}: cast the operands first")]
    Dtype(DType),
    /// A mask that is not an `i32` or `i64` tensor: its dtype.
    #[error("the attention mask must be an i32 or i64 tensor (0 = masked key), not {0:?}")]
    MaskDtype(DType),
    /// A drop probability outside `[0, 1)`, as written.
    #[error("attention dropout must be in [0, 1), not {0}")]
    Dropout(String),
    /// ALiBi's heads asked of a tensor rank the group does not have.
    #[error("ALiBi over {ranks} tensor ranks has no rank {rank}: the rank must be below the rank count (at least 1)")]
    TensorRank {
        /// The tensor rank asked for.
        rank: u64,
        /// The tensor ranks the heads are split over.
        ranks: u64,
    },
    /// Sizes the kernels cannot take: empty, over CUDA's grid, or over an `int`.
    #[error("fused attention over [{batch}, {heads}, {seq}, ·]: {message}")]
    Shape {
        /// `B`.
        batch: usize,
        /// `H`, this rank's heads.
        heads: usize,
        /// `S`.
        seq: usize,
        /// Which limit is passed, and what to do.
        message: String,
    },
    /// A kernel whose static shared memory is over the device's limit.
    #[error("the {entry} kernel needs {needed} B of shared memory per block, the device allows {available} B")]
    SharedMemory {
        /// The kernel, as [`Entry::label`] names it.
        entry: &'static str,
        /// Its shared memory per block, in bytes.
        needed: u32,
        /// The device's limit per block, in bytes.
        available: u32,
    },
    /// Arguments that ask for ALiBi or dropout when the kernel was rendered
    /// without it (or the reverse): what was asked.
    #[error("the attention kernel was rendered without {0}, but the arguments ask for it: render it from the same op")]
    Mismatch(&'static str),
}

/// The IR op's attributes: `FlashAttention { scale, alibi_ranks, dropout, stream }`
/// (and `FlashAttentionGrad`'s, the same).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashAttention {
    /// The factor of `q·kᵀ` (usually `1/√D`).
    pub scale: f64,
    /// `Some(t)`: ALiBi on, the heads are one tensor rank's of `t·H`.
    pub alibi_ranks: Option<u64>,
    /// Dropout's drop probability on `P`; 0 draws nothing.
    pub dropout: f64,
    /// Dropout's Philox stream (the counter's third word).
    pub stream: u32,
}

/// What one attention source is specialised for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionKernel {
    /// `D`: 32 or 64.
    pub head_dim: usize,
    /// The storage type of `q, k, v, out, dout, dq, dk, dv`.
    pub dtype: DType,
    /// The mask's type: `I32` or `I64`.
    pub mask: DType,
    /// Whether ALiBi's penalty is subtracted from the scores.
    pub alibi: bool,
    /// Whether dropout is drawn on the probabilities (`p > 0`).
    pub dropout: bool,
    /// Whether the products run on tensor cores (`mma.sync`, sm_80+, bf16
    /// or f16 storage) rather than as CUDA-core FMAs: see
    /// [`AttentionKernel::tensor_cores_serve`].
    pub tensor_cores: bool,
}

/// Forward or backward: one source each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// `(q, k, v, mask) → (out, lse)`: one kernel.
    Forward,
    /// `(q, k, v, mask, out, lse, dout) → (dq, dk, dv)`: two kernels, dQ
    /// and dK/dV.
    Backward,
}

/// One kernel of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// `(q, k, v, mask) → (out, lse)`.
    Forward,
    /// `(q, k, v, mask, out, lse, dout) → dq`.
    BackwardDq,
    /// `(q, k, v, mask, out, lse, dout) → (dk, dv)`.
    BackwardDkDv,
}

impl Entry {
    /// Its name in errors and logs: `forward`, `dQ` or `dK/dV`.
    pub fn label(self) -> &'static str {
        match self {
            Entry::Forward => "forward",
            Entry::BackwardDq => "dQ",
            Entry::BackwardDkDv => "dK/dV",
        }
    }
}

impl Pass {
    /// The kernels of this pass, in launch order (any order is correct: they
    /// write different tensors).
    pub fn entries(self) -> &'static [Entry] {
        match self {
            Pass::Forward => &[Entry::Forward],
            Pass::Backward => &[Entry::BackwardDq, Entry::BackwardDkDv],
        }
    }
}

/// A rendered pass: the CUDA C and its kernels' symbols.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedAttention {
    /// What the source is specialised for.
    pub kernel: AttentionKernel,
    /// The pass whose kernels it holds.
    pub pass: Pass,
    /// The CUDA C NVRTC compiles.
    pub source: String,
    /// `(entry, symbol)` in [`Pass::entries`] order.
    pub entries: Vec<(Entry, String)>,
}

/// `[B, H, S, ·]`: the tensors' leading dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// `B`, the sequences.
    pub batch: usize,
    /// `H`, the heads of this rank's tensors.
    pub heads: usize,
    /// `S`, the sequence length (of queries and keys alike).
    pub seq: usize,
}

/// The scalar arguments every entry takes after its pointers, in order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionArgs {
    /// `H`: the heads of this rank's tensors.
    pub heads: i32,
    /// `S`.
    pub seq: i32,
    /// The factor of `q·kᵀ`.
    pub scale: f32,
    /// This rank's first head among all ranks' (ALiBi's slopes).
    pub head_offset: i32,
    /// Every rank's heads together (ALiBi's slopes).
    pub total_heads: i32,
    /// `⌈p·2²⁴⌉`: Philox's top 24 bits at or above it keep the element.
    pub keep_threshold: u32,
    /// `1/(1 − p)`.
    pub keep_scale: f32,
    /// Dropout's Philox stream (the counter's third word).
    pub stream: u32,
}

/// The template's parts, in the order they are rendered: the shared
/// helpers, then the CUDA-core kernels' or the tensor-core kernels'.
const COMMON: &str = include_str!("common.cu");
const FMA: &str = include_str!("fma.cu");
const FORWARD: &str = include_str!("forward.cu");
const BACKWARD: &str = include_str!("backward.cu");
const MMA: &str = include_str!("mma.cu");
const MMA_FORWARD: &str = include_str!("mma_forward.cu");
const MMA_BACKWARD: &str = include_str!("mma_backward.cu");

impl FlashAttention {
    /// The source specialisation for operands of `dtype`, head dim `head_dim`
    /// and a `mask` of that integer type on `device`: on tensor cores where
    /// [`AttentionKernel::tensor_cores_serve`] says so, else on CUDA cores.
    pub fn kernel(
        &self,
        head_dim: usize,
        dtype: DType,
        mask: DType,
        device: &DeviceProperties,
    ) -> Result<AttentionKernel, AttentionError> {
        self.dropout_probability()?;
        let kernel = AttentionKernel {
            head_dim,
            dtype,
            mask,
            alibi: self.alibi_ranks.is_some(),
            dropout: self.dropout > 0.0,
            tensor_cores: AttentionKernel::tensor_cores_serve(head_dim, dtype, device),
        };
        kernel.check()?;
        Ok(kernel)
    }

    fn dropout_probability(&self) -> Result<f64, AttentionError> {
        if (0.0..1.0).contains(&self.dropout) {
            Ok(self.dropout)
        } else {
            Err(AttentionError::Dropout(format!("{}", self.dropout)))
        }
    }

    /// The scalar arguments for tensors of `shape` on tensor rank
    /// `tensor_rank` (0 without tensor parallelism). `kernel` is what they
    /// will be passed to.
    pub fn args(
        &self,
        kernel: &AttentionKernel,
        shape: AttentionShape,
        tensor_rank: u64,
    ) -> Result<AttentionArgs, AttentionError> {
        let AttentionShape { batch, heads, seq } = shape;
        let p = self.dropout_probability()?;
        if kernel.alibi != self.alibi_ranks.is_some() {
            return Err(AttentionError::Mismatch(if kernel.alibi { "ALiBi off" } else { "ALiBi" }));
        }
        if kernel.dropout != (p > 0.0) {
            return Err(AttentionError::Mismatch(if kernel.dropout { "dropout off" } else { "dropout" }));
        }
        launch::check_shape(shape)?;
        let shape_error = |message: String| AttentionError::Shape { batch, heads, seq, message };
        let (head_offset, total_heads) = match self.alibi_ranks {
            None => (0, heads as i32),
            Some(ranks) => {
                if ranks == 0 || tensor_rank >= ranks {
                    return Err(AttentionError::TensorRank { rank: tensor_rank, ranks });
                }
                let total = (heads as u64).checked_mul(ranks).filter(|&t| t <= i32::MAX as u64).ok_or_else(|| {
                    shape_error(format!("{heads} heads × {ranks} tensor ranks overflow the kernel's int"))
                })?;
                ((heads as u64 * tensor_rank) as i32, total as i32)
            }
        };
        Ok(AttentionArgs {
            heads: heads as i32,
            seq: seq as i32,
            scale: self.scale as f32,
            head_offset,
            total_heads,
            keep_threshold: crate::codegen::expr::keep_threshold(p),
            keep_scale: (1.0 / (1.0 - p)) as f32,
            stream: self.stream,
        })
    }
}

impl AttentionKernel {
    /// Whether the tensor-core kernels serve head dim `head_dim` over `dtype`
    /// operands on `device`: bf16 or f16 (the `mma` operand types; f32 would
    /// be rounded to them), sm_80 or newer (`mma.sync` m16n8k16 with bf16 is
    /// Ampere's), head dim 32, 64 or 128 (whole k-steps of 16, and tiles
    /// that fit 48 KiB of static shared memory).
    pub fn tensor_cores_serve(head_dim: usize, dtype: DType, device: &DeviceProperties) -> bool {
        matches!(dtype, DType::BF16 | DType::F16)
            && device.compute_capability >= (8, 0)
            && matches!(head_dim, 32 | 64 | 128)
    }

    /// Whether the template supports this specialisation (a clear error if not).
    pub fn check(&self) -> Result<(), AttentionError> {
        let head_dims: &[usize] = if self.tensor_cores { &[32, 64, 128] } else { &[32, 64] };
        if !head_dims.contains(&self.head_dim) {
            return Err(AttentionError::HeadDim(self.head_dim));
        }
        if !matches!(self.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(AttentionError::Dtype(self.dtype));
        }
        if self.tensor_cores && self.dtype == DType::F32 {
            return Err(AttentionError::TensorCoreDtype(self.dtype));
        }
        if !matches!(self.mask, DType::I32 | DType::I64) {
            return Err(AttentionError::MaskDtype(self.mask));
        }
        Ok(())
    }

    /// The symbol of `entry`: names every parameter of the specialisation,
    /// so modules of different ones never collide.
    pub fn symbol(&self, entry: Entry) -> String {
        let pass = match entry {
            Entry::Forward => "fwd",
            Entry::BackwardDq => "bwd_dq",
            Entry::BackwardDkDv => "bwd_dkdv",
        };
        format!(
            "zp_flash_attention_{}{pass}_d{}_{}_mask_{}{}{}",
            if self.tensor_cores { "mma_" } else { "" },
            self.head_dim,
            self.dtype.name(),
            self.mask.name(),
            if self.alibi { "_alibi" } else { "" },
            if self.dropout { "_dropout" } else { "" },
        )
    }

    /// The CUDA C of `pass`: the prelude's helpers, the specialisation's
    /// types and constants, the template.
    pub fn render(&self, pass: Pass) -> Result<RenderedAttention, AttentionError> {
        self.check()?;
        let mut s = String::new();
        s.push_str(&format!(
            "// zeroplan fused attention, {}: head dim {}, {:?} storage, {:?} mask, ALiBi {}, dropout {}, {}.\n",
            match pass {
                Pass::Forward => "forward",
                Pass::Backward => "backward",
            },
            self.head_dim,
            self.dtype,
            self.mask,
            if self.alibi { "on" } else { "off" },
            if self.dropout { "on" } else { "off" },
            if self.tensor_cores { "tensor cores" } else { "CUDA cores" },
        ));
        s.push_str(&prelude::types_and_math(self.dtype == DType::BF16, self.dtype == DType::F16));
        s.push_str(prelude::REDUCE);
        s.push_str(prelude::PHILOX);
        s.push_str(&format!(
            "\n// ── This specialisation ──\ntypedef {} zp_t;\ntypedef {} zp_mask_t;\nconstexpr int ZP_D = {};\nconstexpr bool ZP_ALIBI = {};\nconstexpr bool ZP_DROPOUT = {};\n",
            c_type(self.dtype),
            c_type(self.mask),
            self.head_dim,
            self.alibi,
            self.dropout,
        ));
        s.push_str(&format!("constexpr int ZP_TILE = {};\n", self.tile(pass)));
        if self.tensor_cores {
            s.push_str(&self.tensor_core_constants(pass));
        }
        s.push('\n');
        s.push_str(COMMON);
        s.push('\n');
        let (forward, backward) = if self.tensor_cores {
            // The instructions' operand type: `mma…f32.bf16.bf16.f32` or `.f16`.
            s.push_str(&MMA.replace("$MMA", self.dtype.name()));
            (MMA_FORWARD, MMA_BACKWARD)
        } else {
            s.push_str(FMA);
            (FORWARD, BACKWARD)
        };
        s.push('\n');
        match pass {
            Pass::Forward => s.push_str(&forward.replace("$FORWARD", &self.symbol(Entry::Forward))),
            Pass::Backward => s.push_str(
                &backward
                    .replace("$BACKWARD_DQ", &self.symbol(Entry::BackwardDq))
                    .replace("$BACKWARD_DKDV", &self.symbol(Entry::BackwardDkDv)),
            ),
        }
        let entries = pass.entries().iter().map(|&e| (e, self.symbol(e))).collect();
        Ok(RenderedAttention { kernel: *self, pass, source: s, entries })
    }

    /// The tensor-core kernels' constants: whether the dK/dV kernel walks
    /// the queries twice, whether the backward's other-side operands share
    /// one buffer, and the rounding of a float to the storage type's bits.
    fn tensor_core_constants(&self, pass: Pass) -> String {
        let (convert, bits) = match self.dtype {
            DType::BF16 => ("__float2bfloat16_rn", "__bfloat16_as_ushort"),
            _ => ("__float2half_rn", "__half_as_ushort"),
        };
        let mut s = String::new();
        if pass == Pass::Backward {
            s.push_str(&format!("constexpr bool ZP_SPLIT = {};\n", self.split_dk_dv()));
            s.push_str(&format!("constexpr bool ZP_ONE_BUFFER = {};\n", self.one_operand_buffer()));
        }
        s.push_str(&format!(
            "__device__ __forceinline__ unsigned short zp_bits(float x) {{ return {bits}({convert}(x)); }}\n"
        ));
        s
    }
}

#[cfg(test)]
mod tests;
