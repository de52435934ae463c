// ── Forward on tensor cores: out = dropout(softmax(s))·v, lse = log Σ_j exp(s_ij) ─
// Grid (⌈S/64⌉, B·H), ZP_THREADS threads: a block takes ZP_ROWS query rows of
// one head, a warp 16 of them, and walks the keys in tiles of ZP_TILE with
// FlashAttention-2's online softmax, as the CUDA-core kernel does: per row
// a running max m, a running sum l of exp(s − m) and the unnormalised
// output, rescaled by exp(m_old − m_new) when the max grows. S = Q·Kᵀ and
// the output's P·V are tensor-core products (mma.cu); a lane holds rows
// g = lane/4 and g + 8 of its warp's 16, so a row's max is its lane's, then
// the 4 lanes of its group's (shuffles over lane bits 0 and 1), and its sum
// stays a per-lane partial until the end. Dropout multiplies the weights of
// the output, not l. A row whose keys are all masked keeps m = −∞: out = 0,
// lse = −∞.
extern "C" __global__ void __launch_bounds__(ZP_THREADS, ZP_MIN_BLOCKS) $FORWARD(
    const zp_t* __restrict__ q, const zp_t* __restrict__ k, const zp_t* __restrict__ v,
    const zp_mask_t* __restrict__ mask, zp_t* __restrict__ out, float* __restrict__ lse, int heads, int seq,
    float scale, int head_offset, int total_heads, unsigned keep_threshold, float keep_scale, unsigned stream,
    const unsigned long long* __restrict__ zp_rng)
{
  const unsigned long long seed = zp_rng[0], offset = zp_rng[1]; // dropout's Philox key and counter word
  __shared__ __align__(16) zp_t q_s[ZP_ROWS * ZP_STRIDE];
  __shared__ __align__(16) zp_t k_s[ZP_TILE * ZP_STRIDE];
  __shared__ __align__(16) zp_t v_s[ZP_TILE * ZP_STRIDE];
  __shared__ bool live_s[ZP_TILE];  // the tile's key is real and unmasked
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const long long head = (long long)bh * seq * ZP_D;
  const int row0 = blockIdx.x * ZP_ROWS + 16 * warp;  // the warp's first query row
  const float slope = ZP_ALIBI ? zp_alibi_slope(head_offset + h, total_heads) : 0.0f;
  zp_stage_rows(q_s, q + head, blockIdx.x * ZP_ROWS, ZP_ROWS, seq);

  // Per row of the lane (g, g + 8): running max, this lane's share of the sum.
  float m[2] = {zp_neg_inf(), zp_neg_inf()}, l[2] = {0.0f, 0.0f};
  float acc[ZP_D / 8][4];
#pragma unroll
  for (int d = 0; d < ZP_D / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  for (int key0 = 0; key0 < seq; key0 += ZP_TILE) {
    __syncthreads();  // the previous tile's last readers are done
    zp_stage_rows(k_s, k + head, key0, ZP_TILE, seq);
    zp_stage_rows(v_s, v + head, key0, ZP_TILE, seq);
    for (int t = threadIdx.x; t < ZP_TILE; t += ZP_THREADS) {
      live_s[t] = key0 + t < seq && mask[(long long)b * seq + key0 + t] != 0;
    }
    __syncthreads();
    float s[ZP_TILE / 8][4];
#pragma unroll
    for (int n = 0; n < ZP_TILE / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    zp_mma_rows<ZP_TILE>(s, q_s + 16 * warp * ZP_STRIDE, k_s, lane);

    // Scores, and each row's max over the tile.
    float tile_max[2] = {zp_neg_inf(), zp_neg_inf()};
#pragma unroll
    for (int n = 0; n < ZP_TILE / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 8 * n + 2 * (lane % 4) + e % 2, i = row0 + lane / 4 + 8 * (e / 2), j = key0 + t;
        float x = zp_neg_inf();
        if (live_s[t]) {
          x = s[n][e] * scale;
          if (ZP_ALIBI) x -= slope * (float)(i > j ? i - j : j - i);
        }
        s[n][e] = x;
        tile_max[e / 2] = zp_max_nan(tile_max[e / 2], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = zp_max_nan(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = zp_max_nan(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      alpha[r] = m_new == zp_neg_inf() ? 1.0f : zp_exp(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
    // Weights exp(s − m), summed into l before dropout scales them.
#pragma unroll
    for (int n = 0; n < ZP_TILE / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, t = 8 * n + 2 * (lane % 4) + e % 2, i = row0 + lane / 4 + 8 * r, j = key0 + t;
        float p = m[r] == zp_neg_inf() ? 0.0f : zp_exp(s[n][e] - m[r]);
        l[r] += p;
        if (ZP_DROPOUT && i < seq && j < seq) {
          p *= zp_drop_factor(seed, stream, offset, keep_threshold, keep_scale, bh, seq, i, j);
        }
        s[n][e] = p;
      }
    }
#pragma unroll
    for (int d = 0; d < ZP_D / 8; ++d) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[d][e] *= alpha[e / 2];
    }
    zp_mma_weights<ZP_TILE>(acc, s, v_s, lane);
  }

  float factor[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    factor[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int i = row0 + lane / 4 + 8 * r;
    if (lane % 4 == 0 && i < seq) lse[(long long)bh * seq + i] = m[r] == zp_neg_inf() ? zp_neg_inf() : m[r] + logf(l[r]);
  }
  zp_store_rows(out + head, acc, factor, row0, seq, lane);
}
