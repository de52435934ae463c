// ── Scale: out = x · factor ────────────────────────────────────────────────
// Each product in double, rounded once to f32 (then to the output's dtype),
// as the host routine computes it. Grid-stride.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    const zp_in_t* __restrict__ x, long long n, double factor, zp_out_t* __restrict__ out)
{
  for (long long e = zp_first(); e < n; e += zp_step()) zp_st(out + e, (float)((double)zp_ld(x + e) * factor));
}
