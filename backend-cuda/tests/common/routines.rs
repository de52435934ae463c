//! The routine kernels' test cases, shared by the host emulation
//! (`tests/host_routines.rs`) and the GPU (`tests/gpu.rs`): instructions on
//! arenas of random operands (never zero) with poisoned outputs, the host
//! routine's answer, and the comparison.

use zeroplan_backend_cpu::device::{Arena, Memory, exec as host};
use zeroplan_exec::{Access, Buf, CommError, Communicator, Ctx, Instr};
use zeroplan_ir::{DType, Place};

use super::from_bytes;
use zeroplan_backend_cuda::routines::plan::supported;

/// The one rank of a group: the routines under test never communicate.
pub struct Alone;

impl Communicator for Alone {
    fn rank(&self) -> usize {
        0
    }
    fn ranks(&self) -> usize {
        1
    }
    fn all_reduce(&self, _: &mut [f32]) -> Result<(), CommError> {
        Ok(())
    }
    fn reduce_scatter(&self, data: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        out.copy_from_slice(data);
        Ok(())
    }
    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        out.copy_from_slice(part);
        Ok(())
    }
    fn broadcast(&self, _: &mut [f32], _: usize) -> Result<(), CommError> {
        Ok(())
    }
    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
    fn abort(&self) {}
}

/// How a case's outputs are compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Check {
    /// Byte for byte.
    Exact,
    /// Within this much of the output's largest magnitude.
    Within(f64),
}

/// A tiny xorshift: the same operands every run.
pub struct Random(pub u64);

impl Random {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// ±[0.1, 2.1) times `scale`: never zero.
    pub fn value(&mut self, scale: f64) -> f64 {
        let sign = if self.next() & 1 == 0 { 1.0 } else { -1.0 };
        sign * (0.1 + 2.0 * self.unit()) * scale
    }
}

pub fn storage(dtype: DType, values: &[f64]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&x| match dtype {
            DType::F32 => (x as f32).to_le_bytes().to_vec(),
            DType::BF16 => zeroplan_ir::to_bf16(x).to_le_bytes().to_vec(),
            DType::F16 => zeroplan_ir::to_f16(x).to_le_bytes().to_vec(),
            DType::I32 => (x as i32).to_le_bytes().to_vec(),
            DType::I64 => (x as i64).to_le_bytes().to_vec(),
        })
        .collect()
}

/// One instruction on its arena.
pub struct Case {
    pub name: String,
    pub instr: Instr<()>,
    pub arena: Vec<u8>,
    pub check: Check,
    pub mutation: Option<(&'static str, &'static str)>,
}

/// Lays buffers out in an arena: each on a 64-byte boundary plus `skew`
/// elements (misaligned rows and vectors).
#[derive(Default)]
pub struct Builder {
    arena: Vec<u8>,
}

impl Builder {
    pub fn buf(&mut self, dtype: DType, len: usize, skew: usize, bytes: Vec<u8>) -> Buf {
        let offset = self.arena.len().next_multiple_of(64) + skew * dtype.size_bytes() as usize;
        self.arena.resize(offset, 0x5A);
        assert_eq!(bytes.len(), len * dtype.size_bytes() as usize);
        self.arena.extend(bytes);
        Buf { place: Place::Device, offset, len, dtype }
    }
    pub fn input(&mut self, dtype: DType, values: &[f64], skew: usize) -> Buf {
        self.buf(dtype, values.len(), skew, storage(dtype, values))
    }
    pub fn floats(&mut self, r: &mut Random, dtype: DType, len: usize, scale: f64, skew: usize) -> Buf {
        let v: Vec<f64> = (0..len).map(|_| r.value(scale)).collect();
        self.input(dtype, &v, skew)
    }
    /// Poisoned: every byte 0xFF.
    pub fn output(&mut self, dtype: DType, len: usize, skew: usize) -> Buf {
        self.buf(dtype, len, skew, vec![0xFF; len * dtype.size_bytes() as usize])
    }
    pub fn case(self, name: String, instr: Instr<()>, check: Check) -> Case {
        supported(&instr).unwrap_or_else(|why| panic!("{name}: {why}"));
        Case { name, instr, arena: self.arena, check, mutation: None }
    }
}

pub fn mutated(mut case: Case, what: &str, from: &'static str, to: &'static str) -> Case {
    case.name = format!("{} [{what}]", case.name);
    case.mutation = Some((from, to));
    case
}

