// Just enough of CUDA to run the generated f32 kernels on the host with g++
// (tests/host_emulation.rs, tests/host_attention.rs, tests/host_adamw.rs):
// each block's threads are std::threads, a __syncthreads() is a barrier of
// the block, a __syncwarp() a barrier of the warp's 32 threads, a warp
// shuffle goes through memory and a warp barrier (so every lane of a warp
// must reach it, as CUDA's full-mask shuffles require). Blocks run
// one after another, so a function-local `static` is the block's shared
// memory. This checks the generated code's logic (indexing, sweeps,
// reductions, partial sums, dropout, tiles), not CUDA's compiler or hardware.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __constant__ static
#define __launch_bounds__(n)
#define __shared__ static

struct dim3 { unsigned x, y, z; };
static thread_local dim3 threadIdx;
static thread_local dim3 blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* zp_barrier;
static std::unique_ptr<std::barrier<>>* zp_warp_barriers;
static void __syncthreads() { zp_barrier->arrive_and_wait(); }
static void __syncwarp(unsigned = 0xffffffffu) { zp_warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }

// A shuffle writes its value, meets its warp at a barrier, reads its
// partner's. Successive shuffles alternate between two buffers, so one
// barrier each suffices: a lane can only overwrite a buffer after the next
// shuffle's barrier, which every lane reaches after reading this one.
static float zp_lanes[2][1024];
static double zp_lanes64[2][1024];
static thread_local unsigned zp_shuffles;
static float __shfl_xor_sync(unsigned, float x, int o) {
  float* lanes = zp_lanes[zp_shuffles++ % 2];
  lanes[threadIdx.x] = x;
  __syncwarp();
  return lanes[threadIdx.x ^ o];
}
static double __shfl_xor_sync(unsigned, double x, int o) {
  double* lanes = zp_lanes64[zp_shuffles++ % 2];
  lanes[threadIdx.x] = x;
  __syncwarp();
  return lanes[threadIdx.x ^ o];
}
// CUDA declares isfinite for device code in the global namespace.
using std::isfinite;
// A rounded product that no multiply-add absorbs (g++ emits no FMA for x86-64).
static float __fmul_rn(float a, float b) { return a * b; }
static int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
static float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static float __int_as_float(unsigned bits) { float f; std::memcpy(&f, &bits, 4); return f; }
static double __longlong_as_double(long long bits) { double d; std::memcpy(&d, &bits, 8); return d; }
static unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static float normcdff(float x) { return 0.5f * std::erfc(-x * 0.70710678118654752f); }
static double normcdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752); }

// bf16 and f16 storage, for kernels that include cuda_bf16.h/cuda_fp16.h
// (the harness drops those includes): the value
// bits in a struct, conversions rounding to nearest even as CUDA's `_rn`
// intrinsics do. f16 goes through GCC's _Float16; bf16 (no GCC 12 type)
// keeps a float's top 16 bits, rounded. A double is rounded once: the
// float-rounded candidate or its neighbour, whichever is nearer (ties to even).
struct __nv_bfloat16 { unsigned short x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct __half { unsigned short x; };
struct __half2 { __half x, y; };
static float __bfloat162float(__nv_bfloat16 h) { unsigned u = (unsigned)h.x << 16; float f; std::memcpy(&f, &u, 4); return f; }
static __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  if (f != f) return {(unsigned short)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(unsigned short)(u >> 16)};
}
static float __half2float(__half h) { _Float16 v; std::memcpy(&v, &h.x, 2); return (float)v; }
static __half __float2half_rn(float f) { _Float16 v = (_Float16)f; __half h; std::memcpy(&h.x, &v, 2); return h; }
static __half __double2half(double d) { _Float16 v = (_Float16)d; __half h; std::memcpy(&h.x, &v, 2); return h; }
static __nv_bfloat16 __double2bfloat16(double d) {
  const __nv_bfloat16 c = __float2bfloat16_rn((float)d);
  if (d != d || std::isinf(d)) return c;
  __nv_bfloat16 best = c;
  for (int step : {-1, 1}) {
    const unsigned short bits = (unsigned short)(c.x + step);
    const double y = __bfloat162float({bits}), b = __bfloat162float(best);
    const double ey = std::fabs(y - d), eb = std::fabs(b - d);
    if (y == y && (ey < eb || (ey == eb && (bits & 1) == 0))) best = {bits};
  }
  return best;
}
static float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
static __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
static float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
static __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }

static char* zp_alloc(size_t bytes) {
  char* p = (char*)std::aligned_alloc(64, (bytes + 64) / 64 * 64);
  std::memset(p, 0xFF, (bytes + 64) / 64 * 64);
  return p;
}
static char* zp_read(const std::string& path, size_t bytes) {
  char* p = zp_alloc(bytes);
  std::ifstream(path, std::ios::binary).read(p, (std::streamsize)bytes);
  return p;
}
static void zp_write(const std::string& path, const char* p, size_t bytes) {
  std::ofstream(path, std::ios::binary).write(p, (std::streamsize)bytes);
}
// A grid of grid_x × grid_y blocks, one after another, of `block` threads
// (a whole number of warps, or one partial warp).
template <class F> static void zp_launch2(unsigned grid_x, unsigned grid_y, unsigned block, F kernel) {
  gridDim = {grid_x, grid_y, 1};
  blockDim = {block, 1, 1};
  const unsigned warps = (block + 31) / 32;
  for (unsigned by = 0; by < grid_y; ++by) {
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      std::barrier<> barrier((std::ptrdiff_t)block);
      zp_barrier = &barrier;
      std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
      for (unsigned w = 0; w < warps; ++w) {
        const unsigned lanes = block - 32 * w < 32 ? block - 32 * w : 32;
        warp_barriers.push_back(std::make_unique<std::barrier<>>((std::ptrdiff_t)lanes));
      }
      zp_warp_barriers = warp_barriers.data();
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < block; ++t) {
        threads.emplace_back([&, t, bx, by] { threadIdx = {t, 0, 0}; blockIdx = {bx, by, 0}; kernel(); });
      }
      for (auto& thread : threads) thread.join();
    }
  }
}
template <class F> static void zp_launch(unsigned grid, unsigned block, F kernel) { zp_launch2(grid, 1, block, kernel); }
