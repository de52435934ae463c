//! The cuBLASLt call for an [`LtPlan`]: descriptors, the heuristic's
//! algorithm, `cublasLtMatmul` on the handle's stream. Compiled everywhere,
//! run only on a GPU (cudarc loads `libcublasLt` at run time; [`BlasLt::new`]
//! checks it is there before any call).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::result;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::GemmError;
use super::epilogue::{LtGemm, LtLayout, LtPlan};

/// The device pointers of one product: `a`, `b` read, `d` written; the
/// bias vector and the aux matrix when the epilogue uses them.
#[derive(Clone, Copy, Debug, Default)]
pub struct LtPointers {
    /// Our A (row-major), read.
    pub a: u64,
    /// Our B (row-major), read.
    pub b: u64,
    /// The product, written.
    pub d: u64,
    /// The bias vector, or the bias gradient the epilogue writes.
    pub bias: Option<u64>,
    /// The aux matrix: the pre-activation a GELU keeps, or reads back.
    pub aux: Option<u64>,
}

/// A cuBLASLt handle on one stream, with its workspace.
pub struct BlasLt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// The workspace's address, taken once: cudarc's per-use event
    /// tracking would record and wait on events in every call, which a
    /// CUDA graph's recording must not see (one stream uses it, in order).
    workspace_ptr: u64,
    stream: Arc<CudaStream>,
}

// As `Blas`: the runtime serialises calls on its compute stream.
unsafe impl Send for BlasLt {}
unsafe impl Sync for BlasLt {}

/// cuBLAS(Lt)'s recommended workspace on Hopper (32 MiB; 4 MiB before it).
pub(super) fn workspace_bytes(stream: &CudaStream) -> Result<usize, GemmError> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let major = stream
        .context()
        .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| GemmError::Unsupported(format!("reading the compute capability: {e:?}")))?;
    Ok(if major >= 9 { 32 << 20 } else { 4 << 20 })
}

