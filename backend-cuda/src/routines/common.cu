// ── Routines: what every routine kernel shares ──────────────────────────────
// Blocks of ZP_ROUTINE_THREADS threads (whole warps). Reductions are
// warp shuffles then one value per warp through shared memory, in a fixed
// order: the same inputs give the same bits, run after run.
constexpr int ZP_ROUTINE_THREADS = 256;
constexpr int ZP_MAX_DIMS = 8;

// A strided copy's index space (row-major over `size`) and, per axis, the
// stride in units of the source and of the destination; as
// `zeroplan_backend_cuda::routines::layout::Strided` lays it out.
struct ZpStrided {
  long long size[ZP_MAX_DIMS];
  long long src[ZP_MAX_DIMS];
  long long dst[ZP_MAX_DIMS];
  long long count;
  int rank;
  int pad;
};

// A transpose whose input's last axis moves: tiles of (rows of axis B, the
// output's last axis) × (columns of axis A, the input's last axis), over the
// batch of the other axes; as `routines::layout::Tiled` lays it out.
struct ZpTiled {
  long long rows;
  long long cols;
  long long src_row;
  long long dst_col;
  long long batches;
  long long size[ZP_MAX_DIMS];
  long long src[ZP_MAX_DIMS];
  long long dst[ZP_MAX_DIMS];
  int rank;
  int pad;
};

__device__ __forceinline__ float zp_neg_inf() { return __int_as_float(0xff800000u); }

// The block's maximum (NaN ignored, as f32::max folds), in every thread.
__device__ __forceinline__ float zp_block_max(float x, float* red) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = lane < (int)(blockDim.x / 32) ? red[lane] : zp_neg_inf();
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  return x;
}

// The block's sum, in every thread, in a fixed order.
__device__ __forceinline__ double zp_block_sum(double x, double* red) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = lane < (int)(blockDim.x / 32) ? red[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  return x;
}

// Each lane's sum over the block's warps, in warp order, in warp 0's lanes
// (0 elsewhere): a block of 8 warps adds 8 partial sums of 32 neighbouring
// outputs. `segment` holds a double per thread.
__device__ __forceinline__ double zp_warps_sum(double x, double (*segment)[32]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  segment[warp][lane] = x;
  __syncthreads();
  double total = 0.0;
  if (warp == 0) {
    for (int w = 0; w < (int)(blockDim.x / 32); ++w) total += segment[w][lane];
  }
  __syncthreads();
  return total;
}

// Elements of T in one 16-byte access.
template <class T> struct ZpLanes { static constexpr int N = 16 / (int)sizeof(T); };

template <class T> __device__ __forceinline__ void zp_ld16(const T* p, float* v) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&q);
  for (int i = 0; i < ZpLanes<T>::N; ++i) v[i] = zp_ld(e + i);
}
template <class T> __device__ __forceinline__ void zp_st16(T* p, const float* v) {
  uint4 q;
  T* e = reinterpret_cast<T*>(&q);
  for (int i = 0; i < ZpLanes<T>::N; ++i) zp_st(e + i, v[i]);
  *reinterpret_cast<uint4*>(p) = q;
}

// Elements of a row of n before its first 16-byte boundary (rows need not
// start on one: a [N, 30522] bf16 row starts on 4 bytes).
template <class T> __device__ __forceinline__ long long zp_head(const T* p, long long n) {
  const long long to_boundary = (long long)((16 - (unsigned long long)p % 16) % 16) / (long long)sizeof(T);
  return to_boundary < n ? to_boundary : n;
}

// f(i, x[i]) for every element of a row, the block's threads sharing it;
// 16-byte loads over the row's aligned middle.
template <class T, class F> __device__ __forceinline__ void zp_row_read(const T* x, long long n, F f) {
  constexpr int N = ZpLanes<T>::N;
  const long long head = zp_head(x, n), vecs = (n - head) / N;
  for (long long i = threadIdx.x; i < head; i += blockDim.x) f(i, zp_ld(x + i));
  for (long long v = threadIdx.x; v < vecs; v += blockDim.x) {
    float e[N];
    const long long at = head + v * N;
    zp_ld16(x + at, e);
    for (int k = 0; k < N; ++k) f(at + k, e[k]);
  }
  for (long long i = head + vecs * N + threadIdx.x; i < n; i += blockDim.x) f(i, zp_ld(x + i));
}

