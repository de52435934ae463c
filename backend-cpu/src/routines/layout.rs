//! Layout ops on raw elements of any dtype (`elem` bytes each): transpose,
//! and the ops that cut or join along one axis (slice, its gradient, split,
//! concat). A tensor is seen as `[outer, axis, inner]` around the axis.

use rayon::prelude::*;

/// `[outer, axis, inner]` of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// Output axis `d` takes input axis `perm[d]`. Runs along an unmoved last
/// axis are copied whole. Blocks of the output are filled on rayon's threads:
/// a transpose is a strided read of the whole tensor, so it is bound by
/// memory latency, not by one core's copy rate.
pub fn transpose(x: &[u8], shape: &[usize], perm: &[usize], elem: usize, out: &mut [u8]) {
    let rank = shape.len();
    if rank == 0 || x.is_empty() {
        out.copy_from_slice(x);
        return;
    }
    let mut in_strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        in_strides[d] = in_strides[d + 1] * shape[d + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    // Copy runs of the output's last axis when it is contiguous in the input.
    let run = if perm[rank - 1] == rank - 1 { out_shape[rank - 1] } else { 1 };
    let outer_rank = if run > 1 { rank - 1 } else { rank };
    let (out_shape, strides) = (&out_shape[..outer_rank], &strides[..outer_rank]);
    let run_bytes = run * elem;
    // About 64 KiB of output per task: enough to amortise the task, small
    // enough to spread a layer's activations over the threads.
    let runs_per_block = (65536 / run_bytes).max(1);
    out.par_chunks_mut(runs_per_block * run_bytes).enumerate().for_each(|(block, chunk)| {
        // The multi-index of this block's first run, then counted up.
        let mut index = vec![0usize; outer_rank];
        let mut rest = block * runs_per_block;
        for d in (0..outer_rank).rev() {
            index[d] = rest % out_shape[d];
            rest /= out_shape[d];
        }
        for dst in chunk.chunks_exact_mut(run_bytes) {
            let at: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
            dst.copy_from_slice(&x[at * elem..at * elem + run_bytes]);
            for d in (0..outer_rank).rev() {
                index[d] += 1;
                if index[d] < out_shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    });
}

/// `[start, start+len)` of `axis`.
pub fn slice(x: &[u8], shape: &[usize], axis: usize, start: usize, len: usize, elem: usize, out: &mut [u8]) {
    let (outer, n, inner) = around(shape, axis);
    let (row, keep) = (n * inner * elem, len * inner * elem);
    for o in 0..outer {
        let from = o * row + start * inner * elem;
        out[o * keep..(o + 1) * keep].copy_from_slice(&x[from..from + keep]);
    }
}

/// `dy` placed at `[start, start+len)` of `axis` (of `axis_len`) in zeros.
pub fn slice_grad(dy: &[u8], shape: &[usize], axis: usize, start: usize, axis_len: usize, elem: usize, out: &mut [u8]) {
    out.fill(0);
    let (outer, len, inner) = around(shape, axis);
    let (row, keep) = (axis_len * inner * elem, len * inner * elem);
    for o in 0..outer {
        let to = o * row + start * inner * elem;
        out[to..to + keep].copy_from_slice(&dy[o * keep..(o + 1) * keep]);
    }
}

/// Joins `parts` (each `shapes[i]`) along `axis`, in order.
pub fn concat(parts: &[&[u8]], shapes: &[Vec<usize>], axis: usize, elem: usize, out: &mut [u8]) {
    let outer: usize = shapes[0][..axis].iter().product();
    let mut at = 0;
    for o in 0..outer {
        for (p, s) in parts.iter().zip(shapes) {
            let (_, n, inner) = around(s, axis);
            let run = n * inner * elem;
            out[at..at + run].copy_from_slice(&p[o * run..(o + 1) * run]);
            at += run;
        }
    }
}

/// Cuts `x` along `axis` into `outs` (of `sizes` along it), in order.
pub fn split(x: &[u8], shape: &[usize], axis: usize, sizes: &[usize], elem: usize, outs: &mut [&mut [u8]]) {
    let (outer, _, inner) = around(shape, axis);
    let mut at = 0;
    for o in 0..outer {
        for (out, &n) in outs.iter_mut().zip(sizes) {
            let run = n * inner * elem;
            out[o * run..(o + 1) * run].copy_from_slice(&x[at..at + run]);
            at += run;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn words(b: &[u8]) -> Vec<u32> {
        b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    /// Many blocks, and a block boundary inside a run of the outer axes:
    /// every permutation of a `[3, 5, 7, 11]` tensor against index arithmetic.
    #[test]
    fn transposes_in_blocks_as_by_index() {
        let shape = [3usize, 5, 7, 11];
        let x: Vec<u32> = (0..shape.iter().product::<usize>() as u32).collect();
        let bytes_x = bytes(&x);
        for perm in [[0, 2, 1, 3], [3, 2, 1, 0], [1, 0, 3, 2], [0, 1, 2, 3], [2, 0, 1, 3]] {
            let mut out = vec![0; bytes_x.len()];
            transpose(&bytes_x, &shape, &perm, 4, &mut out);
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let mut want = Vec::new();
            for a in 0..out_shape[0] {
                for b in 0..out_shape[1] {
                    for c in 0..out_shape[2] {
                        for d in 0..out_shape[3] {
                            let mut i = [0; 4];
                            for (o, v) in [a, b, c, d].into_iter().enumerate() {
                                i[perm[o]] = v;
                            }
                            want.push(x[((i[0] * 5 + i[1]) * 7 + i[2]) * 11 + i[3]]);
                        }
                    }
                }
            }
            assert_eq!(words(&out), want, "perm {perm:?}");
        }
        // 8-byte elements with 65,536-byte blocks cut mid-axis.
        let shape = [2usize, 4099, 3];
        let x: Vec<u32> = (0..2 * 2 * 4099 * 3).collect();
        let mut out = vec![0; x.len() * 4];
        transpose(&bytes(&x), &shape, &[1, 0, 2], 8, &mut out);
        let got: Vec<u32> = words(&out);
        for j in 0..4099 {
            for i in 0..2 {
                for k in 0..3 {
                    let o = ((j * 2 + i) * 3 + k) * 2;
                    let at = ((i * 4099 + j) * 3 + k) * 2;
                    assert_eq!(&got[o..o + 2], &x[at..at + 2]);
                }
            }
        }
    }

    #[test]
    fn transposes_by_hand() {
        // [2, 3] → [3, 2]
        let x = bytes(&[0, 1, 2, 3, 4, 5]);
        let mut out = vec![0; x.len()];
        transpose(&x, &[2, 3], &[1, 0], 4, &mut out);
        assert_eq!(words(&out), [0, 3, 1, 4, 2, 5]);
        // [2, 2, 2] with the last axis unmoved: [1, 0, 2]
        let x = bytes(&[0, 1, 2, 3, 4, 5, 6, 7]);
        let mut out = vec![0; x.len()];
        transpose(&x, &[2, 2, 2], &[1, 0, 2], 4, &mut out);
        assert_eq!(words(&out), [0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn slice_split_concat_and_slice_grad_agree() {
        let x = bytes(&[0, 1, 2, 3, 4, 5]); // [2, 3]
        let mut s = vec![0; 8];
        slice(&x, &[2, 3], 1, 1, 1, 4, &mut s);
        assert_eq!(words(&s), [1, 4]);
        let mut g = vec![0; 24];
        slice_grad(&s, &[2, 1], 1, 1, 3, 4, &mut g);
        assert_eq!(words(&g), [0, 1, 0, 0, 4, 0]);
        let (mut a, mut b) = (vec![0; 8], vec![0; 16]);
        split(&x, &[2, 3], 1, &[1, 2], 4, &mut [&mut a, &mut b]);
        assert_eq!((words(&a), words(&b)), (vec![0, 3], vec![1, 2, 4, 5]));
        let mut joined = vec![0; 24];
        concat(&[&a, &b], &[vec![2, 1], vec![2, 2]], 1, 4, &mut joined);
        assert_eq!(joined, x);
    }
}
