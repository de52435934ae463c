// ── Embedding's adjoint: out = 0, then out[ids[i]] += dy[i] ────────────────
// Deterministic, no atomics: each table row's sum runs in f64 in a fixed
// order and is rounded once to f32 (then to the output's dtype), so it is
// the host's serial f64 sum rounded, unless the two f64 sums (29 bits finer
// than f32) round to different sides of an f32 tie. The positions are first
// sorted by id (stable), so the sums read them from a list rather than
// walking a chain, and a long list is shared out: a table row named by
// 4,096 positions (BERT's token types) took 1.9 ms on an H100 with one
// thread a column walking all of them.
// $NAME_rank: per position i, rank[i] = how many earlier positions have its
//   id, count[i] = how many positions have it, head[i] = the first of them
//   (all −1/0 for an id that adds nothing), the ids read through shared
//   memory a block's width at a time;
// $NAME_offsets: one block; at each head position, where its id's list
//   starts: the counts of the earlier heads, summed (an exclusive scan);
// $NAME_order: order[offset[head[i]] + rank[i]] = i;
// $NAME_sum: per head position and 32 columns, a block. A list of at
//   least ZP_LONG_LIST positions is shared out: warp w sums positions w,
//   w + 8, … (its lanes 32 neighbouring columns), then warp 0 adds the 8
//   warps' sums in order. A shorter list (most words) is walked by one
//   thread a column, 256 columns a block (every 8th item; the 7 between
//   pass), as the host walks it.
// The output is zeroed before (a fill): rows no id names stay 0. Ids of −1
// (another rank's rows) and ids past the table add nothing.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_rank(
    const zp_id_t* __restrict__ ids, long long n, long long rows, int* __restrict__ rank, int* __restrict__ count,
    int* __restrict__ head)
{
  __shared__ long long tile[ZP_ROUTINE_THREADS];
  for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += zp_step()) {
    const long long i = base + threadIdx.x;
    const long long id = i < n ? (long long)ids[i] : -1;
    const bool valid = i < n && id >= 0 && id < rows;
    int before = 0, total = 0;
    long long first = i;
    for (long long t = 0; t < n; t += blockDim.x) {
      __syncthreads();
      if (t + threadIdx.x < n) tile[threadIdx.x] = (long long)ids[t + threadIdx.x];
      __syncthreads();
      const long long m = n - t < (long long)blockDim.x ? n - t : (long long)blockDim.x;
      if (!valid) continue;
      for (long long k = 0; k < m; ++k) {
        if (tile[k] != id) continue;
        const long long j = t + k;
        if (j < i && before++ == 0) first = j;
        ++total;
      }
    }
    if (i < n) {
      rank[i] = valid ? before : -1;
      count[i] = valid ? total : 0;
      head[i] = valid ? (int)first : -1;
    }
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_offsets(
    const int* __restrict__ rank, const int* __restrict__ count, long long n, int* __restrict__ offset)
{
  __shared__ int scan[ZP_ROUTINE_THREADS];
  int carry = 0;
  for (long long base = 0; base < n; base += blockDim.x) {
    const long long i = base + threadIdx.x;
    const int own = i < n && rank[i] == 0 ? count[i] : 0;
    scan[threadIdx.x] = own;
    __syncthreads();
    for (unsigned d = 1; d < blockDim.x; d <<= 1) {
      const int add = threadIdx.x >= d ? scan[threadIdx.x - d] : 0;
      __syncthreads();
      scan[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < n) offset[i] = carry + scan[threadIdx.x] - own;
    carry += scan[blockDim.x - 1];
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_order(
    const int* __restrict__ rank, const int* __restrict__ head, const int* __restrict__ offset, long long n,
    int* __restrict__ order)
{
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += zp_step()) {
    if (rank[i] >= 0) order[offset[head[i]] + rank[i]] = (int)i;
  }
}

// Positions from which a list is shared out over a block's warps: two a warp.
#define ZP_LONG_LIST (2 * ZP_ROUTINE_THREADS / 32)

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_sum(
    const zp_dy_t* __restrict__ dy, const zp_id_t* __restrict__ ids, const int* __restrict__ rank,
    const int* __restrict__ count, const int* __restrict__ offset, const int* __restrict__ order, long long n,
    long long width, zp_out_t* __restrict__ out)
{
  __shared__ double segment[ZP_ROUTINE_THREADS / 32][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const long long groups = (width + 31) / 32;
  for (long long b = blockIdx.x; b < n * groups; b += gridDim.x) {
    const long long i = b / groups, g = b % groups;
    if (rank[i] != 0) continue;  // the whole block: i is the block's
    const int* list = order + offset[i];
    const int positions = count[i];
    if (positions < ZP_LONG_LIST) {
      const long long c = g * 32 + threadIdx.x;
      if (g % warps != 0 || c >= width) continue;
      double acc = 0.0;
      for (int k = 0; k < positions; ++k) acc += (double)zp_ld(dy + (long long)list[k] * width + c);
      zp_st(out + (long long)ids[i] * width + c, (float)acc);
      continue;
    }
    const long long c = g * 32 + lane;
    double acc = 0.0;
    if (c < width) {
#pragma unroll 4
      for (int k = warp; k < positions; k += warps) acc += (double)zp_ld(dy + (long long)list[k] * width + c);
    }
    const double total = zp_warps_sum(acc, segment);
    if (warp == 0 && c < width) zp_st(out + (long long)ids[i] * width + c, (float)total);
  }
}
