//! Fused row kernels ([`zeroplan_ir::kernel::Kernel`]) JIT-compiled to native
//! code by Cranelift.
//!
//! [`KernelCompiler::compile`] binds a kernel's shape to concrete `dims` and
//! generates one function for it (see `codegen.rs` for its shape and ABI),
//! or reuses one any compiler of this process made and someone still holds;
//! [`CompiledKernel::launch`] runs it over every row, on rayon's threads when
//! the kernel is big enough (`launch.rs`).
//!
//! - **Precision**: per-element arithmetic in `f32`, four columns per
//!   `f32x4`; reductions accumulate `f32` lane-wise partials; cross-row
//!   outputs accumulate in `f64`, deterministically. Launch-uniform
//!   expressions (AdamW's `1 − β^t`) are computed once in `f64` by the
//!   interpreter's own functions. `exp`/`tanh`/`erf` are inline polynomial
//!   approximations (`math.rs` states their measured errors).
//! - **Storage**: inputs f32/bf16/f16/i32/i64, outputs f32/bf16/f16, each
//!   row-major over its own axes; bf16/f16 round to nearest even on store.
//! - **Dropout** is bit-exact with the interpreter (`dropout.rs`).
//!
//! Shape binding, expression classes and sweeps come from
//! [`zeroplan_ir::kernel::layout`]. Files: `codegen.rs` (IR → Cranelift),
//! `math.rs` (approximations), `storage.rs` (dtype conversions),
//! `dropout.rs` (Philox), `simd.rs` (vector helpers), `libcalls.rs` (Rust
//! functions the code calls), `launch.rs` (threads and partial sums).

mod codegen;
mod dropout;
mod launch;
mod libcalls;
mod math;
mod simd;
mod storage;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cranelift_jit::JITModule;
use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::kernel::layout::Layout;

/// Why a kernel cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The kernel fails [`Kernel::check`].
    #[error("kernel `{kernel}` is malformed: {message}")]
    Invalid {
        /// The kernel's name.
        kernel: String,
        /// What the check found.
        message: String,
    },
    /// `dims` do not fit the kernel's shape.
    #[error("kernel `{kernel}`: {message}")]
    Dims {
        /// The kernel's name.
        kernel: String,
        /// Which dim does not fit, and how.
        message: String,
    },
    /// Cranelift could not compile the function.
    #[error("kernel `{kernel}`: Cranelift failed: {message}")]
    Cranelift {
        /// The kernel's name.
        kernel: String,
        /// Cranelift's error.
        message: String,
    },
    /// Cranelift cannot generate code for this machine.
    #[error("Cranelift cannot target this host: {0}")]
    Host(String),
}

/// Compiles kernels once and keeps them (in memory) for the plan's life.
///
/// Each kernel gets its own JIT module, owned by its [`CompiledKernel`], so
/// a kernel's code lives exactly as long as someone holds it. A kernel some
/// other compiler of this process compiled and is still held (another rank
/// loaded as a thread of this process, say) is reused rather than compiled
/// again: Cranelift's compile is most of a program's load. `Send + Sync`.
#[derive(Default)]
pub struct KernelCompiler {
    /// `(kernel text, dims)` → the compiled kernel.
    cache: HashMap<Key, Arc<CompiledKernel>>,
}

/// A compiled kernel's identity: its IR as text and the dims it is bound to.
type Key = (String, Vec<usize>);

/// The kernels compiled in this process, by [`Key`], while someone holds
/// them; pruned of dead entries whenever it doubles.
struct Shared {
    kernels: HashMap<Key, Weak<CompiledKernel>>,
    prune_at: usize,
}

fn shared() -> &'static Mutex<Shared> {
    static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| Mutex::new(Shared { kernels: HashMap::new(), prune_at: 256 }))
}

impl Shared {
    fn get(&self, key: &Key) -> Option<Arc<CompiledKernel>> {
        self.kernels.get(key).and_then(Weak::upgrade)
    }

    fn insert(&mut self, key: Key, kernel: &Arc<CompiledKernel>) {
        if self.kernels.len() >= self.prune_at {
            self.kernels.retain(|_, k| k.strong_count() > 0);
            self.prune_at = (2 * self.kernels.len()).max(256);
        }
        self.kernels.insert(key, Arc::downgrade(kernel));
    }
}

/// A kernel compiled for one set of dims.
pub struct CompiledKernel {
    name: String,
    layout: Layout,
    chunk_rows: usize,
    entry: codegen::Entry,
    /// Owns the code `entry` points into; freed on drop. Behind a mutex only
    /// so the kernel is `Sync` (a `JITModule` is `Send`); nothing locks it
    /// before drop.
    module: Mutex<Option<JITModule>>,
}

