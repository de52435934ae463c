// ── Backward (FlashAttention-2): dq, dk, dv from q, k, v, mask, out, lse, dout ─
// P_ij = exp(s_ij − lse_i) is recomputed from the forward's lse (0 where the
// key is masked, and for a row with lse = −∞, whose keys are all masked);
// D_i = Σ_d dout_id·out_id; with z_ij dropout's factor (1/(1−p) or 0; 1
// without dropout), dP_ij = z_ij·(dout_i·v_j) and dS_ij = P_ij·(dP_ij − D_i).
// Then dv_j = Σ_i z_ij·P_ij·dout_i, dk_j = scale·Σ_i dS_ij·q_i and
// dq_i = scale·Σ_j dS_ij·k_j. Two kernels, each owning what it writes (no
// atomics, a fixed summation order: deterministic): dQ over query rows,
// dK/dV over key rows; each recomputes P and D_i for itself.

// This row's P_ij·z_ij and dS_ij (both 0 for a dead pair).
__device__ __forceinline__ void zp_grad_pair(const float* qrow, const float* krow, const float* dorow,
                                             const float* vrow, float lse_i, float d_i, float scale, float slope,
                                             int i, int j, bool live, int bh, int seq, unsigned long long seed,
                                             unsigned stream, unsigned long long offset, unsigned keep_threshold,
                                             float keep_scale, float* pz, float* ds) {
  *pz = 0.0f;
  *ds = 0.0f;
  if (!live || lse_i == zp_neg_inf()) return;
  const float p = zp_exp(zp_score(qrow, krow, scale, slope, i, j) - lse_i);
  const float z = ZP_DROPOUT ? zp_drop_factor(seed, stream, offset, keep_threshold, keep_scale, bh, seq, i, j) : 1.0f;
  *pz = p * z;
  *ds = p * (z * zp_dot(dorow, vrow) - d_i);
}

// D_i of query i: Σ_d dout·out over the lanes' dims, then the warp's sum.
__device__ __forceinline__ float zp_row_term(const float* dorow, const zp_t* out_row, int lane) {
  float sum = 0.0f;
#pragma unroll
  for (int d = 0; d < ZP_DL; ++d) sum += dorow[lane + 32 * d] * zp_ld(out_row + lane + 32 * d);
  return zp_warp_sum(sum);
}

