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
        DType::BF16 => round_binary(x, 8, -126, half::bf16::MAX.to_f64()),
        DType::F16 => round_binary(x, 11, -14, half::f16::MAX.to_f64()),
        DType::I32 | DType::I64 => x,
    }
}

/// `x` as a bf16, rounded to nearest even. Not `half::bf16::from_f64`:
/// half 2.7 drops the bits below the rounding bit first, so a value just
/// above a tie rounds down (−0.0141906775 gives −0.0141602, not −0.0142212).
pub fn to_bf16(x: f64) -> half::bf16 {
    half::bf16::from_f32(round_to(DType::BF16, x) as f32)
}

/// `x` as an f16, rounded to nearest even (see [`to_bf16`]).
pub fn to_f16(x: f64) -> half::f16 {
    half::f16::from_f32(round_to(DType::F16, x) as f32)
}

/// `x` rounded to nearest, ties to even, in a binary format of `digits`
/// significant bits, smallest normal exponent `emin` (gradual underflow
/// below it) and largest finite value `max` (beyond which it is ±∞).
fn round_binary(x: f64, digits: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let exponent = (((x.to_bits() >> 52) & 0x7FF) as i32 - 1023).max(emin);
    // Powers of two: the division and product are exact.
    let ulp = 2f64.powi(exponent - digits + 1);
    let r = (x / ulp).round_ties_even() * ulp;
    if r.abs() > max { f64::INFINITY.copysign(x) } else { r }
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
        // Just above a tie: half's `bf16::from_f64` gives −0.01416015625.
        assert_eq!(round_to(DType::BF16, f32::from_bits(0xbc68_8004) as f64), -0.01422119140625);
    }

    /// Against half's `from_f32` (the hardware's conversion) on f32 values
    /// of every exponent, subnormals, ties and overflow included.
    #[test]
    fn sixteen_bit_rounding_matches_the_f32_conversion() {
        let mut bits = 0x2545_F491u32;
        for i in 0..200_000u32 {
            bits ^= bits << 13;
            bits ^= bits >> 17;
            bits ^= bits << 5;
            // Every fourth value a tie or a neighbour of one.
            let b = if i % 4 == 0 { (bits & 0xFFFF_0000) | 0x8000 | (i & 1) } else { bits };
            let x = f32::from_bits(b);
            if x.is_nan() {
                continue;
            }
            assert_eq!(round_to(DType::BF16, x as f64), half::bf16::from_f32(x).to_f64(), "{b:08x}");
            let h = if i % 4 == 0 { (bits & 0xFFFF_E000) | 0x1000 | (i & 1) } else { bits };
            let y = f32::from_bits(h);
            if !y.is_nan() {
                assert_eq!(round_to(DType::F16, y as f64), half::f16::from_f32(y).to_f64(), "{h:08x}");
            }
        }
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
