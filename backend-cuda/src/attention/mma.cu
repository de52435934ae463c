// ── Tensor cores (sm_80+, bf16/f16): the warp-level products ─────────────────
// A warp owns 16 rows (one m16 tile) of the block's ZP_ROWS and multiplies
// them with the other side's tile of ZP_TILE rows by mma.sync m16n8k16
// (16-bit operands, f32 accumulation), its operands read from shared memory
// by ldmatrix. Tiles hold the storage type itself (no conversion on the
// way in), ZP_STRIDE elements a row: 16 bytes more than the head dim, so
// the eight 16-byte rows one ldmatrix matrix reads fall in eight different
// bank groups. Fragment layouts (PTX ISA 9.0, §9.7.14.5.8 "Matrix Fragments
// for mma.m16n8k16 with floating point type", §9.7.14.5.15 "ldmatrix"),
// with g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group):
//   A (16×16, four .b32 of two 16-bit values): rows g and g + 8, columns
//     2t, 2t + 1 and those + 8, in the order (g, 2t), (g + 8, 2t),
//     (g, 2t + 8), (g + 8, 2t + 8);
//   B (16×8, two .b32): rows (k) 2t, 2t + 1 and those + 8, column (n) g;
//   C, D (16×8, four f32): (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1);
//   ldmatrix .x4: lanes 8m..8m+7 address the rows of matrix m, which lands
//     in register m; lane l gets row l / 4, columns 2(l % 4), 2(l % 4) + 1
//     (of the transpose with .trans).
// So an accumulator's two n-tiles 2c and 2c + 1 are, packed to 16 bits, the
// A operand of k-step c: P·V takes P from the registers S left it in
// (FlashAttention-2). tests/host/shim.h emulates these instructions lane by
// lane for the g++ tests; NVRTC, which defines __CUDA_ARCH__, gets the PTX.
constexpr int ZP_WARPS = 4;
constexpr int ZP_THREADS = 32 * ZP_WARPS;
constexpr int ZP_ROWS = 16 * ZP_WARPS;  // the block's own rows: one m16 tile per warp
constexpr int ZP_STRIDE = ZP_D + 8;     // tile row stride, in elements
// Blocks an SM must hold at once: 4 of 4 warps, a quarter of its warp slots
// (the resource check's floor for attention), so ptxas keeps a thread to
// 128 registers; the tiles (ZP_TILE) are sized for that to need no spill.
constexpr int ZP_MIN_BLOCKS = 4;
static_assert(ZP_D % 16 == 0 && ZP_TILE % 16 == 0, "whole k-steps and n-tile pairs");

