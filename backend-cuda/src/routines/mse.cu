// ── MSE: the mean of (p − t)² over every element ────────────────────────────
// As the host routine: differences and squares in double on the operands'
// f32 values, the mean rounded to f32, then to the output's dtype.
// $NAME_partials: each block sums its grid-stride share into partial[block]
//   (a block reduction: a fixed order for a given grid).
// $NAME_mean: one block adds the `blocks` partials in a fixed order and
//   writes total / n (0 when n is 0). No atomics: the same bits every run
//   (the host adds in element order: the f64 sum may differ in its last
//   bits, far below the f32 result's).
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_partials(
    const zp_p_t* __restrict__ p, const zp_t_t* __restrict__ t, long long n, double* __restrict__ partial)
{
  __shared__ double red[32];
  double sum = 0.0;
  for (long long e = zp_first(); e < n; e += zp_step()) {
    const double d = (double)zp_ld(p + e) - (double)zp_ld(t + e);
    sum += d * d;
  }
  sum = zp_block_sum(sum, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_mean(
    const double* __restrict__ partial, long long blocks, long long n, zp_out_t* __restrict__ out)
{
  __shared__ double red[32];
  double total = 0.0;
  for (long long b = threadIdx.x; b < blocks; b += blockDim.x) total += partial[b];
  total = zp_block_sum(total, red);
  if (threadIdx.x == 0) zp_st(out, n == 0 ? 0.0f : (float)(total / (double)n));
}
