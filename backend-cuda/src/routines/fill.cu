// ── Fill: every unit set to one pattern ─────────────────────────────────────
// A unit (zp_unit_t, up to 16 bytes of whole elements) takes its bytes from
// lo, hi: the element's bytes, repeated. Grid-stride.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    zp_unit_t* __restrict__ out, long long n, unsigned long long lo, unsigned long long hi)
{
  const unsigned long long words[2] = {lo, hi};
  zp_unit_t value;
  memcpy(&value, words, sizeof(zp_unit_t));
  for (long long e = zp_first(); e < n; e += zp_step()) out[e] = value;
}
