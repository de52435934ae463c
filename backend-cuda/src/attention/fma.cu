// ── The CUDA-core kernels (f32 storage, or before sm_80): layout and helpers ─
// A block is ZP_WARPS warps. Each warp owns a few rows of the block's tile
// (query rows in the forward and dQ kernels, key rows in the dK/dV kernel)
// and works through them one at a time: the lanes split the other side's
// tile of ZP_TILE rows (ZP_PER_LANE keys or queries per lane) for the dot
// products, the row's max and sum are warp shuffles, and the lanes split the
// head dim (ZP_D / 32 dims per lane) for the products with the tile, reading
// the row's weights back through a per-warp strip of shared memory. Tiles
// are staged in shared memory as float; a tile read across lanes row by row
// has a row stride of ZP_D + 1 floats, so the 32 lanes hit 32 different
// banks. ZP_TILE is the pass's (AttentionKernel::tile): 64 keys in the
// forward, whose online softmax reduces each row once a tile; 32 in the
// backward, which reduces nothing per tile, so a smaller tile costs only
// barriers and keeps its two staged operands small.
constexpr int ZP_WARPS = 4;
constexpr int ZP_THREADS = 32 * ZP_WARPS;
constexpr int ZP_DL = ZP_D / 32;   // head dims per lane
constexpr int ZP_PAD = ZP_D + 1;   // row stride of tiles read across lanes
constexpr int ZP_PER_LANE = ZP_TILE / 32;  // the tile's keys (forward, dQ) or queries (dK/dV) per lane
constexpr int ZP_ROWS = 16;        // the block's own rows: 4 per warp
constexpr int ZP_ROWS_PER_WARP = ZP_ROWS / ZP_WARPS;
// Blocks an SM must hold at once: a register budget for ptxas of
// 65,536 / (6 · 128) = 85 a thread, 80 as allocated. Without a minimum ptxas
// sets a lower target of its own and spills to meet it (at head dim 32,
// 4–36 B a thread at 48–72 registers for sm_90, ptxas 13.0); within 80 no
// specialisation spills for sm_80 or sm_90. Six blocks are 37.5% of the warp
// slots; shared memory holds the head-dim-64 forward to 4 (sm_80) or 5
// (sm_90): 25–31%, at or over the attention floor of 25%.
constexpr int ZP_MIN_BLOCKS = 6;
static_assert(ZP_D % 32 == 0, "the head dim is a whole number of warps");
static_assert(ZP_TILE % 32 == 0, "whole tile entries per lane");
static_assert(ZP_THREADS % ZP_D == 0, "a block stages whole rows at a time");

// Rows [row0, row0 + rows) of a head's [seq, ZP_D] matrix into a float tile
// with row stride `stride`; rows past the sequence are zeros. Coalesced:
// consecutive threads read consecutive elements, each thread the same column
// of every ZP_THREADS / ZP_D-th row.
__device__ __forceinline__ void zp_stage(float* tile, int stride, const zp_t* src, int row0, int rows, int seq) {
  const int d = threadIdx.x % ZP_D;
  for (int r = threadIdx.x / ZP_D; r < rows; r += ZP_THREADS / ZP_D) {
    const int i = row0 + r;
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
