// ── Shared by every attention kernel, CUDA-core and tensor-core ─────────────
__device__ __forceinline__ float zp_neg_inf() { return -__int_as_float(0x7f800000); }

// ALiBi's slope of global head g of n (zeroplan_ir::interp::alibi_slopes):
// with p the largest power of two ≤ n, 2^(−8(g+1)/p) for g < p, else the
// slope of 2p heads at even index 2(g − p): 2^(−8(2(g − p)+1)/(2p)).
// Computed in double, as the reference computes the slopes, then rounded.
__device__ __forceinline__ float zp_alibi_slope(int g, int n) {
  const int p = 1 << (31 - __clz(n));
  if (g < p) return (float)exp2(-8.0 * (double)(g + 1) / (double)p);
  return (float)exp2(-8.0 * (double)(2 * (g - p) + 1) / (double)(2 * p));
}

// Dropout's factor for probability (i, j) of head bh: keep_scale = 1/(1−p)
// where zeroplan's dropout keeps element ((b·H + h)·S + i)·S + j of the
// [B, H, S, S] probabilities, else 0 (the mask Op::Dropout draws).
__device__ __forceinline__ float zp_drop_factor(unsigned long long seed, unsigned stream, unsigned long long offset,
                                                unsigned keep_threshold, float keep_scale, int bh, int seq, int i,
                                                int j) {
  const unsigned long long e = ((unsigned long long)bh * seq + i) * seq + j;
  return zp_keep(seed, stream, (unsigned)offset, e, keep_threshold) ? keep_scale : 0.0f;
}
