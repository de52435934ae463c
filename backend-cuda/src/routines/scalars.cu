// ── The optimizer's scalars: learning rate, gradient scale, loss scale ──────
// One thread each, so they need no host round trip. Every buffer comes with
// its dtype's code (0 f32, 1 bf16, 2 f16, 3 i32, 4 i64: `routines::plan::
// dtype_code`); a scalar is read as f32, the arithmetic is the host's
// (`zeroplan_ir::interp::{lr_schedule, grad_scale, loss_scale_update}`) in
// double, and each result is rounded to f32, then to its buffer's dtype.
// Every operand is read before any result is written: outputs may be
// operands (the loss scale and its count update in place).
__device__ __forceinline__ double zp_scalar(const void* p, long long dtype) {
  switch (dtype) {
    case 0: return (double)*(const float*)p;
    case 1: return (double)zp_ld((const __nv_bfloat16*)p);
    case 2: return (double)zp_ld((const __half*)p);
    case 3: return (double)zp_ld((const int*)p);
    default: return (double)zp_ld((const long long*)p);
  }
}

__device__ __forceinline__ void zp_set_scalar(void* p, long long dtype, double v) {
  const float x = (float)v;
  switch (dtype) {
    case 0: *(float*)p = x; break;
    case 1: zp_st((__nv_bfloat16*)p, x); break;
    case 2: zp_st((__half*)p, x); break;
    case 3: zp_st((int*)p, x); break;
    default: zp_st((long long*)p, x); break;
  }
}

// Linear warm-up over `warmup` steps, then linear decay to 0 at `total`
// (when has_total), else constant.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_lr_schedule(
    const void* step, long long step_t, double peak, unsigned long long warmup, long long has_total,
    unsigned long long total, void* out, long long out_t)
{
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double s = zp_scalar(step, step_t), w = (double)warmup;
  double lr;
  if (warmup > 0 && s < w) {
    lr = peak * s / w;
  } else if (has_total) {
    const double t = (double)total;
    lr = peak * fmax((t - s) / fmax(t - w, 1.0), 0.0);
  } else {
    lr = peak;
  }
  zp_set_scalar(out, out_t, lr);
}

// The multiplier turning summed, loss-scaled gradients into their clipped
// mean (clipped to max_norm when has_max), and 1 when their norm is finite;
// (0, 0) when it is not.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_grad_scale(
    const void* sq, long long sq_t, const void* scale, long long scale_t, long long has_max, double max_norm,
    unsigned long long micro_batches, void* multiplier, long long multiplier_t, void* finite, long long finite_t)
{
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double q = zp_scalar(sq, sq_t), loss_scale = zp_scalar(scale, scale_t);
  double m = 0.0, f = 0.0;
  if (isfinite(q)) {
    const double divisor = loss_scale * (double)micro_batches;
    const double norm = sqrt(q) / divisor;
    const double clip = has_max ? fmin(max_norm / (norm + 1e-6), 1.0) : 1.0;
    m = clip / divisor;
    f = 1.0;
  }
  zp_set_scalar(multiplier, multiplier_t, m);
  zp_set_scalar(finite, finite_t, f);
}

// Dynamic loss scaling: backs off on a non-finite step, grows after
// `interval` finite steps in a row.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_loss_scale_update(
    const void* scale, long long scale_t, const void* good, long long good_t, const void* finite, long long finite_t,
    unsigned long long interval, double growth, double backoff, void* new_scale, long long new_scale_t, void* new_good,
    long long new_good_t)
{
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double s = zp_scalar(scale, scale_t), g = zp_scalar(good, good_t), f = zp_scalar(finite, finite_t);
  double s1, g1;
  if (f == 0.0) {
    s1 = s * backoff;
    g1 = 0.0;
  } else if (g + 1.0 >= (double)interval) {
    s1 = s * growth;
    g1 = 0.0;
  } else {
    s1 = s;
    g1 = g + 1.0;
  }
  zp_set_scalar(new_scale, new_scale_t, s1);
  zp_set_scalar(new_good, new_good_t, g1);
}
