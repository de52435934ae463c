//! A matmul's shapes once the program's dimensions are bound: the GEMM
//! every device runs for `matmul {transpose_a, transpose_b}`, with NumPy
//! broadcasting over the leading axes resolved into per-batch operand
//! indices.

/// A matmul's shapes, resolved when the program is loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulShape {
    /// Rows of each product (and of `A` as multiplied).
    pub m: usize,
    /// Columns of each product (and of `B` as multiplied).
    pub n: usize,
    /// The summed dimension: columns of `A` and rows of `B` as multiplied.
    pub k: usize,
    /// Whether `A` is stored transposed, `[k, m]` rather than `[m, k]`.
    pub transpose_a: bool,
    /// Whether `B` is stored transposed, `[n, k]` rather than `[k, n]`.
    pub transpose_b: bool,
    /// Per output batch index (row-major over the output's leading axes):
    /// the index of the A and B matrices it reads.
    pub batches: Vec<(usize, usize)>,
}

impl MatMulShape {
    /// From the operand shapes `a`, `b` (rank ≥ 2) and the flags; `None`
    /// when they do not multiply.
    pub fn new(a: &[usize], b: &[usize], transpose_a: bool, transpose_b: bool) -> Option<MatMulShape> {
        if a.len() < 2 || b.len() < 2 {
            return None;
        }
        let (ra, rb) = (a.len(), b.len());
        let (m, ka) = if transpose_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
        let (kb, n) = if transpose_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
        if ka != kb {
            return None;
        }
        let (la, lb) = (&a[..ra - 2], &b[..rb - 2]);
        let rank = la.len().max(lb.len());
        let pad =
            |l: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, rank - l.len()).chain(l.iter().copied()).collect() };
        let (pa, pb) = (pad(la), pad(lb));
        let mut out = Vec::with_capacity(rank);
        for (x, y) in pa.iter().zip(&pb) {
            out.push(match (x, y) {
                (x, y) if x == y => *x,
                (1, y) => *y,
                (x, 1) => *x,
                _ => return None,
            });
        }
        let count: usize = out.iter().product();
        let mut batches = Vec::with_capacity(count);
        for flat in 0..count {
            let (mut ia, mut ib, mut rest) = (0, 0, flat);
            let (mut sa, mut sb) = (1, 1);
            for d in (0..rank).rev() {
                let i = rest % out[d];
                rest /= out[d];
                ia += if pa[d] == 1 { 0 } else { i * sa };
                ib += if pb[d] == 1 { 0 } else { i * sb };
                sa *= pa[d];
                sb *= pb[d];
            }
            batches.push((ia, ib));
        }
        let shape = MatMulShape { m, n, k: ka, transpose_a, transpose_b, batches };
        Some(shape.folded())
    }

    /// A batch of products that all read one B matrix, each from the next A
    /// block (`x·Wᵀ` over a `[batch, seq, width]` activation), is one tall
    /// product: the A blocks and the C blocks lie back to back as its rows.
    /// One big GEMM keeps every thread on one well-shaped problem instead of
    /// many small ones.
    fn folded(self) -> MatMulShape {
        let shared_b = self.batches.iter().all(|&(_, ib)| ib == self.batches[0].1);
        let stacked_a = self.batches.iter().enumerate().all(|(i, &(ia, _))| ia == i);
        if self.batches.len() > 1 && !self.transpose_a && shared_b && stacked_a {
            let ib = self.batches[0].1;
            MatMulShape { m: self.m * self.batches.len(), batches: vec![(0, ib)], ..self }
        } else {
            self
        }
    }

    /// Floating-point operations of the whole batch: `2·m·n·k` per product.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batches.len()) as f64
    }
}
