// ── SumTo: x summed over the axes broadcasting repeats, down to out ─────────
// `keep` (ZpStrided) runs over the outputs, `src` their strides in x, and
// `reduce` over one output's summands, `src` their strides in x. Sums are
// in double, rounded once to f32, then to the output's dtype, as the host
// routine's; the reduction order is fixed (no atomics), so every run gives
// the same bits. The summands of an output are cut into `chunks` runs of
// `per` (the last shorter): with one chunk a kernel writes the output, else
// each run's sum goes to partial[chunk · outputs + output] and $NAME_finish
// adds them up: a block per 32 outputs, its warp w summing runs w, w + 8, …
// of its lane's output (32 lanes, 32 neighbouring partials), then the
// warps' sums in warp order: a fixed order, so the same bits every run.
// $NAME_rows: x's innermost axis is summed: a block per (output, chunk),
//   its threads striding along the run, then a block reduction.
// $NAME_cols: x's innermost axis is kept: a thread per (output, chunk),
//   neighbouring threads reading neighbouring elements.
__device__ __forceinline__ void zp_sum_store(
    double sum, long long t, long long c, long long chunks, long long outputs, double* partial, zp_out_t* out)
{
  if (chunks == 1) {
    zp_st(out + t, (float)sum);
  } else {
    partial[c * outputs + t] = sum;
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_rows(
    const zp_in_t* __restrict__ x, ZpStrided keep, ZpStrided reduce, long long chunks, long long per,
    double* __restrict__ partial, zp_out_t* __restrict__ out)
{
  __shared__ double red[32];
  for (long long w = blockIdx.x; w < keep.count * chunks; w += gridDim.x) {
    const long long t = w % keep.count, c = w / keep.count;
    long long base, unused;
    zp_offsets(keep, t, base, unused);
    const long long end = (c + 1) * per < reduce.count ? (c + 1) * per : reduce.count;
    double sum = 0.0;
    for (long long r = c * per + threadIdx.x; r < end; r += blockDim.x) {
      long long at;
      zp_offsets(reduce, r, at, unused);
      sum += (double)zp_ld(x + base + at);
    }
    sum = zp_block_sum(sum, red);
    if (threadIdx.x == 0) zp_sum_store(sum, t, c, chunks, keep.count, partial, out);
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_cols(
    const zp_in_t* __restrict__ x, ZpStrided keep, ZpStrided reduce, long long chunks, long long per,
    double* __restrict__ partial, zp_out_t* __restrict__ out)
{
  for (long long w = zp_first(); w < keep.count * chunks; w += zp_step()) {
    const long long t = w % keep.count, c = w / keep.count;
    long long base, unused;
    zp_offsets(keep, t, base, unused);
    const long long end = (c + 1) * per < reduce.count ? (c + 1) * per : reduce.count;
    double sum = 0.0;
    for (long long r = c * per; r < end; ++r) {
      long long at;
      zp_offsets(reduce, r, at, unused);
      sum += (double)zp_ld(x + base + at);
    }
    zp_sum_store(sum, t, c, chunks, keep.count, partial, out);
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_finish(
    const double* __restrict__ partial, long long outputs, long long chunks, zp_out_t* __restrict__ out)
{
  __shared__ double segment[ZP_ROUTINE_THREADS / 32][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (long long first = (long long)blockIdx.x * 32; first < outputs; first += (long long)gridDim.x * 32) {
    const long long t = first + lane;
    double sum = 0.0;
    if (t < outputs) {
      for (long long c = warp; c < chunks; c += warps) sum += partial[c * outputs + t];
    }
    const double total = zp_warps_sum(sum, segment);
    if (warp == 0 && t < outputs) zp_st(out + t, (float)total);
  }
}
