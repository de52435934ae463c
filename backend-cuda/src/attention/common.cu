// ── Shared by the forward and backward kernels ──────────────────────────────
// A block is ZP_WARPS warps. Each warp owns a few rows of the block's tile
// (query rows in the forward and dQ kernels, key rows in the dK/dV kernel)
// and works through them one at a time: the lanes split the other side's
// tile (2 keys or 2 queries per lane, 64 per tile) for the dot products, the
// row's max and sum are warp shuffles, and the lanes split the head dim
// (ZP_D / 32 dims per lane) for the products with the tile, reading the
// row's weights back through a per-warp strip of shared memory. Tiles are
// staged in shared memory as float; a tile read across lanes row by row has
// a row stride of ZP_D + 1 floats, so the 32 lanes hit 32 different banks.
constexpr int ZP_WARPS = 4;
constexpr int ZP_THREADS = 32 * ZP_WARPS;
constexpr int ZP_DL = ZP_D / 32;   // head dims per lane
constexpr int ZP_PAD = ZP_D + 1;   // row stride of tiles read across lanes
constexpr int ZP_TILE = 64;        // keys (forward, dQ) or queries (dK/dV) per tile: 2 per lane
constexpr int ZP_ROWS = 16;        // the block's own rows: 4 per warp
constexpr int ZP_ROWS_PER_WARP = ZP_ROWS / ZP_WARPS;
static_assert(ZP_D % 32 == 0, "the head dim is a whole number of warps");
static_assert(ZP_TILE == 64, "two tile entries per lane");

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

// Rows [row0, row0 + rows) of a head's [seq, ZP_D] matrix into a float tile
// with row stride `stride`; rows past the sequence are zeros. Coalesced:
// consecutive threads read consecutive elements.
__device__ __forceinline__ void zp_stage(float* tile, int stride, const zp_t* src, int row0, int rows, int seq) {
  for (int x = threadIdx.x; x < rows * ZP_D; x += ZP_THREADS) {
    const int r = x / ZP_D, d = x % ZP_D, i = row0 + r;
    tile[r * stride + d] = i < seq ? zp_ld(src + (long long)i * ZP_D + d) : 0.0f;
  }
}

// The score of query i and key j from their staged rows: scale·q·k, minus
// ALiBi's slope·|i − j|.
__device__ __forceinline__ float zp_score(const float* qrow, const float* krow, float scale, float slope, int i, int j) {
  float dot = 0.0f;
#pragma unroll 8
  for (int e = 0; e < ZP_D; ++e) dot += qrow[e] * krow[e];
  float s = dot * scale;
  if (ZP_ALIBI) s -= slope * (float)(i > j ? i - j : j - i);
  return s;
}

__device__ __forceinline__ float zp_dot(const float* x, const float* y) {
  float dot = 0.0f;
#pragma unroll 8
  for (int e = 0; e < ZP_D; ++e) dot += x[e] * y[e];
  return dot;
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
