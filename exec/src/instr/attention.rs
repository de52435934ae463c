//! What one fused attention (`flash_attention` and its adjoint) computes,
//! fixed when the program is loaded: what every device's attention routine
//! or kernel is specialised on.

/// What one fused attention computes, fixed when the program is loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// `[B, H, S, D]` of q, k, v and the output.
    pub dims: [usize; 4],
    /// The factor on `q·kᵀ` (`1/√D` in BERT).
    pub scale: f32,
    /// ALiBi's slope per head of this tensor rank, when biased.
    pub slopes: Option<Vec<f32>>,
    /// Dropout's drop probability on the probabilities (0: none).
    pub dropout: f64,
    /// Dropout's random stream, so every device and a recomputed forward
    /// draw the mask the unfused chain would.
    pub stream: u32,
}
