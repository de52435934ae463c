//! Host routines for the ops that are not row kernels.

pub mod attention;
pub mod broadcast;
pub mod embedding;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod rowmath;
pub mod tensor_parallel;
