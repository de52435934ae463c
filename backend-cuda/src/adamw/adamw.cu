// ── Multi-tensor AdamW: one launch steps every parameter ────────────────────
// The table lists the tensors; each is cut into chunks of ZP_CHUNK elements
// numbered across the table (first_chunk: the chunks before it). Block b
// takes chunks b, b + gridDim.x, …; a chunk finds its tensor by binary
// search on first_chunk; consecutive threads take consecutive elements.
// Per element, in PyTorch's order (and the IR's `adamw`): g = grad·multiplier,
// p ← p·(1 − lr·wd) − lr·(m/bc1)/(√(v/bc2) + eps) with m ← β1·m + (1−β1)·g,
// v ← β2·v + (1−β2)·g², bc = 1 − βᵗ, arithmetic in float, the launch-uniform
// values (bc1, bc2, 1 − lr·wd, 1 − β) in double and rounded once, as the
// generated AdamW kernels compute them. In place: param, m and v are read
// and written by the same thread. With a working copy, its 16-bit value of
// the new parameter is stored too (the mixed-precision cast, fused).
// finite == 0 (an overflowed step) leaves everything as it was.
constexpr int ZP_ADAM_THREADS = 256;
constexpr long long ZP_CHUNK = 4096;

// One tensor of the table: 64 bytes, every field 8 bytes, as
// `zeroplan_backend_cuda::adamw::AdamWTable` writes it (little-endian).
struct ZpAdamTensor {
  unsigned long long param;    // float*: the f32 (master) parameter
  unsigned long long grad;     // const zp_grad_t*
  unsigned long long m;        // float*
  unsigned long long v;        // float*
  unsigned long long working;  // zp_working_t*: its 16-bit copy, or 0
  long long len;               // elements
  long long first_chunk;       // chunks of the tensors before it
  double weight_decay;
};
static_assert(sizeof(ZpAdamTensor) == 64, "the table's layout");

extern "C" __global__ void __launch_bounds__(ZP_ADAM_THREADS) $ENTRY(
    const ZpAdamTensor* __restrict__ table, int tensors, long long chunks, const float* __restrict__ lr_p,
    const float* __restrict__ step_p, const float* __restrict__ multiplier_p, const float* __restrict__ finite_p,
    double beta1, double beta2, double eps)
{
  if ((double)*finite_p == 0.0) return;
  const double lr = (double)*lr_p, t = (double)*step_p;
  const float lr_f = (float)lr, multiplier = (float)(double)*multiplier_p;
  const float b1 = (float)beta1, b2 = (float)beta2;
  const float one_minus_b1 = (float)(1.0 - beta1), one_minus_b2 = (float)(1.0 - beta2);
  const float bc1 = (float)(1.0 - zp_pow(beta1, t)), bc2 = (float)(1.0 - zp_pow(beta2, t));
  const float eps_f = (float)eps;
  for (long long chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    int lo = 0, hi = tensors - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table[mid].first_chunk <= chunk) lo = mid; else hi = mid - 1;
    }
    const ZpAdamTensor x = table[lo];
    const long long start = (chunk - x.first_chunk) * ZP_CHUNK;
    const long long end = start + ZP_CHUNK < x.len ? start + ZP_CHUNK : x.len;
    const float decay = (float)(1.0 - lr * x.weight_decay);
    float* p = (float*)x.param;
    const zp_grad_t* grad = (const zp_grad_t*)x.grad;
    float* m = (float*)x.m;
    float* v = (float*)x.v;
    for (long long e = start + threadIdx.x; e < end; e += ZP_ADAM_THREADS) {
      const float g = zp_ld(grad + e) * multiplier;
      const float decayed = p[e] * decay;
      const float m1 = b1 * m[e] + one_minus_b1 * g;
      const float v1 = b2 * v[e] + one_minus_b2 * g * g;
      const float p1 = decayed - lr_f * (m1 / bc1) / (zp_sqrt(v1 / bc2) + eps_f);
      p[e] = p1;
      m[e] = m1;
      v[e] = v1;
      if (ZP_WORKING) zp_st((zp_working_t*)x.working + e, p1);
    }
  }
}
