//! What one fused attention (`flash_attention` and its adjoint) computes,
//! fixed when the program is loaded: what every device's attention routine
//! or kernel is specialised on.

/// What one fused attention computes, fixed when the program is loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// `[B, H, S, D]` of q, k, v and the output.
    pub dims: [usize; 4],
    pub scale: f32,
    /// ALiBi's slope per head of this tensor rank, when biased.
    pub slopes: Option<Vec<f32>>,
    /// Dropout's drop probability (0: none) and stream.
    pub dropout: f64,
    pub stream: u32,
}
