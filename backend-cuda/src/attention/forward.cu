// ── Forward: out = dropout(softmax(s))·v and lse = log Σ_j exp(s_ij) ────────
// Grid (⌈S/16⌉, B·H), ZP_THREADS threads: a block takes 16 query rows of
// one head, 4 per warp, and walks the keys in tiles of ZP_TILE with an online
// softmax (FlashAttention-2): per row a running max m, a running sum l of
// exp(s − m) and the unnormalised output acc, rescaled by exp(m_old − m_new)
// when the max grows, divided by l at the end. Dropout multiplies the
// weights of acc, not l: out = Σ_j z_ij·P_ij·v_j with P normalised first.
// A row whose keys are all masked keeps m = −∞: out = 0, lse = −∞.
extern "C" __global__ void __launch_bounds__(ZP_THREADS, ZP_MIN_BLOCKS) $FORWARD(
    const zp_t* __restrict__ q, const zp_t* __restrict__ k, const zp_t* __restrict__ v,
    const zp_mask_t* __restrict__ mask, zp_t* __restrict__ out, float* __restrict__ lse, int heads, int seq,
    float scale, int head_offset, int total_heads, unsigned keep_threshold, float keep_scale, unsigned stream,
    const unsigned long long* __restrict__ zp_rng)
{
  const unsigned long long seed = zp_rng[0], offset = zp_rng[1]; // dropout's Philox key and counter word
  __shared__ float q_s[ZP_ROWS][ZP_D];     // read by a whole warp at once: a broadcast
  __shared__ float k_s[ZP_TILE][ZP_PAD];   // lane l reads key rows l, l + 32, …
  __shared__ float v_s[ZP_TILE][ZP_D];     // lane l reads dims l, l + 32, …
  __shared__ float p_s[ZP_WARPS][ZP_TILE]; // a row's weights, from the lanes of its keys
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const long long head = (long long)bh * seq * ZP_D;
  const int row0 = blockIdx.x * ZP_ROWS;
  const float slope = ZP_ALIBI ? zp_alibi_slope(head_offset + h, total_heads) : 0.0f;
  zp_stage(&q_s[0][0], ZP_D, q + head, row0, ZP_ROWS, seq);

  float m[ZP_ROWS_PER_WARP], l[ZP_ROWS_PER_WARP], acc[ZP_ROWS_PER_WARP][ZP_DL];
#pragma unroll
  for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
    m[r] = zp_neg_inf();
    l[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < ZP_DL; ++d) acc[r][d] = 0.0f;
  }

  for (int key0 = 0; key0 < seq; key0 += ZP_TILE) {
    __syncthreads();  // the previous tile's last readers are done
    zp_stage(&k_s[0][0], ZP_PAD, k + head, key0, ZP_TILE, seq);
    zp_stage(&v_s[0][0], ZP_D, v + head, key0, ZP_TILE, seq);
    __syncthreads();
    const int keys = seq - key0 < ZP_TILE ? seq - key0 : ZP_TILE;
    // This lane's keys, and whether each is a real, unmasked key.
    int j[ZP_PER_LANE];
    bool live[ZP_PER_LANE];
#pragma unroll
    for (int c = 0; c < ZP_PER_LANE; ++c) {
      j[c] = key0 + lane + 32 * c;
      live[c] = j[c] < seq && mask[(long long)b * seq + j[c]] != 0;
    }
#pragma unroll
    for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
      const int lr = warp * ZP_ROWS_PER_WARP + r, i = row0 + lr;
      float s[ZP_PER_LANE], s_max = zp_neg_inf();
#pragma unroll
      for (int c = 0; c < ZP_PER_LANE; ++c) {
        s[c] = live[c] ? zp_score(q_s[lr], k_s[lane + 32 * c], scale, slope, i, j[c]) : zp_neg_inf();
        s_max = zp_max_nan(s_max, s[c]);
      }
      const float m_new = fmaxf(m[r], zp_warp_max(s_max));
      float p[ZP_PER_LANE], p_sum = 0.0f, alpha = 1.0f;
#pragma unroll
      for (int c = 0; c < ZP_PER_LANE; ++c) p[c] = 0.0f;
      if (m_new != zp_neg_inf()) {
        alpha = zp_exp(m[r] - m_new);
#pragma unroll
        for (int c = 0; c < ZP_PER_LANE; ++c) p[c] = zp_exp(s[c] - m_new);
      }
#pragma unroll
      for (int c = 0; c < ZP_PER_LANE; ++c) p_sum += p[c];
      l[r] = l[r] * alpha + zp_warp_sum(p_sum);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < ZP_PER_LANE; ++c) {
        if (ZP_DROPOUT && j[c] < seq && i < seq) p[c] *= zp_drop_factor(seed, stream, offset, keep_threshold, keep_scale, bh, seq, i, j[c]);
        p_s[warp][lane + 32 * c] = p[c];
      }
      __syncwarp();
#pragma unroll
      for (int d = 0; d < ZP_DL; ++d) {
        float a = acc[r][d] * alpha;
        for (int jj = 0; jj < keys; ++jj) a += p_s[warp][jj] * v_s[jj][lane + 32 * d];
        acc[r][d] = a;
      }
      __syncwarp();  // the strip is rewritten by the next row
    }
  }

#pragma unroll
  for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
    const int i = row0 + warp * ZP_ROWS_PER_WARP + r;
    if (i >= seq) continue;
#pragma unroll
    for (int d = 0; d < ZP_DL; ++d) zp_st(out + head + (long long)i * ZP_D + lane + 32 * d, l[r] > 0.0f ? acc[r][d] / l[r] : 0.0f);
    if (lane == 0) lse[(long long)bh * seq + i] = m[r] == zp_neg_inf() ? zp_neg_inf() : m[r] + logf(l[r]);
  }
}
