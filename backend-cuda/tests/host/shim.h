// Just enough of CUDA to run the generated f32 kernels on the host with g++
// (tests/host_emulation.rs): each block's threads are std::threads, a
// __syncthreads() is a std::barrier, a warp shuffle goes through memory
// between two barriers (every call site in generated code is block-uniform).
// Blocks run one after another, so a function-local `static` is the block's
// shared memory. This checks the generated code's logic (indexing, sweeps,
// reductions, partial sums, dropout), not CUDA's compiler or hardware.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
static void __syncthreads() { zp_barrier->arrive_and_wait(); }

static float zp_lanes[1024];
static double zp_lanes64[1024];
static float __shfl_xor_sync(unsigned, float x, int o) {
  zp_lanes[threadIdx.x] = x;
  __syncthreads();
  const float y = zp_lanes[threadIdx.x ^ o];
  __syncthreads();
  return y;
}
static double __shfl_xor_sync(unsigned, double x, int o) {
  zp_lanes64[threadIdx.x] = x;
  __syncthreads();
  const double y = zp_lanes64[threadIdx.x ^ o];
  __syncthreads();
  return y;
}

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
template <class F> static void zp_launch(unsigned grid, unsigned block, F kernel) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> barrier((std::ptrdiff_t)block);
    zp_barrier = &barrier;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([&, t, b] { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; kernel(); });
    }
    for (auto& thread : threads) thread.join();
  }
}
