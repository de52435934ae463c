// ── Embedding's adjoint: out = 0, then out[ids[i]] += dy[i] ────────────────
// Deterministic, and the host's sums to the bit: each table row's sum runs
// in f64 over its positions in increasing order, rounded once to f32 (then
// to the output's dtype). No atomics:
// $NAME_chain: per position i, next[i] = the next position with the same id
//   (−1 at its last) and first[i] = 1 where no earlier position has it, the
//   ids read through shared memory a block's width at a time;
// $NAME_sum: one block per first position walks its chain, each thread
//   summing its columns, and writes the table row.
// The output is zeroed before (a fill): rows no id names stay 0. Ids of −1
// (another rank's rows) and ids past the table add nothing.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_chain(
    const zp_id_t* __restrict__ ids, long long n, long long rows, int* __restrict__ next, int* __restrict__ first)
{
  __shared__ long long tile[ZP_ROUTINE_THREADS];
  for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += zp_step()) {
    const long long i = base + threadIdx.x;
    const long long id = i < n ? (long long)ids[i] : -1;
    const bool valid = i < n && id >= 0 && id < rows;
    long long after = -1;
    bool is_first = valid;
    for (long long t = 0; t < n; t += blockDim.x) {
      __syncthreads();
      if (t + threadIdx.x < n) tile[threadIdx.x] = (long long)ids[t + threadIdx.x];
      __syncthreads();
      const long long m = n - t < (long long)blockDim.x ? n - t : (long long)blockDim.x;
      if (!valid) continue;
      for (long long k = 0; k < m; ++k) {
        if (tile[k] != id) continue;
        const long long j = t + k;
        if (j < i) is_first = false;
        else if (j > i && after < 0) after = j;
      }
    }
    if (i < n) {
      next[i] = (int)after;
      first[i] = is_first ? 1 : 0;
    }
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_sum(
    const zp_dy_t* __restrict__ dy, const zp_id_t* __restrict__ ids, const int* __restrict__ next,
    const int* __restrict__ first, long long n, long long width, zp_out_t* __restrict__ out)
{
  for (long long i = blockIdx.x; i < n; i += gridDim.x) {
    if (!first[i]) continue;
    const long long id = (long long)ids[i];
    for (long long c = threadIdx.x; c < width; c += blockDim.x) {
      double acc = 0.0;
      for (long long j = i; j >= 0; j = next[j]) acc += (double)zp_ld(dy + j * width + c);
      zp_st(out + id * width + c, (float)acc);
    }
  }
}