// dQ. Grid (⌈S/16⌉, B·H), ZP_THREADS threads: 16 query rows per block, 4 per
// warp; keys in tiles of ZP_TILE, ZP_PER_LANE per lane; lanes split the head
// dim for Σ_j dS·k.
extern "C" __global__ void __launch_bounds__(ZP_THREADS, ZP_MIN_BLOCKS) $BACKWARD_DQ(
    const zp_t* __restrict__ q, const zp_t* __restrict__ k, const zp_t* __restrict__ v,
    const zp_mask_t* __restrict__ mask, const zp_t* __restrict__ out, const float* __restrict__ lse,
    const zp_t* __restrict__ dout, zp_t* __restrict__ dq, int heads, int seq, float scale, int head_offset,
    int total_heads, unsigned keep_threshold, float keep_scale, unsigned stream,
    const unsigned long long* __restrict__ zp_rng)
{
  const unsigned long long seed = zp_rng[0], offset = zp_rng[1]; // dropout's Philox key and counter word
  __shared__ float q_s[ZP_ROWS][ZP_D];      // broadcast reads
  __shared__ float do_s[ZP_ROWS][ZP_D];     // broadcast reads
  __shared__ float k_s[ZP_TILE][ZP_PAD];    // lane l reads key rows l, l + 32, …; then dims across lanes
  __shared__ float v_s[ZP_TILE][ZP_PAD];    // lane l reads key rows l, l + 32, …
  __shared__ float ds_s[ZP_WARPS][ZP_TILE]; // a row's dS, from the lanes of its keys
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const long long head = (long long)bh * seq * ZP_D;
  const int row0 = blockIdx.x * ZP_ROWS;
  const float slope = ZP_ALIBI ? zp_alibi_slope(head_offset + h, total_heads) : 0.0f;
  zp_stage(&q_s[0][0], ZP_D, q + head, row0, ZP_ROWS, seq);
  zp_stage(&do_s[0][0], ZP_D, dout + head, row0, ZP_ROWS, seq);
  __syncthreads();

  float lse_r[ZP_ROWS_PER_WARP], d_r[ZP_ROWS_PER_WARP], acc[ZP_ROWS_PER_WARP][ZP_DL];
#pragma unroll
  for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
    const int lr = warp * ZP_ROWS_PER_WARP + r, i = row0 + lr;
    const bool real = i < seq;
    lse_r[r] = real ? lse[(long long)bh * seq + i] : zp_neg_inf();
    d_r[r] = zp_row_term(do_s[lr], out + head + (long long)(real ? i : 0) * ZP_D, lane);
#pragma unroll
    for (int d = 0; d < ZP_DL; ++d) acc[r][d] = 0.0f;
  }

  for (int key0 = 0; key0 < seq; key0 += ZP_TILE) {
    __syncthreads();
    zp_stage(&k_s[0][0], ZP_PAD, k + head, key0, ZP_TILE, seq);
    zp_stage(&v_s[0][0], ZP_PAD, v + head, key0, ZP_TILE, seq);
    __syncthreads();
    const int keys = seq - key0 < ZP_TILE ? seq - key0 : ZP_TILE;
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
#pragma unroll
      for (int c = 0; c < ZP_PER_LANE; ++c) {
        float pz, ds;
        zp_grad_pair(q_s[lr], k_s[lane + 32 * c], do_s[lr], v_s[lane + 32 * c], lse_r[r], d_r[r], scale, slope, i,
                     j[c], live[c] && i < seq, bh, seq, seed, stream, offset, keep_threshold, keep_scale, &pz, &ds);
        ds_s[warp][lane + 32 * c] = ds;
      }
      __syncwarp();
#pragma unroll
      for (int d = 0; d < ZP_DL; ++d) {
        float a = acc[r][d];
        for (int jj = 0; jj < keys; ++jj) a += ds_s[warp][jj] * k_s[jj][lane + 32 * d];
        acc[r][d] = a;
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
    const int i = row0 + warp * ZP_ROWS_PER_WARP + r;
    if (i >= seq) continue;
#pragma unroll
    for (int d = 0; d < ZP_DL; ++d) zp_st(dq + head + (long long)i * ZP_D + lane + 32 * d, acc[r][d] * scale);
  }
}

