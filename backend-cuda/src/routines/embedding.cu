// ── Embedding: out[i] = table[ids[i]], a row gather ─────────────────────────
// Table and output share a dtype, so a row is copied as units (zp_unit_t,
// up to 16 bytes: what the row's width and the pointers' alignment allow);
// one thread per unit of the output, grid-stride. An id of −1 (a row
// another tensor rank holds) gives zeros; so does an id past the table,
// which the host routine refuses.
extern "C" __global__ void __launch_bounds__(ZP_ROUTINE_THREADS) $NAME(
    const zp_unit_t* __restrict__ table, const zp_id_t* __restrict__ ids, long long n, long long rows, long long width,
    zp_unit_t* __restrict__ out)
{
  const long long total = n * width;
  for (long long e = zp_first(); e < total; e += zp_step()) {
    const long long i = e / width, c = e - i * width;
    const long long id = (long long)ids[i];
    out[e] = id >= 0 && id < rows ? table[id * width + c] : zp_unit_t{};
  }
}
