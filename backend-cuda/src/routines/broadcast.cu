// ── Broadcast: out = a ∘ b (add, sub, mul) over NumPy-broadcast shapes ──────
// The index space (ZpStrided) runs over the output, row-major and
// contiguous; `src` holds a's strides and `dst` b's, 0 along an axis the
// operand repeats. Each result is the op in double on the operands' f32
// values, rounded once to f32, then to the output's dtype, as the host
// routine computes it. The output may be a itself (an in-place update of
// the same shape): each element is read before it is written, by the same
// thread, so no pointer is __restrict__.
// $NAME: one element per thread (grid-stride).
// $NAME_vec4: four consecutive outputs per thread, the innermost axis's
//   strides scaled by 4; an operand with a stride there is read in one
//   aligned access, one with none is read once for all four.
__device__ __forceinline__ float zp_arith(long long op, float x, float y) {
  const double u = (double)x, v = (double)y;
  return (float)(op == 0 ? u + v : op == 1 ? u - v : u * v);
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    const zp_a_t* a, const zp_b_t* b, zp_out_t* out, ZpStrided d, long long op)
{
  for (long long e = zp_first(); e < d.count; e += zp_step()) {
    long long i, j;
    zp_offsets(d, e, i, j);
    zp_st(out + e, zp_arith(op, zp_ld(a + i), zp_ld(b + j)));
  }
}

template <class T> __device__ __forceinline__ void zp_ld4_or_one(const T* p, bool vector, float* v) {
  if (vector) {
    const ZpVec4<T> q = *reinterpret_cast<const ZpVec4<T>*>(p);
    for (int k = 0; k < 4; ++k) v[k] = zp_ld(&q.e[k]);
  } else {
    const float x = zp_ld(p);
    for (int k = 0; k < 4; ++k) v[k] = x;
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_vec4(
    const zp_a_t* a, const zp_b_t* b, zp_out_t* out, ZpStrided d, long long op)
{
  const bool a_runs = d.src[d.rank - 1] != 0, b_runs = d.dst[d.rank - 1] != 0;
  for (long long e = zp_first(); e < d.count; e += zp_step()) {
    long long i, j;
    zp_offsets(d, e, i, j);
    float x[4], y[4];
    zp_ld4_or_one(a + i, a_runs, x);
    zp_ld4_or_one(b + j, b_runs, y);
    ZpVec4<zp_out_t> r;
    for (int k = 0; k < 4; ++k) zp_st(&r.e[k], zp_arith(op, x[k], y[k]));
    *reinterpret_cast<ZpVec4<zp_out_t>*>(out + 4 * e) = r;
  }
}