// dK and dV. Grid (⌈S/16⌉, B·H), ZP_THREADS threads: 16 key rows per block,
// 4 per warp; queries in tiles of ZP_TILE, ZP_PER_LANE per lane (with their
// lse and D_i); lanes split the head dim for Σ_i z·P·dout and Σ_i dS·q.
extern "C" __global__ void __launch_bounds__(ZP_THREADS, ZP_MIN_BLOCKS) $BACKWARD_DKDV(
    const zp_t* __restrict__ q, const zp_t* __restrict__ k, const zp_t* __restrict__ v,
    const zp_mask_t* __restrict__ mask, const zp_t* __restrict__ out, const float* __restrict__ lse,
    const zp_t* __restrict__ dout, zp_t* __restrict__ dk, zp_t* __restrict__ dv, int heads, int seq, float scale,
    int head_offset, int total_heads, unsigned keep_threshold, float keep_scale, unsigned stream,
    const unsigned long long* __restrict__ zp_rng)
{
  const unsigned long long seed = zp_rng[0], offset = zp_rng[1]; // dropout's Philox key and counter word
  __shared__ float k_s[ZP_ROWS][ZP_D];       // broadcast reads
  __shared__ float v_s[ZP_ROWS][ZP_D];       // broadcast reads
  __shared__ float q_s[ZP_TILE][ZP_PAD];     // lane l reads query rows l, l + 32, …; then dims across lanes
  __shared__ float do_s[ZP_TILE][ZP_PAD];
  __shared__ float lse_s[ZP_TILE];
  __shared__ float d_s[ZP_TILE];
  __shared__ float w_s[ZP_WARPS][2][ZP_TILE]; // a key row's z·P and dS, from the lanes of their queries
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const long long head = (long long)bh * seq * ZP_D;
  const int key0 = blockIdx.x * ZP_ROWS;
  const float slope = ZP_ALIBI ? zp_alibi_slope(head_offset + h, total_heads) : 0.0f;
  zp_stage(&k_s[0][0], ZP_D, k + head, key0, ZP_ROWS, seq);
  zp_stage(&v_s[0][0], ZP_D, v + head, key0, ZP_ROWS, seq);

  bool live[ZP_ROWS_PER_WARP];
  float dk_r[ZP_ROWS_PER_WARP][ZP_DL], dv_r[ZP_ROWS_PER_WARP][ZP_DL];
#pragma unroll
  for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
    const int j = key0 + warp * ZP_ROWS_PER_WARP + r;
    live[r] = j < seq && mask[(long long)b * seq + j] != 0;
#pragma unroll
    for (int d = 0; d < ZP_DL; ++d) dk_r[r][d] = dv_r[r][d] = 0.0f;
  }

  for (int query0 = 0; query0 < seq; query0 += ZP_TILE) {
    __syncthreads();
    zp_stage(&q_s[0][0], ZP_PAD, q + head, query0, ZP_TILE, seq);
    zp_stage(&do_s[0][0], ZP_PAD, dout + head, query0, ZP_TILE, seq);
    __syncthreads();
    // lse and D_i of the tile's queries: each warp takes every fourth.
    for (int t = warp; t < ZP_TILE; t += ZP_WARPS) {
      const int i = query0 + t;
      const float d_i = zp_row_term(do_s[t], out + head + (long long)(i < seq ? i : 0) * ZP_D, lane);
      if (lane == 0) {
        lse_s[t] = i < seq ? lse[(long long)bh * seq + i] : zp_neg_inf();
        d_s[t] = d_i;
      }
    }
    __syncthreads();
    const int queries = seq - query0 < ZP_TILE ? seq - query0 : ZP_TILE;
#pragma unroll
    for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
      const int lk = warp * ZP_ROWS_PER_WARP + r, j = key0 + lk;
#pragma unroll
      for (int c = 0; c < ZP_PER_LANE; ++c) {
        const int t = lane + 32 * c, i = query0 + t;
        float pz, ds;
        zp_grad_pair(q_s[t], k_s[lk], do_s[t], v_s[lk], lse_s[t], d_s[t], scale, slope, i, j, live[r] && i < seq, bh,
                     seq, seed, stream, offset, keep_threshold, keep_scale, &pz, &ds);
        w_s[warp][0][t] = pz;
        w_s[warp][1][t] = ds;
      }
      __syncwarp();
#pragma unroll
      for (int d = 0; d < ZP_DL; ++d) {
        float a = dv_r[r][d], g = dk_r[r][d];
        for (int t = 0; t < queries; ++t) {
          a += w_s[warp][0][t] * do_s[t][lane + 32 * d];
          g += w_s[warp][1][t] * q_s[t][lane + 32 * d];
        }
        dv_r[r][d] = a;
        dk_r[r][d] = g;
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int r = 0; r < ZP_ROWS_PER_WARP; ++r) {
    const int j = key0 + warp * ZP_ROWS_PER_WARP + r;
    if (j >= seq) continue;
#pragma unroll
    for (int d = 0; d < ZP_DL; ++d) {
      zp_st(dk + head + (long long)j * ZP_D + lane + 32 * d, dk_r[r][d] * scale);
      zp_st(dv + head + (long long)j * ZP_D + lane + 32 * d, dv_r[r][d]);
    }
  }
}
