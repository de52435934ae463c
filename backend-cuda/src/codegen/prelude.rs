//! The CUDA C helpers generated kernels call, included only where a kernel
//! needs them (so f32 kernels do not pay for parsing the bf16/f16 headers).
//!
//! Loads and stores are overloaded on the pointer type, so the generator
//! writes `zp_ld(p)` whatever the operand's dtype; bf16/f16 go through
//! `cuda_bf16.h`/`cuda_fp16.h` (`__bfloat162float`, `__float2bfloat16_rn`:
//! round to nearest even) and compute in `float`. The math helpers are
//! overloaded on `float` (per-element code) and `double` (launch-uniform
//! values, computed as the interpreter computes them).

/// What every source starts with: the 16-bit headers it uses, [`MATH`],
/// then the bf16/f16 loads and stores it uses.
pub(crate) fn types_and_math(bf16: bool, f16: bool) -> String {
    let mut s = String::new();
    if bf16 {
        s.push_str("#include <cuda_bf16.h>\n");
    }
    if f16 {
        s.push_str("#include <cuda_fp16.h>\n");
    }
    s.push_str(MATH);
    if bf16 {
        s.push_str(BF16);
    }
    if f16 {
        s.push_str(F16);
    }
    s
}

/// Always included: math and scalar f32/integer loads and stores.
pub(crate) const MATH: &str = r#"
__device__ __forceinline__ float zp_exp(float x) { return expf(x); }
__device__ __forceinline__ double zp_exp(double x) { return exp(x); }
__device__ __forceinline__ float zp_erf(float x) { return erff(x); }
__device__ __forceinline__ double zp_erf(double x) { return erf(x); }
__device__ __forceinline__ float zp_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double zp_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float zp_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double zp_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float zp_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double zp_pow(double x, double y) { return pow(x, y); }
// Φ(x), accurate in both tails (GELU's x·Φ(x) keeps its relative accuracy for x ≪ 0).
__device__ __forceinline__ float zp_normcdf(float x) { return normcdff(x); }
__device__ __forceinline__ double zp_normcdf(double x) { return normcdf(x); }
// max/min ignoring a NaN operand, as Rust's f64::max/min (the interpreter's) do.
__device__ __forceinline__ float zp_max(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double zp_max(double x, double y) { return fmax(x, y); }
__device__ __forceinline__ float zp_min(float x, float y) { return fminf(x, y); }
__device__ __forceinline__ double zp_min(double x, double y) { return fmin(x, y); }

template <typename T> __device__ __forceinline__ T zp_rsqrt(T x) { return T(1) / zp_sqrt(x); }
template <typename T> __device__ __forceinline__ T zp_recip(T x) { return T(1) / x; }
// max(0, x) with NaN kept NaN (PyTorch's relu).
template <typename T> __device__ __forceinline__ T zp_relu(T x) { return (x > T(0) || x != x) ? x : T(0); }
// The logistic function without overflow for large |x|.
template <typename T> __device__ __forceinline__ T zp_sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + zp_exp(-x));
  const T e = zp_exp(x);
  return e / (T(1) + e);
}
template <typename T> __device__ __forceinline__ T zp_silu(T x) { return x * zp_sigmoid(x); }
template <typename T> __device__ __forceinline__ T zp_silu_deriv(T x) {
  const T s = zp_sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}
template <typename T> __device__ __forceinline__ T zp_gelu_erf(T x) { return x * zp_normcdf(x); }
// Φ(x) + x·φ(x), φ(x) = exp(−x²/2)/√(2π).
template <typename T> __device__ __forceinline__ T zp_gelu_erf_deriv(T x) {
  return zp_normcdf(x) + x * zp_exp(T(-0.5) * x * x) * T(0.3989422804014327);
}
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
template <typename T> __device__ __forceinline__ T zp_gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + zp_tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x)));
}
template <typename T> __device__ __forceinline__ T zp_gelu_tanh_deriv(T x) {
  const T t = zp_tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(0.7978845608028654) * (T(1) + T(3.0 * 0.044715) * x * x);
}

__device__ __forceinline__ float zp_ld(const float* p) { return *p; }
__device__ __forceinline__ float zp_ld(const int* p) { return (float)*p; }
__device__ __forceinline__ float zp_ld(const long long* p) { return (float)*p; }
__device__ __forceinline__ double zp_ld_f64(const float* p) { return (double)*p; }
__device__ __forceinline__ double zp_ld_f64(const int* p) { return (double)*p; }
__device__ __forceinline__ double zp_ld_f64(const long long* p) { return (double)*p; }
__device__ __forceinline__ void zp_st(float* p, float x) { *p = x; }
__device__ __forceinline__ void zp_st(float* p, double x) { *p = (float)x; }
// Four floats in one 16-byte access (p 16-byte aligned).
__device__ __forceinline__ void zp_ld4(const float* p, float* v) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
__device__ __forceinline__ void zp_st4(float* p, const float* v) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
"#;