impl KernelCompiler {
    /// An empty compiler, once Cranelift is known to target this host.
    pub fn new() -> Result<KernelCompiler, CodegenError> {
        crate::host_isa().map_err(|e| CodegenError::Host(e.to_string()))?;
        Ok(KernelCompiler::default())
    }

    /// Native code for `kernel` with its symbols bound: `dims` is the
    /// kernel's concrete shape (`kernel.shape` with batch/seq bound).
    /// Compiling the same (kernel, dims) twice returns the cached one (keyed
    /// by `kernel.to_text()` and `dims`), as does compiling one that another
    /// compiler of this process compiled and someone still holds. The text
    /// is the whole IR, so equal keys are the same code.
    pub fn compile(&mut self, kernel: &Kernel, dims: &[usize]) -> Result<Arc<CompiledKernel>, CodegenError> {
        let key = (kernel.to_text(), dims.to_vec());
        if let Some(k) = self.cache.get(&key) {
            return Ok(Arc::clone(k));
        }
        let held = shared().lock().unwrap_or_else(|e| e.into_inner()).get(&key);
        if let Some(k) = held {
            self.cache.insert(key, Arc::clone(&k));
            return Ok(k);
        }
        let name = kernel.name.clone();
        kernel.check().map_err(|message| CodegenError::Invalid { kernel: name.clone(), message })?;
        let split = launch::split_long_rows(kernel, dims);
        let (kernel, dims) = split.as_ref().map_or((kernel, dims), |(k, d)| (k, d.as_slice()));
        let layout =
            Layout::bind(kernel, dims).map_err(|message| CodegenError::Dims { kernel: name.clone(), message })?;
        let (module, entry) = codegen::generate(kernel, &layout)
            .map_err(|message| CodegenError::Cranelift { kernel: name.clone(), message })?;
        let chunk_rows = launch::chunk_rows(&layout);
        let compiled = Arc::new(CompiledKernel { name, layout, chunk_rows, entry, module: Mutex::new(Some(module)) });
        shared().lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), &compiled);
        self.cache.insert(key, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// How many distinct (kernel, dims) this compiler holds.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether it holds no kernel yet.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

impl CompiledKernel {
    /// Runs the kernel over all rows. `inputs[i]` points at input `i`'s data
    /// (the dtype of `kernel.inputs[i].ty`: f32, bf16, f16, i32 or i64;
    /// row-major over its own axes' dims); `outputs[k]` at output `k`'s (f32,
    /// bf16 or f16). Cross-row outputs are overwritten (not accumulated into)
    /// with the sum over the omitted axes. `seed`, `offset`: dropout's key and
    /// counter word (`zeroplan_ir::interp::random`). No alignment is needed.
    ///
    /// Panics if the pointer counts differ from the kernel's operand counts.
    ///
    /// # Safety
    /// Every pointer is valid for its operand's size. An output may alias an
    /// input of the same shape and dtype (in-place); outputs never alias
    /// each other or other inputs.
    pub unsafe fn launch(&self, inputs: &[*const u8], outputs: &[*mut u8], seed: u64, offset: u64) {
        assert_eq!(inputs.len(), self.layout.inputs.len(), "kernel `{}`: input count", self.name);
        assert_eq!(outputs.len(), self.layout.outputs.len(), "kernel `{}`: output count", self.name);
        // SAFETY: forwarded from the caller.
        unsafe { launch::run(self.entry, &self.layout, self.chunk_rows, inputs, outputs, seed, offset) }
    }

    /// The kernel IR's name, as profiles and errors show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element count of each input, in its own shape.
    pub fn input_lens(&self) -> Vec<usize> {
        self.layout.inputs.iter().map(|a| a.len).collect()
    }

    /// The element count of each output.
    pub fn output_lens(&self) -> Vec<usize> {
        self.layout.outputs.iter().map(|a| a.len).collect()
    }
}

impl std::fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledKernel")
            .field("name", &self.name)
            .field("dims", &self.layout.shape)
            .finish_non_exhaustive()
    }
}

impl Drop for CompiledKernel {
    fn drop(&mut self) {
        let module = self.module.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(module) = module {
            // SAFETY: `entry` points into this module and dies with `self`;
            // no launch can be running, as it would hold `&self`.
            unsafe { module.free_memory() };
        }
    }
}