// y[i] = f(i, x[i]) for every element of a row; 16-byte accesses where both
// rows reach a boundary together, else element by element.
template <class T, class O, class F> __device__ __forceinline__ void zp_row_map(const T* x, O* y, long long n, F f) {
  if constexpr (sizeof(T) == sizeof(O)) {
    constexpr int N = ZpLanes<T>::N;
    const long long head = zp_head(x, n);
    if (head == zp_head(y, n)) {
      const long long vecs = (n - head) / N;
      for (long long i = threadIdx.x; i < head; i += blockDim.x) zp_st(y + i, f(i, zp_ld(x + i)));
      for (long long v = threadIdx.x; v < vecs; v += blockDim.x) {
        float e[N];
        const long long at = head + v * N;
        zp_ld16(x + at, e);
        for (int k = 0; k < N; ++k) e[k] = f(at + k, e[k]);
        zp_st16(y + at, e);
      }
      for (long long i = head + vecs * N + threadIdx.x; i < n; i += blockDim.x) zp_st(y + i, f(i, zp_ld(x + i)));
      return;
    }
  }
  for (long long i = threadIdx.x; i < n; i += blockDim.x) zp_st(y + i, f(i, zp_ld(x + i)));
}

// Zeros over a row, 16 bytes at a time over its aligned middle.
template <class O> __device__ __forceinline__ void zp_row_zero(O* y, long long n) {
  constexpr int N = ZpLanes<O>::N;
  const long long head = zp_head(y, n), vecs = (n - head) / N;
  for (long long i = threadIdx.x; i < head; i += blockDim.x) zp_st(y + i, 0.0f);
  for (long long v = threadIdx.x; v < vecs; v += blockDim.x) {
    *reinterpret_cast<uint4*>(y + head + v * N) = uint4{0u, 0u, 0u, 0u};
  }
  for (long long i = head + vecs * N + threadIdx.x; i < n; i += blockDim.x) zp_st(y + i, 0.0f);
}

// Whether a label counts: not ignore_index, and a class of [0, classes).
__device__ __forceinline__ bool zp_counted(long long label, long long classes, long long ignore_index) {
  return label != ignore_index && label >= 0 && label < classes;
}

// The grid-stride loop's first index and step over elements.
__device__ __forceinline__ long long zp_first() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ long long zp_step() { return (long long)gridDim.x * blockDim.x; }

// max + log Σ exp(x − max) of a row, in every thread: the maximum in f32,
// each exp in f32, their sum in double (as the host's cross-entropy).
template <class T> __device__ __forceinline__ double zp_log_sum_exp(const T* x, long long n, float* red_max, double* red_sum) {
  float m = zp_neg_inf();
  zp_row_read(x, n, [&](long long, float v) { m = fmaxf(m, v); });
  m = zp_block_max(m, red_max);
  if (m == zp_neg_inf()) return (double)m;
  double s = 0.0;
  zp_row_read(x, n, [&](long long, float v) { s += (double)expf(v - m); });
  s = zp_block_sum(s, red_sum);
  return (double)m + log(s);
}

// The unit offsets of index e of a ZpStrided space: s along `src`, t along `dst`.
__device__ __forceinline__ void zp_offsets(const ZpStrided& d, long long e, long long& s, long long& t) {
  long long rest = e;
  s = 0;
  t = 0;
  for (int k = d.rank - 1; k >= 0; --k) {
    const long long q = rest / d.size[k], i = rest - q * d.size[k];
    rest = q;
    s += i * d.src[k];
    t += i * d.dst[k];
  }
}

// A float to an integer as Rust's `as` converts it: toward zero, saturating
// at the type's range, NaN to 0 (the host routines write integers so).
__device__ __forceinline__ long long zp_sat_i64(float x) {
  if (x != x) return 0;
  if (x >= 9223372036854775807.0f) return 9223372036854775807LL;
  if (x <= -9223372036854775807.0f) return -9223372036854775807LL - 1;
  return (long long)x;
}
__device__ __forceinline__ int zp_sat_i32(float x) {
  if (x != x) return 0;
  if (x >= 2147483647.0f) return 2147483647;
  if (x <= -2147483648.0f) return -2147483647 - 1;
  return (int)x;
}
// An f32 value into an integer buffer, as the host's `write_f32` does.
__device__ __forceinline__ void zp_st(int* p, float x) { *p = zp_sat_i32(x); }
__device__ __forceinline__ void zp_st(long long* p, float x) { *p = zp_sat_i64(x); }

// Four consecutive elements, one aligned access (16 bytes of f32, 8 of a
// 16-bit type).
template <class T> struct alignas(4 * sizeof(T)) ZpVec4 { T e[4]; };
