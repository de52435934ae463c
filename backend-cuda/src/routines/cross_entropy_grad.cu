// ── Cross-entropy's gradient: dloss·(softmax(row) − onehot(label))/count ───
// $NAME_count: one block counts the rows that count into *count (double).
// $NAME_rows: one block per row (blocks loop over rows): a counted row's
// log-sum-exp, then every element exp(x − lse)·scale in f32, scale less at
// the label, with scale = dloss/count; other rows are zeros.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_count(
    const zp_label_t* __restrict__ labels, long long rows, long long classes, long long ignore_index,
    double* __restrict__ count)
{
  __shared__ double red[32];
  double n = 0.0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    if (zp_counted((long long)labels[r], classes, ignore_index)) n += 1.0;
  }
  n = zp_block_sum(n, red);
  if (threadIdx.x == 0) *count = n;
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_rows(
    const zp_logits_t* __restrict__ logits, const zp_label_t* __restrict__ labels,
    const zp_dloss_t* __restrict__ dloss, const double* __restrict__ count, long long rows, long long classes,
    long long ignore_index, zp_out_t* __restrict__ out)
{
  __shared__ float red_max[32];
  __shared__ double red_sum[32];
  const float scale = (float)((double)zp_ld(dloss) / *count);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long label = (long long)labels[r];
    zp_out_t* y = out + r * classes;
    if (!zp_counted(label, classes, ignore_index)) {
      zp_row_zero(y, classes);
      continue;
    }
    const zp_logits_t* x = logits + r * classes;
    const double lse = zp_log_sum_exp(x, classes, red_max, red_sum);
    zp_row_map(x, y, classes, [&](long long i, float v) {
      const float g = expf((float)((double)v - lse)) * scale;
      return i == label ? g - scale : g;
    });
  }
}
