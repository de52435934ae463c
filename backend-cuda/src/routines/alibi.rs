//! ALiBi's slopes as a kernel argument: a tensor rank's heads are a slice
//! of the whole model's, whose slopes the selection computed on the host,
//! so `alibi_bias.cu` takes them by value rather than recomputing the
//! host's `powf`s on the GPU.

use cudarc::driver::DeviceRepr;

/// The most heads a rank's ALiBi kernel takes (`ZP_MAX_HEADS`).
pub const MAX_HEADS: usize = 64;

/// Each head's slope, as the kernel takes it (`ZpSlopes`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slopes {
    /// The slopes of the rank's heads, then zeros.
    pub m: [f32; MAX_HEADS],
}

// SAFETY: plain floats, laid out as the kernel's `ZpSlopes`.
unsafe impl DeviceRepr for Slopes {}

impl Slopes {
    /// `slopes` padded with zeros; `None` past [`MAX_HEADS`].
    pub fn new(slopes: &[f32]) -> Option<Slopes> {
        let mut m = [0.0; MAX_HEADS];
        m.get_mut(..slopes.len())?.copy_from_slice(slopes);
        Some(Slopes { m })
    }
}