pub fn layout_cases(r: &mut Random, out: &mut Vec<Case>) {
    let transposes: [(&[usize], &[usize]); 6] = [
        (&[3, 5, 7, 11], &[0, 2, 1, 3]),
        (&[3, 5, 7, 11], &[3, 2, 1, 0]),
        (&[2, 33, 40], &[0, 2, 1]),
        (&[4, 1, 6, 8], &[0, 3, 1, 2]),
        (&[2, 3, 4, 16], &[2, 0, 1, 3]),
        (&[37, 70], &[1, 0]),
    ];
    for (i, (shape, perm)) in transposes.iter().enumerate() {
        for (d, dtype) in [DType::F32, DType::BF16, DType::I64, DType::F16].into_iter().enumerate() {
            let n: usize = shape.iter().product();
            let mut b = Builder::default();
            let x = b.floats(r, dtype, n, 50.0, (i + d) % 2);
            let o = b.output(dtype, n, 0);
            let instr = Instr::Transpose { x, shape: shape.to_vec(), perm: perm.to_vec(), out: o };
            out.push(b.case(format!("transpose {shape:?} by {perm:?} {dtype:?}"), instr, Check::Exact));
        }
    }
    for dtype in [DType::F32, DType::BF16, DType::I32] {
        let shape = vec![4, 10, 3];
        let mut b = Builder::default();
        let x = b.floats(r, dtype, 120, 50.0, 0);
        let o = b.output(dtype, 4 * 5 * 3, 1);
        let instr = Instr::Slice { x, shape: shape.clone(), axis: 1, start: 2, len: 5, out: o };
        out.push(b.case(format!("slice {dtype:?}"), instr, Check::Exact));
        let mut b = Builder::default();
        let dy = b.floats(r, dtype, 60, 50.0, 1);
        let o = b.output(dtype, 120, 0);
        let instr = Instr::SliceGrad { dy, shape: vec![4, 5, 3], axis: 1, start: 3, axis_len: 10, out: o };
        out.push(b.case(format!("slice_grad {dtype:?}"), instr, Check::Exact));
        let mut b = Builder::default();
        let x = b.floats(r, dtype, 120, 50.0, 0);
        let outs = vec![b.output(dtype, 4 * 2 * 3, 0), b.output(dtype, 4 * 7 * 3, 1), b.output(dtype, 4 * 3, 0)];
        let instr = Instr::Split { x, shape: shape.clone(), axis: 1, sizes: vec![2, 7, 1], outs };
        out.push(b.case(format!("split {dtype:?}"), instr, Check::Exact));
        let mut b = Builder::default();
        let shapes = vec![vec![3, 8, 16], vec![3, 8, 16], vec![3, 8, 5]];
        let parts = shapes.iter().map(|s| b.floats(r, dtype, s.iter().product(), 50.0, 0)).collect();
        let o = b.output(dtype, 3 * 8 * 37, 0);
        let instr = Instr::Concat { parts, shapes, axis: 2, out: o };
        out.push(b.case(format!("concat {dtype:?}"), instr, Check::Exact));
    }
    for dtype in [DType::F32, DType::BF16] {
        let mut b = Builder::default();
        let parts = vec![b.floats(r, dtype, 3, 1.0, 0), b.floats(r, dtype, 10, 1.0, 1), b.floats(r, dtype, 17, 1.0, 0)];
        let o = b.output(dtype, 41, 0);
        out.push(b.case(format!("flatten {dtype:?}"), Instr::Flatten { parts, out: o }, Check::Exact));
    }
}

pub fn fill_cases(r: &mut Random, out: &mut Vec<Case>) {
    for (dtype, value, len, skew) in
        [(DType::F32, 1.5, 37, 1), (DType::BF16, -2.25, 1001, 1), (DType::I64, 7.0, 9, 0), (DType::I32, -3.7, 64, 0)]
    {
        let mut b = Builder::default();
        let o = b.output(dtype, len, skew);
        out.push(b.case(format!("fill {dtype:?} {value}"), Instr::Fill { value, out: o }, Check::Exact));
    }
    for (dtype, len) in [(DType::I64, 37), (DType::I32, 3000), (DType::F32, 9), (DType::BF16, 300)] {
        let mut b = Builder::default();
        let o = b.output(dtype, len, 0);
        out.push(b.case(format!("arange {dtype:?} {len}"), Instr::Arange { out: o }, Check::Exact));
    }
    for (x_dtype, out_dtype) in [(DType::F32, DType::F32), (DType::BF16, DType::BF16), (DType::F16, DType::F32)] {
        let mut b = Builder::default();
        let x = b.floats(r, x_dtype, 333, 3.0, 1);
        let o = b.output(out_dtype, 333, 0);
        let instr = Instr::Scale { x, factor: 0.3, out: o };
        out.push(b.case(format!("scale {x_dtype:?} → {out_dtype:?}"), instr, Check::Exact));
    }
}

/// Ids in `[0, rows)` with repeats, some −1.
pub fn ids(r: &mut Random, n: usize, rows: usize) -> Vec<f64> {
    (0..n).map(|_| if r.next().is_multiple_of(7) { -1.0 } else { (r.next() % rows as u64) as f64 }).collect()
}