/// Included when a kernel has a bf16 operand.
pub(crate) const BF16: &str = r#"
__device__ __forceinline__ float zp_ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ double zp_ld_f64(const __nv_bfloat16* p) { return (double)__bfloat162float(*p); }
__device__ __forceinline__ void zp_st(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void zp_st(__nv_bfloat16* p, double x) { *p = __double2bfloat16(x); }
// Four bf16 in one 8-byte access, eight in one 16-byte access.
__device__ __forceinline__ void zp_ld4(const __nv_bfloat16* p, float* v) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&q);
  for (int i = 0; i < 2; ++i) { const float2 f = __bfloat1622float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void zp_ld8(const __nv_bfloat16* p, float* v) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&q);
  for (int i = 0; i < 4; ++i) { const float2 f = __bfloat1622float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void zp_st4(__nv_bfloat16* p, const float* v) {
  uint2 q;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&q);
  for (int i = 0; i < 2; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint2*>(p) = q;
}
__device__ __forceinline__ void zp_st8(__nv_bfloat16* p, const float* v) {
  uint4 q;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&q);
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = q;
}
"#;

/// Included when a kernel has an f16 operand.
pub(crate) const F16: &str = r#"
__device__ __forceinline__ float zp_ld(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ double zp_ld_f64(const __half* p) { return (double)__half2float(*p); }
__device__ __forceinline__ void zp_st(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void zp_st(__half* p, double x) { *p = __double2half(x); }
// Four f16 in one 8-byte access, eight in one 16-byte access.
__device__ __forceinline__ void zp_ld4(const __half* p, float* v) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&q);
  for (int i = 0; i < 2; ++i) { const float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void zp_ld8(const __half* p, float* v) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&q);
  for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void zp_st4(__half* p, const float* v) {
  uint2 q;
  __half2* h = reinterpret_cast<__half2*>(&q);
  for (int i = 0; i < 2; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint2*>(p) = q;
}
__device__ __forceinline__ void zp_st8(__half* p, const float* v) {
  uint4 q;
  __half2* h = reinterpret_cast<__half2*>(&q);
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = q;
}
"#;

/// Included when a kernel has a reduction: warp shuffles, then one value per
/// warp through shared memory, then every warp reduces those (so every
/// thread gets the total). `red` holds 32 values; the block is a whole
/// number of warps. The trailing barrier lets the next reduction reuse `red`.
pub(crate) const REDUCE: &str = r#"
// NaN if either is NaN (ReduceMax propagates NaN; fmaxf would drop it).
__device__ __forceinline__ float zp_max_nan(float x, float y) { return (x != x || y != y) ? (x + y) : fmaxf(x, y); }
__device__ __forceinline__ float zp_warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float zp_warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = zp_max_nan(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float zp_block_sum(float x, float* red) {
  x = zp_warp_sum(x);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x % 32 < blockDim.x / 32 ? red[threadIdx.x % 32] : 0.0f;
  x = zp_warp_sum(x);
  __syncthreads();
  return x;
}
__device__ __forceinline__ float zp_block_max(float x, float* red) {
  x = zp_warp_max(x);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x % 32 < blockDim.x / 32 ? red[threadIdx.x % 32] : -__int_as_float(0x7f800000);
  x = zp_warp_max(x);
  __syncthreads();
  return x;
}
"#;

/// Included when a cross-row output omits the row axis: the row's sum in `double`.
pub(crate) const REDUCE_F64: &str = r#"
__device__ __forceinline__ double zp_block_sum_f64(double x, double* red) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x % 32 < blockDim.x / 32 ? red[threadIdx.x % 32] : 0.0;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  return x;
}
"#;

/// Included for dropout: Philox4x32-10 (Random123), bit-exact with
/// `zeroplan_ir::interp::random::dropout_keeps`. Element `e` is kept when
/// `w0 >> 8 ≥ threshold`, `threshold = ⌈p·2²⁴⌉` (exact: `u = (w0 >> 8)·2⁻²⁴`,
/// so `u ≥ p` ⇔ `w0 >> 8 ≥ ⌈p·2²⁴⌉`); key `(seed lo, seed hi)`, counter
/// `(e lo, e hi, stream, offset)`.
pub(crate) const PHILOX: &str = r#"
__device__ __forceinline__ bool zp_keep(unsigned long long seed, unsigned stream, unsigned offset,
                                        unsigned long long e, unsigned threshold) {
  unsigned c0 = (unsigned)e, c1 = (unsigned)(e >> 32), c2 = stream, c3 = offset;
  unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return (c0 >> 8) >= threshold;
}
"#;
