//! Row-major batched GEMMs through cuBLAS (`cublasGemmStridedBatchedEx`).
//!
//! The plan's matmuls are row-major; cuBLAS is column-major. A row-major
//! `C = op(A)·op(B)` is the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`, and a stored
//! row-major matrix read column-major is its transpose, so the call swaps A
//! and B and keeps each operand's flag: no copy, no transpose kernel.
//!
//! Batches come as the host runtime resolves them (`MatMulShape::batches`:
//! per output matrix, the A and B matrix it reads, NumPy broadcasting over
//! the leading axes). Where they step evenly (each operand advances by one
//! matrix per batch or not at all) it is one strided-batched call; otherwise
//! one call per batch. Accumulation is in f32 (`CUBLAS_COMPUTE_32F`, TF32
//! off: pedantic math), so an f32 product matches the host's to rounding and
//! a 16-bit one is rounded once, as the host runtime rounds it.
//!
//! `epilogue.rs` and `lt.rs`: the same products through cuBLASLt
//! ([`BlasLt`], [`LtGemm`]) with bias, GELU and their backward epilogues
//! (the bias gradient, GELU's derivative) fused into the GEMM.

mod epilogue;
mod lt;

pub use epilogue::{Epilogue, LtExtra, LtGemm, LtLayout, LtPlan};
pub use lt::{BlasLt, LtPointers, pointer_alignment};

use std::ffi::{c_int, c_longlong, c_void};
use std::sync::Arc;

use cudarc::cublas::result::{self, CublasError};
use cudarc::cublas::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use zeroplan_ir::DType;

/// Why cuBLAS is unavailable or refused a product.
#[derive(Debug, thiserror::Error)]
pub enum GemmError {
    /// The cuBLAS library could not be loaded.
    #[error("cuBLAS is not available: no libcublas on the library search path (LD_LIBRARY_PATH, ldconfig)")]
    Missing,
    /// The cuBLASLt library could not be loaded.
    #[error("cuBLASLt is not available: no libcublasLt on the library search path (LD_LIBRARY_PATH, ldconfig)")]
    LtMissing,
    /// A cuBLAS call returned an error.
    #[error("cuBLAS failed: {0:?}")]
    Cublas(#[from] CublasError),
    /// A cuBLASLt call returned an error.
    #[error("cuBLASLt failed: {0:?}")]
    CublasLt(#[from] cudarc::cublaslt::result::CublasError),
    /// A product the backend does not run: what it is.
    #[error("not supported on CUDA yet: {0}")]
    Unsupported(String),
}

/// One matmul, row-major: `batches.len()` products of `m×k` by `k×n`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm<'a> {
    /// Rows of each product (and of `op(A)`).
    pub m: usize,
    /// Columns of each product (and of `op(B)`).
    pub n: usize,
    /// The summed dimension: columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// Whether A is stored transposed, `[k, m]`.
    pub transpose_a: bool,
    /// Whether B is stored transposed, `[n, k]`.
    pub transpose_b: bool,
    /// Per output matrix, the index of the A and the B matrix it reads.
    pub batches: &'a [(usize, usize)],
    /// The storage type of A, B and C (one for all three).
    pub dtype: DType,
}

impl Gemm<'_> {
    /// The cuBLAS data type of the operands; an error for types it has no GEMM for.
    fn data_type(&self) -> Result<sys::cudaDataType, GemmError> {
        match self.dtype {
            DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
            DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
            DType::F16 => Ok(sys::cudaDataType::CUDA_R_16F),
            other => Err(GemmError::Unsupported(format!("a matmul of {other:?} operands"))),
        }
    }

    /// `(a_step, b_step)` in matrices per batch when every batch `i` reads
    /// A matrix `i·a_step` and B matrix `i·b_step` (steps 0 or 1).
    fn even_steps(&self) -> Option<(usize, usize)> {
        let steps = [(0, 0), (0, 1), (1, 0), (1, 1)];
        steps
            .into_iter()
            .find(|&(sa, sb)| self.batches.iter().enumerate().all(|(i, &(a, b))| a == i * sa && b == i * sb))
    }

    /// Checks the shape fits cuBLAS's `int` sizes; returns the cuBLAS calls
    /// it will make (one, or one per batch).
    pub fn check(&self) -> Result<usize, GemmError> {
        self.data_type()?;
        let int = |v: usize, what: &str| {
            c_int::try_from(v).map_err(|_| GemmError::Unsupported(format!("a matmul {what} of {v} (over 2³¹)")))
        };
        int(self.m, "dimension")?;
        int(self.n, "dimension")?;
        int(self.k, "dimension")?;
        int(self.batches.len(), "batch count")?;
        Ok(if self.even_steps().is_some() { 1 } else { self.batches.len() })
    }
}

