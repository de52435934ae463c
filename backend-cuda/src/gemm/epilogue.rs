//! cuBLASLt matmuls with epilogues, planned without the driver: which
//! epilogue, which layouts, which extra pointers — plain data, unit-tested
//! here; `lt.rs` turns a plan into descriptors and the call.
//!
//! Row-major as [`Gemm`]: `C[m×n] = op(A)·op(B)`. cuBLASLt is column-major,
//! so the plan swaps the operands (its A is our B, its B our A) and computes
//! the column-major `Cᵀ[n×m]`. What each epilogue means in our row-major
//! terms, and the cuBLASLt epilogue it becomes:
//!
//! | [`Epilogue`] | row-major effect | cuBLASLt |
//! |---|---|---|
//! | `Default` | `C = op(A)·op(B)` | `DEFAULT` |
//! | `Bias` | `C[i][j] += bias[j]` (`bias[n]`, per output feature) | `BIAS` (length = rows of `Cᵀ`) |
//! | `Gelu { bias, aux }` | `C = gelu(op(A)·op(B) (+ bias))`; `aux` keeps the pre-activation `[m×n]` | `GELU`, `GELU_BIAS`, `GELU_AUX`, `GELU_AUX_BIAS` |
//! | `DGelu { bias_grad }` | `C = (op(A)·op(B)) ∘ gelu′(aux)`; `bias[j] = Σ_i C[i][j]` | `DGELU`, `DGELU_BGRAD` |
//! | `BiasGradA` | `C = op(A)·op(B)`, `bias[i] = Σ_k op(A)[i][k]` (`bias[m]`) | `BGRADB` (cuBLASLt's B is our A) |
//! | `BiasGradB` | `C = op(A)·op(B)`, `bias[j] = Σ_k op(B)[k][j]` (`bias[n]`) | `BGRADA` |
//!
//! A linear layer's weight gradient `dW[out×in] = dYᵀ·X` (A = dY transposed)
//! gets the bias gradient `Σ_tokens dY` from `BiasGradA`; `dW[in×out] = Xᵀ·dY`
//! from `BiasGradB`.
//!
//! **Unsupported, as clear errors**: an erf GELU (cuBLASLt's GELU epilogues
//! are the tanh approximation), an auxiliary buffer whose leading dimension
//! `n` is not a multiple of 8 (cuBLASLt's requirement), bias gradients of a
//! batched product, and batches that do not step evenly (a broadcast batch
//! list; the plain [`Blas`](super::Blas) path takes those).

use cudarc::cublaslt::sys;
use zeroplan_ir::{DType, GeluApproximation};

use super::{Gemm, GemmError};

/// What cuBLASLt does after the product (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// The product alone.
    Default,
    /// A bias per output feature (column) added to the product.
    Bias,
    /// GELU of the product, after the bias when there is one.
    Gelu {
        /// Whether a bias is added before the GELU.
        bias: bool,
        /// Whether the pre-activation is kept in the aux matrix for the
        /// backward.
        aux: bool,
        /// The GELU form; cuBLASLt has only the tanh one, so `Erf` is refused.
        approximation: GeluApproximation,
    },
    /// GELU's backward: the product (the incoming gradient) times
    /// `gelu′` of the pre-activation read from the aux matrix.
    DGelu {
        /// Whether the result's column sums (the bias gradient) are written
        /// too.
        bias_grad: bool,
        /// The GELU form; cuBLASLt has only the tanh one, so `Erf` is refused.
        approximation: GeluApproximation,
    },
    /// The product, and the row sums of `op(A)` as the bias gradient
    /// (`bias[m]`).
    BiasGradA,
    /// The product, and the column sums of `op(B)` as the bias gradient
    /// (`bias[n]`).
    BiasGradB,
}

/// One product with its epilogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LtGemm<'a> {
    /// The product, row-major.
    pub gemm: Gemm<'a>,
    /// What cuBLASLt does after it.
    pub epilogue: Epilogue,
}

/// A stored matrix as cuBLASLt reads it: column-major `rows × cols`
/// (before its transpose flag), leading dimension `ld`, elements between
/// batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LtLayout {
    /// Rows, column-major, before the transpose flag.
    pub rows: u64,
    /// Columns, column-major, before the transpose flag.
    pub cols: u64,
    /// The leading dimension: elements between the starts of two columns.
    pub ld: i64,
    /// Elements between one batch's matrix and the next's (0: every batch
    /// reads the same matrix).
    pub batch_stride: i64,
}

/// How the epilogue uses its vector (`bias`) or matrix (`aux`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LtExtra {
    /// Elements (a vector) or the leading dimension (the aux matrix).
    pub len: u64,
    /// Elements between one batch's and the next's (0 for a bias vector).
    pub batch_stride: i64,
    /// Written by the epilogue (a gradient, a saved pre-activation) rather than read.
    pub written: bool,
}

