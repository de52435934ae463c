// ── Backward on tensor cores: dq, dk, dv from q, k, v, mask, out, lse, dout ──
// The CUDA-core backward's algorithm (backward.cu) with its products on
// tensor cores: P_ij = exp(s_ij − lse_i) (0 for a dead pair), D_i =
// dout_i·out_i, dS_ij = P_ij·(z_ij·dP_ij − D_i) with dP = dout·vᵀ. Two
// kernels, each owning what it writes (no atomics, a fixed summation order:
// deterministic): dQ over query rows, dK/dV over key rows, a warp 16 rows;
// each recomputes S and dP for itself. From the keys' side the products are
// transposed (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ), so every product is a zp_mma_rows
// or a zp_mma_weights.

constexpr int ZP_OPERAND_BUFFERS = ZP_ONE_BUFFER ? 1 : 2;
static_assert(!ZP_ONE_BUFFER || ZP_SPLIT, "with one buffer, each walk of the dK/dV kernel wants dK or dV");

// D_i and lse_i of rows [row0, row0 + rows) into shared memory: a warp a
// row, the lanes across the head dim (coalesced), then the warp's sum; −∞
// and 0 past the sequence. `rows` is a multiple of ZP_WARPS (whole warps
// shuffle).
__device__ __forceinline__ void zp_stage_row_terms(float* lse_s, float* d_s, const float* lse, const zp_t* dout,
                                                   const zp_t* out, int row0, int rows, int seq) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = warp; t < rows; t += ZP_WARPS) {
    const int i = row0 + t;
    float sum = 0.0f;
    if (i < seq) {
      for (int e = lane; e < ZP_D; e += 32) sum += zp_ld(dout + (long long)i * ZP_D + e) * zp_ld(out + (long long)i * ZP_D + e);
    }
    sum = zp_warp_sum(sum);
    if (lane == 0) {
      lse_s[t] = i < seq ? lse[i] : zp_neg_inf();
      d_s[t] = sum;
    }
  }
}

// The other side's tile holds two operands (K and V, or Q and dO). In two
// buffers both are staged at once; with ZP_ONE_BUFFER (head dim 128, where a
// second buffer would leave an A100 3 blocks, under the attention floor of
// 4) they take turns in one: the second replaces the first once every warp
// is done with it. Stages `src`'s rows into `tile` then; else a no-op.
__device__ __forceinline__ void zp_restage(zp_t* tile, const zp_t* src, int row0, int seq) {
  if (!ZP_ONE_BUFFER) return;
  __syncthreads();
  zp_stage_rows(tile, src, row0, ZP_TILE, seq);
  __syncthreads();
}

// P_ij·z_ij into `s` and dS_ij into `dp` for one accumulator element
// (s holds q_i·k_j, dp holds dout_i·v_j); both 0 for a dead pair.
__device__ __forceinline__ void zp_grad_element(float& s, float& dp, bool live, float lse_i, float d_i, float scale,
                                                float slope, int i, int j, int bh, int seq, unsigned long long seed,
                                                unsigned stream, unsigned long long offset, unsigned keep_threshold,
                                                float keep_scale) {
  if (!live || lse_i == zp_neg_inf()) {
    s = dp = 0.0f;
    return;
  }
  float x = s * scale;
  if (ZP_ALIBI) x -= slope * (float)(i > j ? i - j : j - i);
  const float p = zp_exp(x - lse_i);
  const float z = ZP_DROPOUT ? zp_drop_factor(seed, stream, offset, keep_threshold, keep_scale, bh, seq, i, j) : 1.0f;
  s = p * z;
  dp = p * (z * dp - d_i);
}