#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned zp_shared_address(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void zp_ldmatrix_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(zp_shared_address(row)));
}
__device__ __forceinline__ void zp_ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(zp_shared_address(row)));
}
__device__ __forceinline__ void zp_mma_m16n8k16_$MMA(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.$MMA.$MMA.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Two values rounded to the storage type, the first in the low half (the
// order of a fragment's elements).
__device__ __forceinline__ unsigned zp_pack(float lo, float hi) {
  return (unsigned)zp_bits(lo) | ((unsigned)zp_bits(hi) << 16);
}

// Rows [row0, row0 + rows) of a head's [seq, ZP_D] matrix into a tile, 16
// bytes a thread and step (coalesced); rows past the sequence are zeros.
// The tensors start 16-byte aligned (LoadedAttention checks).
__device__ __forceinline__ void zp_stage_rows(zp_t* tile, const zp_t* src, int row0, int rows, int seq) {
  constexpr int CHUNKS = ZP_D / 8;
  for (int x = threadIdx.x; x < rows * CHUNKS; x += ZP_THREADS) {
    const int r = x / CHUNKS, c = x % CHUNKS, i = row0 + r;
    uint4 v = {0u, 0u, 0u, 0u};
    if (i < seq) v = *reinterpret_cast<const uint4*>(src + (long long)i * ZP_D + 8 * c);
    *reinterpret_cast<uint4*>(tile + r * ZP_STRIDE + 8 * c) = v;
  }
}

// acc += A·Bᵀ over the head dim: A the warp's 16 rows at `a`, B the N rows
// at `b` (QKᵀ, dO·Vᵀ, and from the keys' side K·Qᵀ, V·dOᵀ); acc[n] is
// n-tile n (columns 8n..8n+7) in the C layout.
template <int N>
__device__ __forceinline__ void zp_mma_rows(float (&acc)[N / 8][4], const zp_t* a, const zp_t* b, int lane) {
#pragma unroll
  for (int k = 0; k < ZP_D; k += 16) {
    // Matrices: rows 0–7 and 8–15 at columns k, then both at k + 8.
    unsigned af[4];
    zp_ldmatrix_x4(af, a + (lane % 16) * ZP_STRIDE + k + 8 * (lane / 16));
#pragma unroll
    for (int n = 0; n < N; n += 16) {
      // Matrices: B rows n..n+7 at columns k and k + 8, then rows n+8..n+15.
      unsigned bf[4];
      zp_ldmatrix_x4(bf, b + (n + lane % 8 + 8 * (lane / 16)) * ZP_STRIDE + k + 8 * (lane / 8 % 2));
      zp_mma_m16n8k16_$MMA(acc[n / 8], af, bf[0], bf[1]);
      zp_mma_m16n8k16_$MMA(acc[n / 8 + 1], af, bf[2], bf[3]);
    }
  }
}

// acc += W·V: W the warp's 16×N weights as a zp_mma_rows product left them
// (rounded to the storage type here), V the N rows at `v` (P·V, and dS·K,
// P·dO, dS·Q); acc[d] is head dims 8d..8d+7 in the C layout.
template <int N>
__device__ __forceinline__ void zp_mma_weights(float (&acc)[ZP_D / 8][4], const float (&w)[N / 8][4], const zp_t* v,
                                               int lane) {
#pragma unroll
  for (int k = 0; k < N; k += 16) {
    const float* lo = w[k / 8];
    const float* hi = w[k / 8 + 1];
    const unsigned af[4] = {zp_pack(lo[0], lo[1]), zp_pack(lo[2], lo[3]), zp_pack(hi[0], hi[1]), zp_pack(hi[2], hi[3])};
#pragma unroll
    for (int d = 0; d < ZP_D; d += 16) {
      // Matrices, transposed: V rows k..k+7 and k+8..k+15 at columns d, then both at d + 8.
      unsigned bf[4];
      zp_ldmatrix_x4_trans(bf, v + (k + lane % 8 + 8 * (lane / 8 % 2)) * ZP_STRIDE + d + 8 * (lane / 16));
      zp_mma_m16n8k16_$MMA(acc[d / 8], af, bf[0], bf[1]);
      zp_mma_m16n8k16_$MMA(acc[d / 8 + 1], af, bf[2], bf[3]);
    }
  }
}

// Stores a warp's 16 × ZP_D accumulator, times `factor`, as rows row0 + g
// and row0 + g + 8 of a head's [seq, ZP_D] matrix (rows past the sequence
// are skipped); two values a lane and n-tile in one 32-bit store.
__device__ __forceinline__ void zp_store_rows(zp_t* dst, const float (&acc)[ZP_D / 8][4], const float (&factor)[2],
                                              int row0, int seq, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + lane / 4 + 8 * r;
    if (i >= seq) continue;
#pragma unroll
    for (int d = 0; d < ZP_D / 8; ++d) {
      unsigned* at = reinterpret_cast<unsigned*>(dst + (long long)i * ZP_D + 8 * d + 2 * (lane % 4));
      *at = zp_pack(acc[d][2 * r] * factor[r], acc[d][2 * r + 1] * factor[r]);
    }
  }
}
