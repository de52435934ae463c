// ── Cross-entropy: the mean over counted rows of logsumexp(row) − row[label] ─
// $NAME_rows: one block per row (blocks loop over rows) writes the row's
// loss in double to partial[row] (0 for a row that does not count).
// $NAME_mean: one block sums the counted rows' losses in a fixed order and
// writes total / count as the f32 loss (0 when no row counts). Two launches,
// no atomics: the loss is the same bits every run.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_rows(
    const zp_logits_t* __restrict__ logits, const zp_label_t* __restrict__ labels, long long rows, long long classes,
    long long ignore_index, double* __restrict__ partial)
{
  __shared__ float red_max[32];
  __shared__ double red_sum[32];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long label = (long long)labels[r];
    if (!zp_counted(label, classes, ignore_index)) {
      if (threadIdx.x == 0) partial[r] = 0.0;
      continue;
    }
    const zp_logits_t* x = logits + r * classes;
    const double lse = zp_log_sum_exp(x, classes, red_max, red_sum);
    if (threadIdx.x == 0) partial[r] = lse - (double)zp_ld(x + label);
  }
}

extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME_mean(
    const double* __restrict__ partial, const zp_label_t* __restrict__ labels, long long rows, long long classes,
    long long ignore_index, float* __restrict__ out)
{
  __shared__ double red[32];
  double total = 0.0, count = 0.0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    if (zp_counted((long long)labels[r], classes, ignore_index)) {
      total += partial[r];
      count += 1.0;
    }
  }
  total = zp_block_sum(total, red);
  count = zp_block_sum(count, red);
  if (threadIdx.x == 0) *out = count == 0.0 ? 0.0f : (float)(total / count);
}
