// ── Arange: out[i] = i, in the output's dtype ──────────────────────────────
// Integers as themselves; a float output rounds i to f32, then to its dtype,
// as the host routine writes them. Grid-stride.
__device__ __forceinline__ void zp_put_index(int* p, long long i) { *p = (int)i; }
__device__ __forceinline__ void zp_put_index(long long* p, long long i) { *p = i; }
template <class T> __device__ __forceinline__ void zp_put_index(T* p, long long i) { zp_st(p, (float)i); }

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(zp_out_t* __restrict__ out, long long n)
{
  for (long long e = zp_first(); e < n; e += zp_step()) zp_put_index(out + e, e);
}
