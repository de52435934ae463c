// ── ALiBi on a tensor rank's heads: out = x − m_h · |i − j| ─────────────────
// Over [B, H, Sq, Sk] scores: element (b, h, i, j) less its head's slope
// times the distance between query i and key j, in f32 as the host routine
// and the row kernel compute it: the product rounded (no fused multiply-add)
// before the difference. The output may be x itself (element for element).
// Grid-stride.
constexpr int ZP_MAX_HEADS = 64;

// Each head's slope; as `zeroplan_backend_cuda::routines::alibi::Slopes`.
struct ZpSlopes {
  float m[ZP_MAX_HEADS];
};

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    const zp_in_t* x, long long heads, long long sq, long long sk, long long n, ZpSlopes slopes, zp_out_t* out)
{
  for (long long e = zp_first(); e < n; e += zp_step()) {
    const long long key = e % sk, row = e / sk, query = row % sq, head = (row / sq) % heads;
    const float distance = (float)(int)(key > query ? key - query : query - key);
    zp_st(out + e, zp_ld(x + e) - __fmul_rn(slopes.m[head], distance));
  }
}