/// Descriptors destroyed when dropped, whatever happens between.
struct Layout(sys::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created once by `layout`, destroyed once here.
        let _ = unsafe { result::destroy_matrix_layout(self.0) };
    }
}
struct Desc(sys::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: as above.
        let _ = unsafe { result::destroy_matmul_desc(self.0) };
    }
}
struct Pref(sys::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: as above.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

fn layout(data_type: sys::cudaDataType, l: &LtLayout, batch: i32) -> Result<Layout, GemmError> {
    use sys::cublasLtMatrixLayoutAttribute_t as A;
    let layout = Layout(result::create_matrix_layout(data_type, l.rows, l.cols, l.ld)?);
    if batch > 1 {
        // SAFETY: a live layout; the values outlive the calls, sizes match their types.
        unsafe {
            result::set_matrix_layout_attribute(layout.0, A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, ptr(&batch), 4)?;
            result::set_matrix_layout_attribute(
                layout.0,
                A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                ptr(&l.batch_stride),
                8,
            )?;
        }
    }
    Ok(layout)
}

fn ptr<T>(value: &T) -> *const c_void {
    (value as *const T).cast()
}

/// Sets one attribute of `desc` to `value`.
///
/// # Safety
/// `desc` is live; `T` is the attribute's documented type.
unsafe fn set<T>(desc: &Desc, attribute: sys::cublasLtMatmulDescAttributes_t, value: &T) -> Result<(), GemmError> {
    // SAFETY: the caller's contract; the size is `T`'s.
    unsafe { result::set_matmul_desc_attribute(desc.0, attribute, ptr(value), std::mem::size_of::<T>()) }?;
    Ok(())
}

/// The alignment cuBLASLt may assume of a device pointer: its largest
/// power-of-two divisor, capped at the 256 bytes the heuristic assumes by
/// default (`CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES`). Operands at a
/// plan's offsets (views into a buffer) can be less aligned than an
/// allocation; telling the heuristic keeps it from an algorithm that needs
/// more.
pub fn pointer_alignment(ptr: u64) -> u32 {
    if ptr == 0 { 256 } else { 1u32 << ptr.trailing_zeros().min(8) }
}

/// One product's descriptors and the heuristic's algorithm for them.
struct Prepared {
    desc: Desc,
    layouts: [Layout; 3],
    heuristic: sys::cublasLtMatmulHeuristicResult_t,
}

impl BlasLt {
    /// A handle queuing its work on `stream`, with its own workspace.
    pub fn new(stream: Arc<CudaStream>) -> Result<BlasLt, GemmError> {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(GemmError::LtMissing);
        }
        stream.context().bind_to_thread().map_err(|e| GemmError::Unsupported(format!("binding the context: {e:?}")))?;
        let bytes = workspace_bytes(&stream)?;
        // SAFETY: the workspace is scratch cuBLASLt overwrites; never read uninitialised by us.
        let workspace = unsafe { stream.alloc::<u8>(bytes) }
            .map_err(|e| GemmError::Unsupported(format!("allocating the cuBLASLt workspace: {e:?}")))?;
        let handle = result::create_handle()?;
        let workspace_ptr = workspace.device_ptr(&stream).0;
        Ok(BlasLt { handle, workspace, workspace_ptr, stream })
    }

    /// Whether cuBLASLt has an algorithm for `g` at the alignments of `p`'s
    /// pointers (nothing is queued): a caller with another way to run the
    /// product asks this once, when it loads, rather than fail at run time.
    pub fn check(&self, g: &LtGemm<'_>, p: &LtPointers) -> Result<(), GemmError> {
        self.prepare(g, p).map(|_| ())
    }

    /// Descriptors, layouts and the heuristic's algorithm for `g` with `p`'s
    /// pointers (the epilogue's, and the alignments of all).
    fn prepare(&self, g: &LtGemm<'_>, p: &LtPointers) -> Result<Prepared, GemmError> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let plan: LtPlan = g.plan()?;
        let missing = |what: &str| GemmError::Unsupported(format!("the {what} pointer the epilogue needs is missing"));
        let bias = plan.bias.map(|_| p.bias.ok_or_else(|| missing("bias"))).transpose()?;
        let aux = plan.aux.map(|_| p.aux.ok_or_else(|| missing("aux"))).transpose()?;
        self.stream.context().bind_to_thread().map_err(|e| GemmError::Unsupported(format!("{e:?}")))?;
        let desc = Desc(result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )?);
        // cuBLASLt's TRANSA/TRANSB hold a cublasOperation_t (cuBLAS's enum).
        use cudarc::cublas::sys::cublasOperation_t as Op;
        let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
        // SAFETY: a live descriptor; each value has its attribute's type.
        unsafe {
            set(&desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &op(plan.transa))?;
            set(&desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &op(plan.transb))?;
            set(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &plan.epilogue)?;
            if let (Some(b), Some(ptr)) = (plan.bias, bias) {
                set(&desc, D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr)?;
                set(&desc, D::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &b.batch_stride)?;
            }
            if let (Some(x), Some(ptr)) = (plan.aux, aux) {
                set(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr)?;
                set(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(x.len as i64))?;
                set(&desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &x.batch_stride)?;
            }
        }
        let layouts = [
            layout(plan.data_type, &plan.a, plan.batch)?,
            layout(plan.data_type, &plan.b, plan.batch)?,
            layout(plan.data_type, &plan.d, plan.batch)?,
        ];
        let pref = Pref(result::create_matmul_pref()?);
        let size = self.workspace.len();
        // cuBLASLt's A is our B and its B our A; C is D (beta 0).
        let alignments = [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, pointer_alignment(p.b)),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, pointer_alignment(p.a)),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, pointer_alignment(p.d)),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, pointer_alignment(p.d)),
        ];
        // SAFETY: live handle and descriptors; each value has its attribute's type.
        let heuristic = unsafe {
            result::set_matmul_pref_attribute(
                pref.0,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                ptr(&size),
                std::mem::size_of::<usize>(),
            )?;
            for (attribute, bytes) in &alignments {
                result::set_matmul_pref_attribute(pref.0, *attribute, ptr(bytes), std::mem::size_of::<u32>())?;
            }
            let [a, b, d] = &layouts;
            result::get_matmul_algo_heuristic(self.handle, desc.0, a.0, b.0, d.0, d.0, pref.0)
        }
        .map_err(|e| {
            GemmError::Unsupported(format!(
                "cuBLASLt has no algorithm for this product with {:?} ({e:?}): use the plain GEMM",
                plan.epilogue
            ))
        })?;
        Ok(Prepared { desc, layouts, heuristic })
    }

    /// Queues `g` (product and epilogue) on the handle's stream, in f32
    /// accumulation without TF32.
    ///
    /// # Safety
    /// The pointers address the matrices and vectors `g`'s plan names, of
    /// its dtype, on this handle's device; `d` overlaps no input; all stay
    /// valid until the stream ran it.
    pub unsafe fn matmul(&self, g: &LtGemm<'_>, p: &LtPointers) -> Result<(), GemmError> {
        let Prepared { desc, layouts: [a, b, d], heuristic } = self.prepare(g, p)?;
        let (workspace, size) = (self.workspace_ptr, self.workspace.len());
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's contract for the pointers; C is D with beta 0.
        unsafe {
            result::matmul(
                self.handle,
                desc.0,
                ptr(&alpha),
                ptr(&beta),
                p.b as *const c_void,
                a.0,
                p.a as *const c_void,
                b.0,
                p.d as *const c_void,
                d.0,
                p.d as *mut c_void,
                d.0,
                &heuristic.algo,
                workspace as *mut c_void,
                size,
                self.stream.cu_stream() as _,
            )
        }?;
        Ok(())
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::pointer_alignment;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(pointer_alignment(0x7f00_0000_0000), 256);
        assert_eq!(pointer_alignment(0x7f00_0000_0080), 128);
        assert_eq!(pointer_alignment(0x7f00_0000_0104), 4);
        assert_eq!(pointer_alignment(0x7f00_0000_0102), 2);
    }
}
