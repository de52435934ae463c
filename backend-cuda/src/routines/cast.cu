// ── Cast: out = x in the output's dtype ─────────────────────────────────────
// As the host routine converts: to a float output through f32 (an integer
// rounded to f32, then to the output's dtype); integer to integer through
// i64 (an i64 wrapped into an i32); a float to an integer toward zero,
// saturating at i64's range, then wrapped into an i32. The host refuses a
// non-finite float to an integer; a kernel cannot stop the step and writes
// Rust's `as` conversion (NaN as 0, infinities saturated). The output may
// be the input itself (one dtype): each element is read, then written, by
// one thread, so neither pointer is __restrict__. Grid-stride.
__device__ __forceinline__ long long zp_as_i64(const int* p) { return (long long)*p; }
__device__ __forceinline__ long long zp_as_i64(const long long* p) { return *p; }
template <class T> __device__ __forceinline__ long long zp_as_i64(const T* p) { return zp_sat_i64(zp_ld(p)); }

template <class I, class O> __device__ __forceinline__ void zp_cast(const I* x, O* out) { zp_st(out, zp_ld(x)); }
template <class I> __device__ __forceinline__ void zp_cast(const I* x, int* out) { *out = (int)zp_as_i64(x); }
template <class I> __device__ __forceinline__ void zp_cast(const I* x, long long* out) { *out = zp_as_i64(x); }

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    const zp_in_t* x, long long n, zp_out_t* out)
{
  for (long long e = zp_first(); e < n; e += zp_step()) zp_cast(x + e, out + e);
}
