// ── The CUDA-core kernels (f32 storage, or before sm_80): layout and helpers ─
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