pub fn embedding_cases(r: &mut Random, out: &mut Vec<Case>) {
    for (dtype, id_dtype, rows, width, n) in [
        (DType::BF16, DType::I64, 11, 7, 13),
        (DType::F32, DType::I32, 13, 16, 40),
        (DType::F16, DType::I64, 5, 64, 9),
        (DType::F32, DType::I64, 30, 3, 5),
    ] {
        let mut b = Builder::default();
        let table = b.floats(r, dtype, rows * width, 1.0, 0);
        let id = b.input(id_dtype, &ids(r, n, rows), 0);
        let o = b.output(dtype, n * width, 0);
        let instr = Instr::Embedding { table, ids: id, width, out: o };
        out.push(b.case(format!("embedding {dtype:?} [{rows}, {width}] × {n} {id_dtype:?}"), instr, Check::Exact));
    }
    for (dy_dtype, out_dtype, id_dtype, rows, width, n) in [
        (DType::F32, DType::F32, DType::I64, 7, 5, 300),
        (DType::BF16, DType::BF16, DType::I32, 40, 16, 33),
        (DType::BF16, DType::F32, DType::I64, 3, 300, 20),
        (DType::F16, DType::F16, DType::I64, 50, 8, 12),
        // Token types: two rows, each named by hundreds of positions.
        (DType::BF16, DType::BF16, DType::I64, 2, 24, 600),
    ] {
        let mut b = Builder::default();
        let dy = b.floats(r, dy_dtype, n * width, 1.0, 1);
        let id = b.input(id_dtype, &ids(r, n, rows), 0);
        let o = b.output(out_dtype, rows * width, 0);
        let instr = Instr::EmbeddingGrad { dy, ids: id, width, out: o };
        let name = format!("embedding_grad {dy_dtype:?} → {out_dtype:?} [{rows}, {width}] × {n} {id_dtype:?}");
        out.push(b.case(name, instr, Check::Exact));
    }
}

/// Labels of `rows` rows in `[0, classes)`, about a third `ignore`.
pub fn labels(r: &mut Random, rows: usize, classes: usize, ignore: i64) -> Vec<f64> {
    (0..rows)
        .map(|_| if r.next().is_multiple_of(3) { ignore as f64 } else { (r.next() % classes as u64) as f64 })
        .collect()
}

pub fn loss_cases(r: &mut Random, out: &mut Vec<Case>) {
    let ignore = -100;
    let shapes = [(5usize, 37usize), (3, 1000), (9, 8), (20, 250)];
    for (i, &(rows, classes)) in shapes.iter().enumerate() {
        for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::BF16, 1e-2), (DType::F16, 2e-3)] {
            let label_dtype = if i % 2 == 0 { DType::I64 } else { DType::I32 };
            let mut b = Builder::default();
            let logits = b.floats(r, dtype, rows * classes, 4.0, i % 2);
            let y = b.input(label_dtype, &labels(r, rows, classes, ignore), 0);
            let loss = b.output(DType::F32, 1, 0);
            let instr = Instr::CrossEntropy { logits, labels: y, classes, ignore_index: ignore, out: loss };
            let name = format!("cross_entropy {dtype:?} [{rows}, {classes}] {label_dtype:?}");
            out.push(b.case(name, instr, Check::Within(1e-5)));
            let mut b = Builder::default();
            let logits = b.floats(r, dtype, rows * classes, 4.0, i % 2);
            let y = b.input(label_dtype, &labels(r, rows, classes, ignore), 0);
            let dloss = b.input(DType::F32, &[0.7], 0);
            let o = b.output(dtype, rows * classes, i % 2);
            let instr = Instr::CrossEntropyGrad { logits, labels: y, dloss, classes, ignore_index: ignore, out: o };
            out.push(b.case(
                format!("cross_entropy_grad {dtype:?} [{rows}, {classes}]"),
                instr,
                Check::Within(tolerance),
            ));
        }
    }
}