/// A cuBLAS handle bound to one stream, with a workspace of its own.
pub struct Blas {
    handle: sys::cublasHandle_t,
    /// cuBLAS's workspace (`cublasSetWorkspace`): without one, a GEMM
    /// recorded into a CUDA graph may allocate through stream-ordered
    /// memory nodes (cuBLAS's documentation, "CUDA Graphs Support").
    _workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

// The handle is used from whichever thread holds the device; the runtime
// serialises its calls (one compute stream).
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Blas {
    /// A handle queuing its work on `stream`, in pedantic (no TF32) math.
    pub fn new(stream: Arc<CudaStream>) -> Result<Blas, GemmError> {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(GemmError::Missing);
        }
        stream.context().bind_to_thread().map_err(|e| GemmError::Unsupported(format!("binding the context: {e:?}")))?;
        let bytes = lt::workspace_bytes(&stream)?;
        // SAFETY: scratch cuBLAS overwrites; never read uninitialised by us.
        let workspace = unsafe { stream.alloc::<u8>(bytes) }
            .map_err(|e| GemmError::Unsupported(format!("allocating the cuBLAS workspace: {e:?}")))?;
        let workspace_ptr = workspace.device_ptr(&stream).0;
        let handle = result::create_handle()?;
        let blas = Blas { handle, _workspace: workspace, stream };
        // SAFETY: a live handle and stream of the bound context; the
        // workspace lives as long as the handle.
        unsafe {
            result::set_stream(handle, blas.stream.cu_stream() as _)?;
            sys::cublasSetWorkspace_v2(handle, workspace_ptr as *mut c_void, bytes).result()?;
            sys::cublasSetMathMode(handle, sys::cublasMath_t::CUBLAS_PEDANTIC_MATH).result()?;
        }
        Ok(blas)
    }

    /// Queues `c = a·b` (every batch) on the handle's stream.
    ///
    /// # Safety
    /// `a`, `b`, `c` are device pointers holding the matrices `g` names, of
    /// `g.dtype`; `c` overlaps neither; all stay valid until the stream ran it.
    pub unsafe fn gemm(&self, g: &Gemm<'_>, a: u64, b: u64, c: u64) -> Result<(), GemmError> {
        self.stream.context().bind_to_thread().map_err(|e| GemmError::Unsupported(format!("{e:?}")))?;
        let ty = g.data_type()?;
        g.check()?;
        let (m, n, k) = (g.m as c_int, g.n as c_int, g.k as c_int);
        let op = |t: bool| if t { sys::cublasOperation_t::CUBLAS_OP_T } else { sys::cublasOperation_t::CUBLAS_OP_N };
        // Column-major: C'(n×m) = B'(n×k)·A'(k×m), B' and A' the stored operands read column-major.
        let ldb = if g.transpose_b { k } else { n };
        let lda = if g.transpose_a { m } else { k };
        let size = g.dtype.size_bytes();
        let (a_mat, b_mat, c_mat) = (g.m * g.k, g.k * g.n, g.m * g.n);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let call = |a: u64, b: u64, c: u64, stride_a: usize, stride_b: usize, count: usize| {
            // SAFETY: the caller's contract; the sizes were checked to fit `int`.
            unsafe {
                result::gemm_strided_batched_ex(
                    self.handle,
                    op(g.transpose_b),
                    op(g.transpose_a),
                    n,
                    m,
                    k,
                    (&alpha as *const f32).cast::<c_void>(),
                    b as *const c_void,
                    ty,
                    ldb,
                    stride_b as c_longlong,
                    a as *const c_void,
                    ty,
                    lda,
                    stride_a as c_longlong,
                    (&beta as *const f32).cast::<c_void>(),
                    c as *mut c_void,
                    ty,
                    n,
                    c_mat as c_longlong,
                    count as c_int,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
        };
        match g.even_steps() {
            Some((sa, sb)) => call(a, b, c, sa * a_mat, sb * b_mat, g.batches.len())?,
            None => {
                for (i, &(ia, ib)) in g.batches.iter().enumerate() {
                    let at = |base: u64, index: usize, mat: usize| base + (index * mat) as u64 * size;
                    call(at(a, ia, a_mat), at(b, ib, b_mat), at(c, i, c_mat), 0, 0, 1)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once; a failure here leaves nothing to undo.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(batches: &[(usize, usize)]) -> Gemm<'_> {
        Gemm { m: 2, n: 3, k: 4, transpose_a: false, transpose_b: true, batches, dtype: DType::F32 }
    }

    #[test]
    fn even_batches_are_one_call() {
        assert_eq!(gemm(&[(0, 0)]).check().unwrap(), 1);
        assert_eq!(gemm(&[(0, 0), (1, 1), (2, 2)]).check().unwrap(), 1);
        assert_eq!(gemm(&[(0, 0), (1, 0), (2, 0)]).even_steps(), Some((1, 0)));
        assert_eq!(gemm(&[(0, 0), (0, 1)]).even_steps(), Some((0, 1)));
    }

    #[test]
    fn uneven_batches_are_one_call_each() {
        // [2,1]×[1,2] broadcast: A index 0,0,1,1, B index 0,1,0,1.
        assert_eq!(gemm(&[(0, 0), (0, 1), (1, 0), (1, 1)]).check().unwrap(), 4);
    }

    #[test]
    fn integer_and_huge_products_are_typed_errors() {
        let ints = Gemm { dtype: DType::I64, ..gemm(&[(0, 0)]) };
        assert!(ints.check().unwrap_err().to_string().contains("not supported on CUDA yet"));
        let huge = Gemm { m: 1 << 31, ..gemm(&[(0, 0)]) };
        assert!(matches!(huge.check(), Err(GemmError::Unsupported(_))));
    }
}