// dQ. Grid (⌈S/64⌉, B·H): the block's ZP_ROWS query rows; keys in tiles of
// ZP_TILE, V's rows first (dP), then K's (S, then dS·K). dq_i = scale·Σ_j dS_ij·k_j.
extern "C" __global__ void __launch_bounds__(ZP_THREADS, ZP_MIN_BLOCKS) $BACKWARD_DQ(
    const zp_t* __restrict__ q, const zp_t* __restrict__ k, const zp_t* __restrict__ v,
    const zp_mask_t* __restrict__ mask, const zp_t* __restrict__ out, const float* __restrict__ lse,
    const zp_t* __restrict__ dout, zp_t* __restrict__ dq, int heads, int seq, float scale, int head_offset,
    int total_heads, unsigned keep_threshold, float keep_scale, unsigned stream,
    const unsigned long long* __restrict__ zp_rng)
{
  const unsigned long long seed = zp_rng[0], offset = zp_rng[1]; // dropout's Philox key and counter word
  __shared__ __align__(16) zp_t q_s[ZP_ROWS * ZP_STRIDE];
  __shared__ __align__(16) zp_t do_s[ZP_ROWS * ZP_STRIDE];
  __shared__ __align__(16) zp_t kv_s[ZP_OPERAND_BUFFERS * ZP_TILE * ZP_STRIDE];
  __shared__ float lse_s[ZP_ROWS];
  __shared__ float d_s[ZP_ROWS];
  __shared__ bool live_s[ZP_TILE];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const long long head = (long long)bh * seq * ZP_D;
  const int block0 = blockIdx.x * ZP_ROWS, row0 = block0 + 16 * warp;
  const float slope = ZP_ALIBI ? zp_alibi_slope(head_offset + h, total_heads) : 0.0f;
  zp_t* const v_s = kv_s;
  zp_t* const k_s = kv_s + (ZP_OPERAND_BUFFERS - 1) * ZP_TILE * ZP_STRIDE;
  zp_stage_rows(q_s, q + head, block0, ZP_ROWS, seq);
  zp_stage_rows(do_s, dout + head, block0, ZP_ROWS, seq);
  zp_stage_row_terms(lse_s, d_s, lse + (long long)bh * seq, dout + head, out + head, block0, ZP_ROWS, seq);
  __syncthreads();
  float lse_r[2], d_r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse_r[r] = lse_s[16 * warp + lane / 4 + 8 * r];
    d_r[r] = d_s[16 * warp + lane / 4 + 8 * r];
  }
  float acc[ZP_D / 8][4];
#pragma unroll
  for (int d = 0; d < ZP_D / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  for (int key0 = 0; key0 < seq; key0 += ZP_TILE) {
    __syncthreads();
    zp_stage_rows(v_s, v + head, key0, ZP_TILE, seq);
    if (!ZP_ONE_BUFFER) zp_stage_rows(k_s, k + head, key0, ZP_TILE, seq);
    for (int t = threadIdx.x; t < ZP_TILE; t += ZP_THREADS) {
      live_s[t] = key0 + t < seq && mask[(long long)b * seq + key0 + t] != 0;
    }
    __syncthreads();
    float s[ZP_TILE / 8][4], dp[ZP_TILE / 8][4];
#pragma unroll
    for (int n = 0; n < ZP_TILE / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    }
    zp_mma_rows<ZP_TILE>(dp, do_s + 16 * warp * ZP_STRIDE, v_s, lane);
    zp_restage(k_s, k + head, key0, seq);
    zp_mma_rows<ZP_TILE>(s, q_s + 16 * warp * ZP_STRIDE, k_s, lane);
#pragma unroll
    for (int n = 0; n < ZP_TILE / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, t = 8 * n + 2 * (lane % 4) + e % 2, i = row0 + lane / 4 + 8 * r;
        zp_grad_element(s[n][e], dp[n][e], live_s[t] && i < seq, lse_r[r], d_r[r], scale, slope, i, key0 + t, bh, seq,
                        seed, stream, offset, keep_threshold, keep_scale);
      }
    }
    zp_mma_weights<ZP_TILE>(acc, dp, k_s, lane);
  }
  const float factor[2] = {scale, scale};
  zp_store_rows(dq + head, acc, factor, row0, seq, lane);
}

