//! Fused attention on a CUDA rank.
//!
//! The IR's `FlashAttention` / `FlashAttentionGrad` run as
//! `zeroplan-backend-cuda`'s FlashAttention-2-style kernels over device
//! pointers (`attention/` there: one block per 16 or 64 rows of a head, key tiles
//! in shared memory, no `[B, H, S, S]` tensor) wherever the template covers
//! the instruction: operands on the device, head dim 32 or 64, f32 / bf16 /
//! f16 storage, or head dim 128 with bf16 / f16 on sm_80+ (where bf16 and
//! f16 run on tensor cores: `FlashAttention::kernel` decides from the
//! device's properties). Anything else keeps the host routine on a staging
//! copy (`exec::staged`), so every plan still runs.
//!
//! Selection rewrites such an instruction into an [`Instr::Kernel`] whose
//! kernel is [`CudaKernel::Attention`]: the runner's hazards and profiles
//! treat it as any kernel (its operands read, its outputs written).

use std::collections::HashMap;
use std::sync::Arc;

use crate::attention::{AttentionArgs, AttentionShape, BackwardTensors, ForwardTensors, LoadedAttention, Pass};
use crate::{AttentionKernel, CudaDevice, CudaKernelCompiler, FlashAttention};
use zeroplan_ir::{Graph, Op, Place};

use super::{Cuda, CudaKernel};
use zeroplan_exec::Instr;
use zeroplan_exec::{Buf, Ctx, Rank, Rewrites, SelectError, Step};

/// One fused-attention instruction's kernels and its arguments but the
/// step's Philox seed and offset.
pub struct DeviceAttention {
    loaded: Arc<LoadedAttention>,
    pass: Pass,
    batch: usize,
    args: AttentionArgs,
}

impl DeviceAttention {
    /// Whether it draws dropout masks.
    pub fn draws_masks(&self) -> bool {
        self.loaded.draws_masks()
    }

    pub fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "flash_attention",
            Pass::Backward => "flash_attention_grad",
        }
    }
}

/// Rewrites every fused-attention step the template covers into a device
/// kernel, compiling (NVRTC, disk-cached) and loading each specialisation
/// once.
pub fn select(
    graph: &Graph,
    steps: &mut [Step<Instr<CudaKernel>>],
    rank: Rank,
    gpu: &CudaDevice,
    compiler: &mut CudaKernelCompiler,
) -> Result<Rewrites, SelectError> {
    let mut done = Rewrites::default();
    let mut loaded: HashMap<(AttentionKernel, Pass), Arc<LoadedAttention>> = HashMap::new();
    for step in steps.iter_mut() {
        let (attention, inputs, outputs, pass) = match &step.instr {
            Some(Instr::FlashAttention { attention, inputs, outputs }) => {
                (attention, inputs.to_vec(), outputs.to_vec(), Pass::Forward)
            }
            Some(Instr::FlashAttentionGrad { attention, inputs, outputs }) => {
                (attention, inputs.to_vec(), outputs.to_vec(), Pass::Backward)
            }
            _ => continue,
        };
        let node = graph.node(step.node);
        let unsupported =
            |message: String| SelectError::Node { node: node.name.to_string(), op: node.op.name(), message };
        let (Op::FlashAttention { scale, alibi_ranks, dropout, stream }
        | Op::FlashAttentionGrad { scale, alibi_ranks, dropout, stream }) = node.op
        else {
            return Err(unsupported("a fused-attention instruction of another op".into()));
        };
        let mut leave = |why: &str| done.left.push((node.name.to_string(), why.to_string()));
        if inputs.iter().chain(&outputs).any(|b| b.place != Place::Device) {
            leave("offloaded operands: the staged host routine");
            continue;
        }
        let [batch, heads, seq, head_dim] = attention.dims;
        let op = FlashAttention { scale, alibi_ranks, dropout, stream };
        let Ok(mut kernel) = op.kernel(head_dim, inputs[0].dtype, inputs[3].dtype, gpu.properties()) else {
            leave("a head dim or dtype the template lacks: the staged host routine");
            continue;
        };
        // The tensor-core kernels move the 16-bit tensors 16 bytes at a
        // time (the arena is 256-byte aligned): a tensor off a 16-byte
        // boundary takes the CUDA-core kernels, which have no head dim 128.
        let misaligned = inputs.iter().chain(&outputs).any(|b| b.dtype.size_bytes() == 2 && b.offset % 16 != 0);
        if kernel.tensor_cores && misaligned {
            kernel.tensor_cores = false;
            if kernel.check().is_err() {
                leave(
                    "a 16-bit tensor off a 16-byte boundary at a head dim only tensor cores serve: the staged host routine",
                );
                continue;
            }
        }
        let shape = AttentionShape { batch, heads, seq };
        let args = op.args(&kernel, shape, rank.tensor as u64).map_err(|e| unsupported(e.to_string()))?;
        kernel.launch(pass, shape, gpu.properties()).map_err(|e| unsupported(e.to_string()))?;
        let loaded = match loaded.get(&(kernel, pass)) {
            Some(done) => Arc::clone(done),
            None => {
                let compiled = compiler.compile_attention(&kernel, pass).map_err(|e| unsupported(e.to_string()))?;
                let done = Arc::new(
                    LoadedAttention::load(gpu, &compiled.rendered, &compiled.ptx)
                        .map_err(|e| unsupported(e.to_string()))?,
                );
                loaded.insert((kernel, pass), Arc::clone(&done));
                done
            }
        };
        let kernel = CudaKernel::Attention(Arc::new(DeviceAttention { loaded, pass, batch, args }));
        step.instr = Some(Instr::Kernel { kernel, inputs, outputs });
        done.taken += 1;
    }
    Ok(done)
}

/// Queues `a` on the compute stream with the step's Philox seed and offset
/// in the device's words (the ones the generated dropout kernels read, so
/// masks agree).
pub fn run(cuda: &Cuda, a: &DeviceAttention, inputs: &[Buf], outputs: &[Buf], cx: &Ctx) -> Result<(), String> {
    let ptr = |b: &Buf| cuda.memory.device_ptr(*b);
    if a.draws_masks() {
        cuda.rng.set(&cuda.compute, cx.seed, cx.offset)?;
    }
    let forward = ForwardTensors {
        q: ptr(&inputs[0]),
        k: ptr(&inputs[1]),
        v: ptr(&inputs[2]),
        mask: ptr(&inputs[3]),
        out: ptr(if a.pass == Pass::Forward { &outputs[0] } else { &inputs[4] }),
        lse: ptr(if a.pass == Pass::Forward { &outputs[1] } else { &inputs[5] }),
        rng: cuda.rng.ptr(),
    };
    // SAFETY: selection checked every operand lies on the device with the
    // dtypes the kernel was rendered for, at the shape of its arguments; the
    // arenas outlive the stream's work.
    let queued = unsafe {
        match a.pass {
            Pass::Forward => a.loaded.forward(&cuda.gpu, &cuda.compute, &forward, a.batch, &a.args),
            Pass::Backward => {
                let t = BackwardTensors {
                    forward,
                    dout: ptr(&inputs[6]),
                    dq: ptr(&outputs[0]),
                    dk: ptr(&outputs[1]),
                    dv: ptr(&outputs[2]),
                };
                a.loaded.backward(&cuda.gpu, &cuda.compute, &t, a.batch, &a.args)
            }
        }
    };
    queued.map_err(|e| e.to_string())
}