/// Everything the cuBLASLt call needs but the pointers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LtPlan {
    /// The storage type of A, B and D (accumulation is in f32).
    pub data_type: sys::cudaDataType,
    /// cuBLASLt's `TRANSA`/`TRANSB` (its A is our B).
    pub transa: bool,
    /// cuBLASLt's `TRANSB`: whether our A is transposed.
    pub transb: bool,
    /// cuBLASLt's A: our B, column-major.
    pub a: LtLayout,
    /// cuBLASLt's B: our A, column-major.
    pub b: LtLayout,
    /// The result, column-major `Cᵀ[n×m]`.
    pub d: LtLayout,
    /// The products in the batch.
    pub batch: i32,
    /// cuBLASLt's epilogue for our [`Epilogue`].
    pub epilogue: sys::cublasLtEpilogue_t,
    /// The bias vector (read) or bias gradient (written), when the
    /// epilogue has one.
    pub bias: Option<LtExtra>,
    /// The aux matrix (a GELU's pre-activation), when the epilogue has one.
    pub aux: Option<LtExtra>,
}

fn unsupported(message: impl Into<String>) -> GemmError {
    GemmError::Unsupported(message.into())
}

impl LtGemm<'_> {
    /// The plan, or why cuBLASLt cannot run this product and epilogue.
    pub fn plan(&self) -> Result<LtPlan, GemmError> {
        use sys::cublasLtEpilogue_t as E;
        let g = &self.gemm;
        g.check()?;
        let data_type = match g.dtype {
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => sys::cudaDataType::CUDA_R_16F,
            other => return Err(unsupported(format!("a cuBLASLt matmul of {other:?} operands"))),
        };
        let Some((step_a, step_b)) = g.even_steps() else {
            return Err(unsupported(
                "a cuBLASLt epilogue on a broadcast batch list (use the plain GEMM and an element-wise kernel)",
            ));
        };
        let batch = g.batches.len();
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        // Our B (n×k after its op, column-major view), then our A (k×m).
        let a = if g.transpose_b {
            LtLayout { rows: k, cols: n, ld: k as i64, batch_stride: (step_b as u64 * k * n) as i64 }
        } else {
            LtLayout { rows: n, cols: k, ld: n as i64, batch_stride: (step_b as u64 * k * n) as i64 }
        };
        let b = if g.transpose_a {
            LtLayout { rows: m, cols: k, ld: m as i64, batch_stride: (step_a as u64 * m * k) as i64 }
        } else {
            LtLayout { rows: k, cols: m, ld: k as i64, batch_stride: (step_a as u64 * m * k) as i64 }
        };
        let d = LtLayout { rows: n, cols: m, ld: n as i64, batch_stride: (m * n) as i64 };
        let tanh = |approximation| match approximation {
            GeluApproximation::Tanh => Ok(()),
            GeluApproximation::Erf => Err(unsupported(
                "an erf GELU in a cuBLASLt epilogue (cuBLASLt's GELU is the tanh approximation): \
                 run the plain GEMM and the generated GELU kernel",
            )),
        };
        let single = |what: &str| {
            if batch == 1 {
                Ok(())
            } else {
                Err(unsupported(format!("{what} of a batched product ({batch} matrices) in a cuBLASLt epilogue")))
            }
        };
        let aux = |written: bool| {
            if n % 8 == 0 {
                Ok(Some(LtExtra { len: n, batch_stride: (m * n) as i64, written }))
            } else {
                Err(unsupported(format!(
                    "a cuBLASLt GELU auxiliary buffer with leading dimension {n} (cuBLASLt needs a multiple of 8)"
                )))
            }
        };
        let vector = |len: u64, written: bool| Some(LtExtra { len, batch_stride: 0, written });
        let (epilogue, bias, aux) = match self.epilogue {
            Epilogue::Default => (E::CUBLASLT_EPILOGUE_DEFAULT, None, None),
            Epilogue::Bias => (E::CUBLASLT_EPILOGUE_BIAS, vector(n, false), None),
            Epilogue::Gelu { bias, aux: keep, approximation } => {
                tanh(approximation)?;
                let epilogue = match (bias, keep) {
                    (false, false) => E::CUBLASLT_EPILOGUE_GELU,
                    (true, false) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
                    (false, true) => E::CUBLASLT_EPILOGUE_GELU_AUX,
                    (true, true) => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                };
                (epilogue, if bias { vector(n, false) } else { None }, if keep { aux(true)? } else { None })
            }
            Epilogue::DGelu { bias_grad, approximation } => {
                tanh(approximation)?;
                if bias_grad {
                    single("a bias gradient")?;
                    (E::CUBLASLT_EPILOGUE_DGELU_BGRAD, vector(n, true), aux(false)?)
                } else {
                    (E::CUBLASLT_EPILOGUE_DGELU, None, aux(false)?)
                }
            }
            Epilogue::BiasGradA => {
                single("a bias gradient")?;
                (E::CUBLASLT_EPILOGUE_BGRADB, vector(m, true), None)
            }
            Epilogue::BiasGradB => {
                single("a bias gradient")?;
                (E::CUBLASLT_EPILOGUE_BGRADA, vector(n, true), None)
            }
        };
        Ok(LtPlan {
            data_type,
            transa: g.transpose_b,
            transb: g.transpose_a,
            a,
            b,
            d,
            batch: batch as i32,
            epilogue,
            bias,
            aux,
        })
    }
}

#[cfg(test)]
#[path = "epilogue_tests.rs"]
mod tests;
