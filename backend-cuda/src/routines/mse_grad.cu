// ── MSE's gradient: out = dloss · 2 · (p − t) / n ───────────────────────────
// In double on the operands' f32 values, left to right as the host routine
// computes it, rounded once to f32, then to the output's dtype. Grid-stride.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    const zp_p_t* __restrict__ p, const zp_t_t* __restrict__ t, const zp_dloss_t* __restrict__ dloss, long long n,
    zp_out_t* __restrict__ out)
{
  const double d = (double)zp_ld(dloss);
  for (long long e = zp_first(); e < n; e += zp_step()) {
    zp_st(out + e, (float)(d * 2.0 * ((double)zp_ld(p + e) - (double)zp_ld(t + e)) / (double)n));
  }
}
