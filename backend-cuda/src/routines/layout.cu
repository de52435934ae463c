// ── Layout: transpose, slice, its gradient, split, concat ───────────────────
// Every one is a copy of units (zp_unit_t: an element, or up to 16 bytes of
// elements where the innermost run and the pointers allow).
// $NAME_copy: the index space of ZpStrided, row-major, one thread per unit
//   (grid-stride): consecutive threads take consecutive units of the
//   innermost axis, contiguous on both sides after the planner merged axes.
// $NAME_tiled: a transpose whose input's last axis moves: a 32×32 tile read
//   along the input's last axis into shared memory, written along the
//   output's, both coalesced; blocks loop over the batch × tiles.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_copy(
    const zp_unit_t* __restrict__ src, zp_unit_t* __restrict__ dst, ZpStrided d)
{
  for (long long e = zp_first(); e < d.count; e += zp_step()) {
    long long rest = e, s = 0, t = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
      const long long q = rest / d.size[k], i = rest - q * d.size[k];
      rest = q;
      s += i * d.src[k];
      t += i * d.dst[k];
    }
    dst[t] = src[s];
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_tiled(
    const zp_unit_t* __restrict__ src, zp_unit_t* __restrict__ dst, ZpTiled d)
{
  __shared__ zp_unit_t tile[32][33];
  const long long tiles_r = (d.rows + 31) / 32, tiles_c = (d.cols + 31) / 32, per_batch = tiles_r * tiles_c;
  const long long tiles = d.batches * per_batch;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, tys = blockDim.x / 32;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long b = t / per_batch, rc = t - b * per_batch;
    const long long r0 = rc / tiles_c * 32, c0 = rc % tiles_c * 32;
    long long rest = b, s = 0, o = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
      const long long q = rest / d.size[k], i = rest - q * d.size[k];
      rest = q;
      s += i * d.src[k];
      o += i * d.dst[k];
    }
    __syncthreads();
    for (int y = ty; y < 32; y += tys) {
      const long long r = r0 + y, c = c0 + tx;
      if (r < d.rows && c < d.cols) tile[y][tx] = src[s + r * d.src_row + c];
    }
    __syncthreads();
    for (int y = ty; y < 32; y += tys) {
      const long long c = c0 + y, r = r0 + tx;
      if (r < d.rows && c < d.cols) dst[o + c * d.dst_col + r] = tile[tx][y];
    }
  }
}
