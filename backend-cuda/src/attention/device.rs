//! Loading a rendered attention pass and launching it through cudarc's
//! driver API, on device pointers (what the runtime holds in its arenas).
//! Never called without a driver: a [`CudaDevice`] exists only where one is.

use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg, sys::CUdeviceptr};
use cudarc::nvrtc::Ptx;

use super::{AttentionArgs, AttentionKernel, AttentionShape, Entry, Pass, RenderedAttention};
use crate::driver::{CudaDevice, DeviceError};

/// The pointers of the forward: `q, k, v` read, `mask[B, S]` read, `out`
/// (`[B, H, S, D]`, the storage dtype) and `lse` (`[B, H, S]`, f32) written.
#[derive(Clone, Copy, Debug)]
pub struct ForwardTensors {
    /// The queries, `[B, H, S, D]`.
    pub q: CUdeviceptr,
    /// The keys, `[B, H, S, D]`.
    pub k: CUdeviceptr,
    /// The values, `[B, H, S, D]`.
    pub v: CUdeviceptr,
    /// The padding mask, `[B, S]`: 0 where a key is masked.
    pub mask: CUdeviceptr,
    /// The attention's output, `[B, H, S, D]`.
    pub out: CUdeviceptr,
    /// The log-sum-exp of each score row, `[B, H, S]` f32, from which the
    /// backward recomputes the probabilities.
    pub lse: CUdeviceptr,
    /// Dropout's Philox seed and counter word, two `u64`s the kernels read
    /// when they run (not launch arguments: a recorded CUDA graph replays
    /// with each step's).
    pub rng: CUdeviceptr,
}

/// The pointers of the backward: the forward's tensors and `dout` read,
/// `dq, dk, dv` written.
#[derive(Clone, Copy, Debug)]
pub struct BackwardTensors {
    /// The forward's operands and outputs, all read.
    pub forward: ForwardTensors,
    /// The gradient of `out`.
    pub dout: CUdeviceptr,
    /// Where the gradient of `q` is written.
    pub dq: CUdeviceptr,
    /// Where the gradient of `k` is written.
    pub dk: CUdeviceptr,
    /// Where the gradient of `v` is written.
    pub dv: CUdeviceptr,
}

/// A pass's kernels, loaded on one device.
pub struct LoadedAttention {
    kernel: AttentionKernel,
    pass: Pass,
    functions: Vec<(Entry, CudaFunction)>,
}

impl LoadedAttention {
    /// Whether its kernels draw dropout masks (read the `rng` words).
    pub fn draws_masks(&self) -> bool {
        self.kernel.dropout
    }

    /// Loads `ptx` (NVRTC's output for `rendered.source`) on `device`.
    pub fn load(device: &CudaDevice, rendered: &RenderedAttention, ptx: &str) -> Result<LoadedAttention, DeviceError> {
        let module = device.context().load_module(Ptx::from_src(ptx.to_string()))?;
        let functions = rendered
            .entries
            .iter()
            .map(|(entry, symbol)| Ok((*entry, module.load_function(symbol)?)))
            .collect::<Result<_, DeviceError>>()?;
        Ok(LoadedAttention { kernel: rendered.kernel, pass: rendered.pass, functions })
    }

    fn mismatch(&self, message: String) -> DeviceError {
        DeviceError::Buffers { kernel: self.kernel.symbol(self.pass.entries()[0]), message }
    }

    /// Queues the forward over `[batch, args.heads, args.seq, D]`.
    ///
    /// # Safety
    /// Each pointer addresses its tensor on this device, of the kernel's
    /// dtypes and the shape the arguments give, valid until the stream ran it.
    pub unsafe fn forward(
        &self,
        device: &CudaDevice,
        stream: &CudaStream,
        t: &ForwardTensors,
        batch: usize,
        args: &AttentionArgs,
    ) -> Result<(), DeviceError> {
        if self.pass != Pass::Forward {
            return Err(self.mismatch("the backward's kernels were asked for the forward".into()));
        }
        // SAFETY: the caller's contract.
        unsafe { self.launch(device, stream, &[t.q, t.k, t.v, t.mask, t.out, t.lse], &[], t.rng, batch, args) }
    }

    /// Queues the backward (dQ, then dK/dV).
    ///
    /// # Safety
    /// As [`LoadedAttention::forward`]; `out` and `lse` are the forward's.
    pub unsafe fn backward(
        &self,
        device: &CudaDevice,
        stream: &CudaStream,
        t: &BackwardTensors,
        batch: usize,
        args: &AttentionArgs,
    ) -> Result<(), DeviceError> {
        if self.pass != Pass::Backward {
            return Err(self.mismatch("the forward's kernel was asked for the backward".into()));
        }
        let f = &t.forward;
        let read = [f.q, f.k, f.v, f.mask, f.out, f.lse, t.dout];
        // SAFETY: the caller's contract.
        unsafe { self.launch(device, stream, &read, &[t.dq, t.dk, t.dv], f.rng, batch, args) }
    }

    /// Launches each entry with `read` then its own outputs (`written`:
    /// dq for dQ, dk and dv for dK/dV), then the scalars and `rng`. The tensor-core
    /// kernels stage `q, k, v, dout` 16 bytes at a time and store two
    /// values at a time: every tensor but the mask and `lse` must start
    /// 16-byte aligned (the planner's arenas align to 256).
    #[allow(clippy::too_many_arguments)] // the kernels' parameters, by kind
    unsafe fn launch(
        &self,
        device: &CudaDevice,
        stream: &CudaStream,
        read: &[CUdeviceptr],
        written: &[CUdeviceptr],
        rng: CUdeviceptr,
        batch: usize,
        a: &AttentionArgs,
    ) -> Result<(), DeviceError> {
        let shape = self
            .kernel
            .launch(
                self.pass,
                AttentionShape { batch, heads: a.heads.max(0) as usize, seq: a.seq.max(0) as usize },
                device.properties(),
            )
            .map_err(|e| self.mismatch(e.to_string()))?;
        if self.kernel.tensor_cores {
            // read: q, k, v, mask, out, lse[, dout]
            let storage = read.iter().enumerate().filter(|(i, _)| !matches!(i, 3 | 5)).map(|(_, p)| p);
            if let Some(p) = storage.chain(written).find(|&&p| p % 16 != 0) {
                return Err(self.mismatch(format!("a tensor at {p:#x} is not 16-byte aligned")));
            }
        }
        for (l, (entry, function)) in shape.kernels.iter().zip(&self.functions) {
            let mut builder = stream.launch_builder(function);
            for p in read {
                builder.arg(p);
            }
            let outputs = match entry {
                Entry::Forward => &[][..],
                Entry::BackwardDq => &written[..1],
                Entry::BackwardDkDv => &written[1..],
            };
            for p in outputs {
                builder.arg(p);
            }
            builder.arg(&a.heads).arg(&a.seq).arg(&a.scale).arg(&a.head_offset).arg(&a.total_heads);
            builder.arg(&a.keep_threshold).arg(&a.keep_scale).arg(&a.stream).arg(&rng);
            let config = cudarc::driver::LaunchConfig {
                grid_dim: (l.grid.0, l.grid.1, 1),
                block_dim: (l.block, 1, 1),
                shared_mem_bytes: 0, // static shared memory only
            };
            // SAFETY: the arguments follow the entry's signature (see the
            // module's docs); the caller vouches for the pointers.
            unsafe { builder.launch(config) }?;
        }
        Ok(())
    }
}