/// The cases the comparison must catch.
pub fn mutations(r: &mut Random) -> Vec<Case> {
    let mut b = Builder::default();
    let x = b.floats(r, DType::F32, 2 * 33 * 40, 1.0, 0);
    let o = b.output(DType::F32, 2 * 33 * 40, 0);
    let t = b.case(
        "transpose [2, 33, 40]".into(),
        Instr::Transpose { x, shape: vec![2, 33, 40], perm: vec![0, 2, 1], out: o },
        Check::Exact,
    );
    let ce = |r: &mut Random, scale: f64| {
        let mut b = Builder::default();
        let logits = b.floats(r, DType::F32, 6 * 50, scale, 0);
        let y = b.input(DType::I64, &labels(r, 6, 50, -100), 0);
        let loss = b.output(DType::F32, 1, 0);
        let instr = Instr::CrossEntropy { logits, labels: y, classes: 50, ignore_index: -100, out: loss };
        b.case(format!("cross_entropy ×{scale}"), instr, Check::Within(1e-5))
    };
    // 40 positions over `rows` rows: about 7 a row for 6 (short lists, a
    // thread a column), about 20 for 2 (shared out over a block's 8 warps).
    let eg = |r: &mut Random, rows: usize| {
        let mut b = Builder::default();
        let dy = b.floats(r, DType::F32, 40 * 4, 1.0, 0);
        let id = b.input(DType::I64, &ids(r, 40, rows), 0);
        let o = b.output(DType::F32, rows * 4, 0);
        let instr = Instr::EmbeddingGrad { dy, ids: id, width: 4, out: o };
        b.case(format!("embedding_grad over {rows} rows"), instr, Check::Exact)
    };
    vec![
        mutated(t, "a tile read transposed", "= tile[tx][y]", "= tile[y][tx]"),
        mutated(ce(r, 60.0), "no maximum subtracted", "s += (double)expf(v - m)", "s += (double)expf(v)"),
        mutated(
            ce(r, 1.0),
            "ignored rows counted",
            "if (zp_counted((long long)labels[r], classes, ignore_index)) {",
            "if (true) {",
        ),
        mutated(eg(r, 6), "every position the head of its own list", "first = j;", "first = i;"),
        mutated(
            eg(r, 6),
            "a short list's first position dropped",
            "for (int k = 0; k < positions; ++k)",
            "for (int k = 1; k < positions; ++k)",
        ),
        mutated(eg(r, 2), "a warp's positions after its first dropped", "k += warps)", "k += positions)"),
    ]
    .into_iter()
    .chain(super::routine_arith::mutations(r))
    .collect()
}

/// The host routine's arena after running `case`.
pub fn reference(case: &Case) -> Vec<u8> {
    let mem = Memory { device: Arena::new(case.arena.len()).unwrap(), host: Arena::new(0).unwrap(), nvme: None };
    // SAFETY: the arena holds `case.arena.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(case.arena.as_ptr(), mem.device.base(), case.arena.len()) };
    let feeds = Default::default();
    let cx = Ctx { feeds: &feeds, seed: 0, offset: 0, comm: &Alone, tensor: &Alone };
    host::run_routine(&case.instr, &mem, &cx).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(mem.device.base(), case.arena.len()) }.to_vec()
}

/// What is wrong with `got` (the emulated arena) against `want` (the host's), if anything.
pub fn compare(case: &Case, got: &[u8], want: &[u8]) -> Option<String> {
    let mut outputs = Vec::new();
    case.instr.clone().for_each_buf(|b, access| {
        if access == Access::Write {
            outputs.push(*b)
        }
    });
    let inside = |at: usize| outputs.iter().any(|b| (b.offset..b.offset + b.bytes()).contains(&at));
    if let Some(at) = (0..got.len()).find(|&at| !inside(at) && got[at] != case.arena[at]) {
        return Some(format!("byte {at}, outside the outputs, changed"));
    }
    for o in &outputs {
        let range = o.offset..o.offset + o.bytes();
        let (g, w) = (&got[range.clone()], &want[range]);
        match case.check {
            Check::Exact if g != w => {
                let at = (0..g.len()).find(|&k| g[k] != w[k]).unwrap();
                return Some(format!("differs from byte {at} (of {})", g.len()));
            }
            Check::Exact => {}
            Check::Within(tolerance) => {
                let (g, w) = (from_bytes(g, o.dtype), from_bytes(w, o.dtype));
                let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
                let worst = g
                    .iter()
                    .zip(&w)
                    .map(|(a, b)| (a - b).abs() / scale)
                    .fold(0.0, |m: f64, e| if e.is_nan() { f64::INFINITY } else { m.max(e) });
                if worst > tolerance {
                    return Some(format!("error {worst:e} over {tolerance:e}"));
                }
            }
        }
    }
    None
}

/// Every case but the mutations, from one seed.
pub fn cases() -> Vec<Case> {
    let mut r = Random(0x9E37_79B9_7F4A_7C15);
    let mut cases = Vec::new();
    layout_cases(&mut r, &mut cases);
    fill_cases(&mut r, &mut cases);
    embedding_cases(&mut r, &mut cases);
    loss_cases(&mut r, &mut cases);
    super::routine_arith::broadcast_cases(&mut r, &mut cases);
    super::routine_arith::sum_to_cases(&mut r, &mut cases);
    super::routine_arith::cast_cases(&mut r, &mut cases);
    super::routine_arith::mse_cases(&mut r, &mut cases);
    super::routine_arith::alibi_cases(&mut r, &mut cases);
    super::routine_arith::scalar_cases(&mut cases);
    cases
}
