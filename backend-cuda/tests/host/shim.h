// Just enough of CUDA to run the generated f32 kernels on the host with g++
// (tests/host_emulation.rs, tests/host_attention.rs, tests/host_adamw.rs,
// tests/host_mma.rs):
// each block's threads are std::threads, a __syncthreads() is a barrier of
// the block, a __syncwarp() a barrier of the warp's 32 threads, a warp
// shuffle goes through memory and a warp barrier (so every lane of a warp
// must reach it, as CUDA's full-mask shuffles require). Blocks run
// one after another, so a function-local `static` is the block's shared
// memory. This checks the generated code's logic (indexing, sweeps,
// reductions, partial sums, dropout, tiles), not CUDA's compiler or hardware.
// The tensor-core instructions the attention kernels use (mma.sync
// m16n8k16, ldmatrix .x4) are emulated lane by lane at the end of this file,
// from the PTX ISA's fragment layouts.
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
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

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
static unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static unsigned short __half_as_ushort(__half h) { return h.x; }
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

// ── Tensor-core instructions, lane by lane ──────────────────────────────────
// What the attention kernels' `#ifdef __CUDA_ARCH__` helpers run as inline
// PTX, emulated from the PTX ISA (version 9.0): "Matrix Fragments for
// mma.m16n8k16 with floating point type" (§9.7.14.5.8) and "Warp-level matrix
// load instruction: ldmatrix" (§9.7.14.5.15). Both are warp-collective: a
// lane publishes its operands, meets its warp at a barrier, then computes
// its own registers from every lane's operands exactly as the ISA distributes
// them (so a kernel that hands a lane the wrong address or reads the wrong
// register gets wrong numbers). Two buffers alternate, as for shuffles.
static const void* zp_ldmatrix_lanes[2][1024];
static thread_local unsigned zp_ldmatrices;

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: lanes 8m..8m+7 give the
// addresses of rows 0..7 of matrix m (16 bytes each, 16-byte aligned);
// register m of lane t gets row t/4, columns 2(t%4) and 2(t%4)+1 (low half
// first) of matrix m, or of its transpose with .trans.
static void zp_ldmatrix_x4_lanes(unsigned (&r)[4], const void* row, bool trans) {
  if ((std::uintptr_t)row % 16 != 0) std::abort();
  const void** lanes = zp_ldmatrix_lanes[zp_ldmatrices++ % 2];
  lanes[threadIdx.x] = row;
  __syncwarp();
  const unsigned warp0 = threadIdx.x / 32 * 32, lane = threadIdx.x % 32;
  for (int m = 0; m < 4; ++m) {
    unsigned short e[2];
    for (int h = 0; h < 2; ++h) {
      const unsigned i = lane / 4, j = 2 * (lane % 4) + h;  // row, column of the loaded matrix
      const unsigned stored_row = trans ? j : i, stored_col = trans ? i : j;
      e[h] = static_cast<const unsigned short*>(lanes[warp0 + 8 * m + stored_row])[stored_col];
    }
    r[m] = (unsigned)e[0] | ((unsigned)e[1] << 16);
  }
}
static void zp_ldmatrix_x4(unsigned (&r)[4], const void* row) { zp_ldmatrix_x4_lanes(r, row, false); }
static void zp_ldmatrix_x4_trans(unsigned (&r)[4], const void* row) { zp_ldmatrix_x4_lanes(r, row, true); }

struct zp_mma_operands { unsigned a[4], b[2]; };
static zp_mma_operands zp_mma_lanes[2][1024];
static thread_local unsigned zp_mmas;
static float zp_bf16_bits(unsigned short x) { return __bfloat162float({x}); }
static float zp_f16_bits(unsigned short x) { return __half2float({x}); }

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: D = A·B + C,
// A 16×16 and B 16×8 of 16-bit values, C = D 16×8 f32, held per lane as the
// ISA's formulas give (groupID = lane >> 2, threadID_in_group = lane % 4):
//   a_i (register i/2, low half for even i): row groupID (+8 for i = 2, 3, 6, 7),
//     column 2·threadID_in_group + (i & 1) (+8 for i ≥ 4);
//   b_i (register i/2): row 2·threadID_in_group + (i & 1) (+8 for i ≥ 2), column groupID;
//   c_i: row groupID (+8 for i ≥ 2), column 2·threadID_in_group + (i & 1).
// The products are exact and summed in double, then rounded once: the
// hardware's order and rounding of the sum are not modelled.
template <float (*decode)(unsigned short)>
static void zp_mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  zp_mma_operands* lanes = zp_mma_lanes[zp_mmas++ % 2];
  lanes[threadIdx.x] = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
  __syncwarp();
  const unsigned warp0 = threadIdx.x / 32 * 32;
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane >> 2, thread_in_group = lane % 4;
    const zp_mma_operands& o = lanes[warp0 + lane];
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (4 <= i && i < 6)) ? group : group + 8;
      const int col = thread_in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = decode((unsigned short)(o.a[i / 2] >> (16 * (i % 2))));
    }
    for (int i = 0; i < 4; ++i) {
      const int row = thread_in_group * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      B[row][group] = decode((unsigned short)(o.b[i / 2] >> (16 * (i % 2))));
    }
  }
  const int lane = threadIdx.x % 32, group = lane >> 2, thread_in_group = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? group : group + 8, col = thread_in_group * 2 + (i & 1);
    double sum = d[i];
    for (int k = 0; k < 16; ++k) sum += (double)A[row][k] * B[k][col];
    d[i] = (float)sum;
  }
}
static void zp_mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  zp_mma_m16n8k16<zp_bf16_bits>(d, a, b0, b1);
}
static void zp_mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  zp_mma_m16n8k16<zp_f16_bits>(d, a, b0, b1);
}