// dK and dV. Grid (⌈S/64⌉, B·H): the block's ZP_ROWS key rows; queries in
// tiles of ZP_TILE. dv_j = Σ_i z_ij·P_ij·dout_i, dk_j = scale·Σ_i dS_ij·q_i.
// With ZP_SPLIT (head dims 64 and 128: two D-wide accumulators would not
// fit 128 registers beside the products) the queries are walked twice, dK
// the first time and dV the second, recomputing Sᵀ: the dV walk holds the
// fewer registers, so what the first walk's store leaves live costs no
// spill. dK's walk takes dO's rows first (dPᵀ), then Q's (Sᵀ, then dS·Q);
// dV's takes Q's (Sᵀ), then dO's (P·dO).
extern "C" __global__ void __launch_bounds__(ZP_THREADS, ZP_MIN_BLOCKS) $BACKWARD_DKDV(
    const zp_t* __restrict__ q, const zp_t* __restrict__ k, const zp_t* __restrict__ v,
    const zp_mask_t* __restrict__ mask, const zp_t* __restrict__ out, const float* __restrict__ lse,
    const zp_t* __restrict__ dout, zp_t* __restrict__ dk, zp_t* __restrict__ dv, int heads, int seq, float scale,
    int head_offset, int total_heads, unsigned keep_threshold, float keep_scale, unsigned stream,
    const unsigned long long* __restrict__ zp_rng)
{
  const unsigned long long seed = zp_rng[0], offset = zp_rng[1]; // dropout's Philox key and counter word
  __shared__ __align__(16) zp_t k_s[ZP_ROWS * ZP_STRIDE];
  __shared__ __align__(16) zp_t v_s[ZP_ROWS * ZP_STRIDE];
  __shared__ __align__(16) zp_t qdo_s[ZP_OPERAND_BUFFERS * ZP_TILE * ZP_STRIDE];
  __shared__ float lse_s[ZP_TILE];
  __shared__ float d_s[ZP_TILE];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const long long head = (long long)bh * seq * ZP_D;
  const int block0 = blockIdx.x * ZP_ROWS, key_row0 = block0 + 16 * warp;
  const float slope = ZP_ALIBI ? zp_alibi_slope(head_offset + h, total_heads) : 0.0f;
  zp_t* const do_s = qdo_s;
  zp_t* const q_s = qdo_s + (ZP_OPERAND_BUFFERS - 1) * ZP_TILE * ZP_STRIDE;
  zp_stage_rows(k_s, k + head, block0, ZP_ROWS, seq);
  zp_stage_rows(v_s, v + head, block0, ZP_ROWS, seq);
  bool live[2];  // the lane's key rows (g, g + 8) are real and unmasked
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = key_row0 + lane / 4 + 8 * r;
    live[r] = j < seq && mask[(long long)b * seq + j] != 0;
  }

  constexpr int PHASES = ZP_SPLIT ? 2 : 1;
#pragma unroll
  for (int phase = 0; phase < PHASES; ++phase) {
    const bool want_dk = phase == 0, want_dv = phase == PHASES - 1;
    float acc_dv[ZP_D / 8][4], acc_dk[ZP_D / 8][4];
#pragma unroll
    for (int d = 0; d < ZP_D / 8; ++d) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[d][e] = acc_dk[d][e] = 0.0f;
    }
    for (int query0 = 0; query0 < seq; query0 += ZP_TILE) {
      __syncthreads();
      if (want_dk || !ZP_ONE_BUFFER) zp_stage_rows(do_s, dout + head, query0, ZP_TILE, seq);
      if (!want_dk || !ZP_ONE_BUFFER) zp_stage_rows(q_s, q + head, query0, ZP_TILE, seq);
      zp_stage_row_terms(lse_s, d_s, lse + (long long)bh * seq, dout + head, out + head, query0, ZP_TILE, seq);
      __syncthreads();
      float s[ZP_TILE / 8][4], dp[ZP_TILE / 8][4];
#pragma unroll
      for (int n = 0; n < ZP_TILE / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
      }
      if (want_dk) {
        zp_mma_rows<ZP_TILE>(dp, v_s + 16 * warp * ZP_STRIDE, do_s, lane);
        zp_restage(q_s, q + head, query0, seq);
      }
      zp_mma_rows<ZP_TILE>(s, k_s + 16 * warp * ZP_STRIDE, q_s, lane);
#pragma unroll
      for (int n = 0; n < ZP_TILE / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, t = 8 * n + 2 * (lane % 4) + e % 2, i = query0 + t, j = key_row0 + lane / 4 + 8 * r;
          zp_grad_element(s[n][e], dp[n][e], live[r] && i < seq, lse_s[t], d_s[t], scale, slope, i, j, bh, seq, seed,
                          stream, offset, keep_threshold, keep_scale);
        }
      }
      if (want_dk) zp_mma_weights<ZP_TILE>(acc_dk, dp, q_s, lane);
      if (want_dv) {
        zp_restage(do_s, dout + head, query0, seq);
        zp_mma_weights<ZP_TILE>(acc_dv, s, do_s, lane);
      }
    }
    if (want_dv) {
      const float one[2] = {1.0f, 1.0f};
      zp_store_rows(dv + head, acc_dv, one, key_row0, seq, lane);
    }
    if (want_dk) {
      const float factor[2] = {scale, scale};
      zp_store_rows(dk + head, acc_dk, factor, key_row0, seq, lane);
    }
  }
}
