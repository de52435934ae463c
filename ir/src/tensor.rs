//! Host tensors: the values the reference interpreter computes with, and
//! what checkpoints and batches are loaded into.
//!
//! Float tensors hold `f64` whatever their dtype; [`Tensor::round_to_dtype`]
//! rounds the values to what the dtype can hold (round to nearest even), so
//! an `f32` or `bf16` tensor holds exactly representable values. Integer
//! tensors hold `i64`.

use crate::dtype::DType;

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

/// A dense row-major tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    data: TensorData,
}

/// A tensor whose parts do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TensorError(pub String);

impl Tensor {
    /// A float tensor; `values` are rounded to `dtype`.
    pub fn float(shape: Vec<usize>, dtype: DType, values: Vec<f64>) -> Result<Tensor, TensorError> {
        if !dtype.is_float() {
            return Err(TensorError(format!("{dtype} is not a float dtype")));
        }
        let mut t = Tensor::checked(shape, dtype, TensorData::Float(values))?;
        t.round_to_dtype();
        Ok(t)
    }

    /// An integer tensor.
    pub fn int(shape: Vec<usize>, dtype: DType, values: Vec<i64>) -> Result<Tensor, TensorError> {
        if !dtype.is_int() {
            return Err(TensorError(format!("{dtype} is not an integer dtype")));
        }
        Tensor::checked(shape, dtype, TensorData::Int(values))
    }

    /// A tensor of `shape` with every element `value`.
    pub fn full(shape: Vec<usize>, dtype: DType, value: f64) -> Tensor {
        let n = shape.iter().product();
        let data =
            if dtype.is_float() { TensorData::Float(vec![value; n]) } else { TensorData::Int(vec![value as i64; n]) };
        let mut t = Tensor { shape, dtype, data };
        t.round_to_dtype();
        t
    }

    /// An `f32` scalar.
    pub fn scalar(value: f64) -> Tensor {
        Tensor::full(Vec::new(), DType::F32, value)
    }

    fn checked(shape: Vec<usize>, dtype: DType, data: TensorData) -> Result<Tensor, TensorError> {
        let n: usize = shape.iter().product();
        let len = match &data {
            TensorData::Float(v) => v.len(),
            TensorData::Int(v) => v.len(),
        };
        if n != len {
            return Err(TensorError(format!("shape {shape:?} holds {n} elements, but {len} were given")));
        }
        Ok(Tensor { shape, dtype, data })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The float elements; `None` for an integer tensor.
    pub fn floats(&self) -> Option<&[f64]> {
        match &self.data {
            TensorData::Float(v) => Some(v),
            TensorData::Int(_) => None,
        }
    }

    /// The float elements, mutably. Call [`Tensor::round_to_dtype`] after writing.
    pub fn floats_mut(&mut self) -> Option<&mut [f64]> {
        match &mut self.data {
            TensorData::Float(v) => Some(v),
            TensorData::Int(_) => None,
        }
    }

    /// The integer elements; `None` for a float tensor.
    pub fn ints(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::Int(v) => Some(v),
            TensorData::Float(_) => None,
        }
    }

    /// The single element of a one-element tensor, as f64.
    pub fn item(&self) -> Option<f64> {
        if self.numel() != 1 {
            return None;
        }
        match &self.data {
            TensorData::Float(v) => Some(v[0]),
            TensorData::Int(v) => Some(v[0] as f64),
        }
    }

    /// Rounds every float element to the nearest value of the dtype.
    pub fn round_to_dtype(&mut self) {
        let dtype = self.dtype;
        if let TensorData::Float(v) = &mut self.data {
            for x in v.iter_mut() {
                *x = round_to(dtype, *x);
            }
        }
    }

    /// The same values under another dtype (rounded, or truncated toward
    /// zero from float to integer).
    pub fn cast(&self, dtype: DType) -> Tensor {
        let data = match (&self.data, dtype.is_float()) {
            (TensorData::Float(v), true) => TensorData::Float(v.iter().map(|x| round_to(dtype, *x)).collect()),
            (TensorData::Float(v), false) => TensorData::Int(v.iter().map(|x| *x as i64).collect()),
            (TensorData::Int(v), true) => TensorData::Float(v.iter().map(|x| round_to(dtype, *x as f64)).collect()),
            (TensorData::Int(v), false) => TensorData::Int(v.clone()),
        };
        Tensor { shape: self.shape.clone(), dtype, data }
    }
}

/// `x` rounded to the nearest value `dtype` holds (round to nearest even;
/// overflow gives ±inf, as the hardware conversion does).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::I32 | DType::I64 => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_round_to_nearest_even() {
        assert_eq!(round_to(DType::BF16, 1.0 + 1.0 / 256.0), 1.0); // tie → even
        assert_eq!(round_to(DType::BF16, 1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(round_to(DType::F16, 70000.0), f64::INFINITY);
        assert_eq!(round_to(DType::F32, 0.1), 0.1f32 as f64);
    }

    #[test]
    fn shapes_must_match_data() {
        assert!(Tensor::float(vec![2, 3], DType::F32, vec![0.0; 5]).is_err());
        assert!(Tensor::int(vec![2], DType::F32, vec![1, 2]).is_err());
        let t = Tensor::float(vec![2], DType::BF16, vec![1.0, 1.00001]).unwrap();
        assert_eq!(t.floats().unwrap(), &[1.0, 1.0]);
        assert_eq!(t.cast(DType::I64).ints().unwrap(), &[1, 1]);
    }
}
