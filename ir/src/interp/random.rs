//! Randomness from Philox: dropout masks and parameter initialisation.
//!
//! Both are pure functions of (seed, site, element), so they need no
//! generator state: the mask of element `e` of dropout stream `s` at offset
//! `o` is the same whoever computes it, whenever. Dropout counters use the
//! stream word for the site; initialisation uses stream `0xFFFF_FFFF`, which
//! no builder assigns to a dropout site.

use super::nd;
use super::philox::{key_of, philox4x32_10};
use crate::dtype::DType;
use crate::op::Init;
use crate::tensor::Tensor;

/// The counter's third word for parameter initialisation.
pub const INIT_STREAM: u32 = 0xFFFF_FFFF;

/// The Philox counter of element `index` in `stream` at `offset`:
/// `(index low 32 bits, index high 32 bits, stream, offset)`.
pub fn counter(index: u64, stream: u32, offset: u32) -> [u32; 4] {
    [index as u32, (index >> 32) as u32, stream, offset]
}

/// A uniform in `[0, 1)` on a 2⁻²⁴ grid from the top 24 bits of `word`,
/// exactly representable in f32 (so `u ≥ p` means the same in every backend).
pub fn uniform24(word: u32) -> f64 {
    f64::from(word >> 8) * (1.0 / 16_777_216.0)
}

/// Whether dropout keeps element `index` of `stream` at `offset` with drop
/// probability `p`: `uniform24(w0) ≥ p`, `w0` the first Philox word for key
/// `seed` and [`counter`]`(index, stream, offset as u32)`.
pub fn dropout_keeps(seed: u64, stream: u32, offset: u64, index: u64, p: f64) -> bool {
    let words = philox4x32_10(counter(index, stream, offset as u32), key_of(seed));
    uniform24(words[0]) >= p
}

/// Dropout of `x`: kept elements times `1/(1 − p)` (the factor in f64), others 0.
pub(super) fn dropout(x: &Tensor, p: f64, stream: u32, seed: u64, offset: u64) -> Result<Tensor, String> {
    if !(0.0..1.0).contains(&p) {
        return Err(format!("dropout probability must be in [0, 1), got {p}"));
    }
    let v = nd::floats(x, "the operand")?;
    let scale = 1.0 / (1.0 - p);
    let out = v
        .iter()
        .enumerate()
        .map(|(e, &value)| if dropout_keeps(seed, stream, offset, e as u64, p) { value * scale } else { 0.0 })
        .collect();
    Ok(nd::float(x.shape().to_vec(), x.dtype(), out))
}

/// The init stream of a parameter or state: the 32-bit FNV-1a hash of its
/// name, so initial values do not depend on node order.
pub fn name_stream(name: &str) -> u32 {
    name.bytes().fold(0x811C_9DC5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193))
}

/// A standard normal for element `index` of the parameter or state whose
/// init stream is `ordinal` ([`name_stream`]): Box–Muller on the first two
/// words `w0, w1` of Philox with key `seed` and counter
/// `(index low, index high, 0xFFFF_FFFF, ordinal)`:
/// `u1 = (w0 + 1)·2⁻³²` ∈ (0, 1], `u2 = w1·2⁻³²`,
/// `z = √(−2 ln u1)·cos(2π·u2)`.
pub fn standard_normal(seed: u64, ordinal: u32, index: u64) -> f64 {
    let words = philox4x32_10(counter(index, INIT_STREAM, ordinal), key_of(seed));
    let two_32 = 4_294_967_296.0;
    let u1 = (f64::from(words[0]) + 1.0) / two_32;
    let u2 = f64::from(words[1]) / two_32;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Which shards a rank initialises: its data-parallel rank (a ZeRO flat
/// buffer's slice) and its tensor-parallel rank (an [`Init::TensorShard`]'s
/// slice). `None` where the run has no such rank: a value sharded that way
/// is then an error, not a guess.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitRank {
    pub data: Option<u64>,
    pub tensor: Option<u64>,
}

/// The initial value of a parameter or state of `shape` and `dtype`,
/// unrounded (the interpreter rounds in `Native` mode). A flat buffer
/// sharded over ranks is data rank `rank.data`'s slice of the whole buffer's
/// value; a tensor shard is tensor rank `rank.tensor`'s slice of the whole
/// tensor's value, drawn under the same name (`ordinal`), so the shards of
/// every rank count start where the unsharded parameter does.
pub(super) fn init(
    init: &Init,
    shape: Vec<usize>,
    dtype: DType,
    seed: u64,
    ordinal: u32,
    rank: InitRank,
) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    match init {
        Init::Zeros => Ok(nd::full(shape, dtype, 0.0)),
        Init::Ones => Ok(nd::full(shape, dtype, 1.0)),
        Init::Constant { value } => Ok(nd::full(shape, dtype, *value)),
        Init::Normal { std } if dtype.is_float() => {
            Ok(nd::float(shape, dtype, (0..n as u64).map(|e| std * standard_normal(seed, ordinal, e)).collect()))
        }
        Init::Normal { .. } => Err(format!("a normal initialiser needs a float dtype, not {dtype}")),
        Init::Flat { shards, members } if *shards > 1 => {
            let data = rank.data.ok_or_else(|| {
                format!("a flat buffer sharded over {shards} ranks needs a rank: initialise it per rank")
            })?;
            if data >= *shards {
                return Err(format!("rank {data} of a buffer sharded over {shards} ranks"));
            }
            let whole = Init::Flat { members: members.clone(), shards: 1 };
            let all =
                self::init(&whole, vec![n * *shards as usize], dtype, seed, ordinal, InitRank { data: None, ..rank })?;
            let values = all.floats().ok_or("a flat buffer is float")?;
            let at = data as usize * n;
            Ok(nd::float(shape, dtype, values[at..at + n].to_vec()))
        }
        Init::TensorShard { whole, axis, ranks, init: of } => {
            let tensor = rank.tensor.ok_or_else(|| {
                format!(
                    "a tensor-parallel shard ({init}) is initialised per tensor rank: load the program on each rank"
                )
            })?;
            let whole: Vec<usize> = whole.iter().map(|&d| d as usize).collect();
            let all = self::init(of, whole.clone(), dtype, seed, ordinal, rank)?;
            let part = tensor_slice(&all, &whole, *axis, tensor, *ranks)?;
            if part.len() != n {
                return Err(format!("a tensor shard of {init} has {} elements, its node {n}", part.len()));
            }
            Ok(nd::float(shape, dtype, part))
        }
        Init::Slice { of, whole, start, len, init: of_init } => {
            let whole: Vec<usize> = whole.iter().map(|&d| d as usize).collect();
            let all = self::init(of_init, whole.clone(), dtype, seed, name_stream(of), rank)?;
            let row: usize = whole.iter().skip(1).product();
            let values = all.floats().ok_or("a tile is a float")?;
            let (at, count) = (*start as usize * row, *len as usize * row);
            let part = values.get(at..at + count).ok_or_else(|| format!("{init} ends past `{of}`'s {whole:?}"))?;
            if count != n {
                return Err(format!("{init} has {count} elements, its node {n}"));
            }
            Ok(nd::float(shape, dtype, part.to_vec()))
        }
        Init::Flat { members, .. } => {
            let mut flat = vec![0.0; n];
            for m in members.iter() {
                let shape = m.shape.iter().map(|&d| d as usize).collect();
                let part =
                    self::init(&m.init, shape, dtype, seed, name_stream(&m.name), InitRank { data: None, ..rank })?;
                let values = part.floats().ok_or_else(|| format!("flat member `{}` is not a float", m.name))?;
                let at = m.offset as usize;
                flat.get_mut(at..at + values.len())
                    .ok_or_else(|| format!("flat member `{}` ends past the buffer's {n} elements", m.name))?
                    .copy_from_slice(values);
            }
            Ok(nd::float(shape, dtype, flat))
        }
    }
}

/// Tensor rank `rank`'s `1/ranks` slice along `axis` of `all` (shape `whole`).
fn tensor_slice(all: &Tensor, whole: &[usize], axis: usize, rank: u64, ranks: u64) -> Result<Vec<f64>, String> {
    let values = all.floats().ok_or("a tensor shard is a float")?;
    let along = *whole.get(axis).ok_or_else(|| format!("axis {axis} of a {whole:?} tensor"))?;
    if ranks == 0 || rank >= ranks || !along.is_multiple_of(ranks as usize) {
        return Err(format!("tensor rank {rank} of {ranks}: axis {axis} of {whole:?} does not split so"));
    }
    let (outer, inner): (usize, usize) = (whole[..axis].iter().product(), whole[axis + 1..].iter().product());
    let part = along / ranks as usize;
    let mut out = Vec::with_capacity(outer * part * inner);
    for o in 0..outer {
        let at = (o * along + rank as usize * part) * inner;
        out.extend_from_slice(&values[at..at + part * inner]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn name_streams_are_fnv1a() {
        // FNV-1a 32-bit reference values.
        assert_eq!(super::name_stream(""), 0x811C_9DC5);
        assert_eq!(super::name_stream("a"), 0xE40C_292C);
    }

    use super::*;

    fn mask(seed: u64, stream: u32, offset: u64, n: u64, p: f64) -> Vec<bool> {
        (0..n).map(|e| dropout_keeps(seed, stream, offset, e, p)).collect()
    }

    #[test]
    fn tensor_shards_are_slices_of_the_whole_parameter() {
        let normal = Init::Normal { std: 0.02 };
        let at = |tensor| InitRank { data: None, tensor: Some(tensor) };
        let whole = init(&normal, vec![6, 4], DType::F32, 3, 9, InitRank::default()).unwrap();
        let w = whole.floats().unwrap();
        for axis in [0, 1] {
            let shard = Init::TensorShard { whole: [6, 4].into(), axis, ranks: 2, init: normal.clone().into() };
            let shape = if axis == 0 { vec![3, 4] } else { vec![6, 2] };
            let parts: Vec<Tensor> =
                (0..2).map(|r| init(&shard, shape.clone(), DType::F32, 3, 9, at(r)).unwrap()).collect();
            for (e, &v) in w.iter().enumerate() {
                let (row, col) = (e / 4, e % 4);
                let (r, i) = if axis == 0 { (row / 3, (row % 3) * 4 + col) } else { (col / 2, row * 2 + col % 2) };
                assert_eq!(parts[r].floats().unwrap()[i], v, "axis {axis}, element {e}");
            }
        }
        let shard = Init::TensorShard { whole: [6, 4].into(), axis: 0, ranks: 2, init: normal.into() };
        let err = init(&shard, vec![3, 4], DType::F32, 3, 9, InitRank::default()).unwrap_err();
        assert!(err.contains("per tensor rank"), "{err}");
    }

    #[test]
    fn masks_are_reproducible_and_stream_dependent() {
        let a = mask(7, 3, 11, 1000, 0.1);
        assert_eq!(a, mask(7, 3, 11, 1000, 0.1));
        assert_ne!(a, mask(7, 4, 11, 1000, 0.1), "another stream");
        assert_ne!(a, mask(7, 3, 12, 1000, 0.1), "another offset");
        assert_ne!(a, mask(8, 3, 11, 1000, 0.1), "another seed");
        // p = 0 keeps everything (u ≥ 0 always).
        assert!(mask(1, 0, 0, 1000, 0.0).into_iter().all(|k| k));
    }

    #[test]
    fn kept_fraction_is_one_minus_p() {
        for p in [0.1, 0.5, 0.9] {
            let kept = mask(42, 0, 0, 10_000, p).into_iter().filter(|k| *k).count() as f64 / 10_000.0;
            // Binomial std at n = 10⁴ is ≤ 0.005; allow 4σ.
            assert!((kept - (1.0 - p)).abs() < 0.02, "p = {p}: kept {kept}");
        }
    }

    #[test]
    fn dropout_scales_survivors() {
        let x = nd::float(vec![4, 250], DType::F32, vec![2.0; 1000]);
        let y = dropout(&x, 0.2, 5, 99, 3).unwrap();
        for (e, &v) in y.floats().unwrap().iter().enumerate() {
            let want = if dropout_keeps(99, 5, 3, e as u64, 0.2) { 2.0 / 0.8 } else { 0.0 };
            assert_eq!(v, want);
        }
    }

    #[test]
    fn the_first_word_decides_by_hand() {
        // Counter 0, key 0: w0 = 0x6627e8d5 (Random123), so u = 0x6627e8·2⁻²⁴ = 0.3990464…
        let u = uniform24(0x6627_e8d5);
        assert!((u - 0.399_046_421_051_025_4).abs() < 1e-15);
        assert!(dropout_keeps(0, 0, 0, 0, 0.399));
        assert!(!dropout_keeps(0, 0, 0, 0, 0.3991));
    }

    #[test]
    fn normal_init_has_the_right_moments() {
        let t = init(&Init::Normal { std: 0.02 }, vec![100, 100], DType::F32, 3, 0, InitRank::default()).unwrap();
        let v = t.floats().unwrap();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.02 * 0.04, "mean {mean}");
        assert!((var.sqrt() / 0.02 - 1.0).abs() < 0.03, "std {}", var.sqrt());
        // A different stream is a different tensor; the same one is identical.
        assert_ne!(
            t,
            init(&Init::Normal { std: 0.02 }, vec![100, 100], DType::F32, 3, 1, InitRank::default()).unwrap()
        );
        assert_eq!(
            t,
            init(&Init::Normal { std: 0.02 }, vec![100, 100], DType::F32, 3, 0, InitRank::default()).unwrap()
        );
        assert_eq!(
            init(&Init::Ones, vec![2], DType::BF16, 0, 0, InitRank::default()).unwrap().floats().unwrap(),
            &[1.0, 1.0]
        );
        assert_eq!(
            init(&Init::Zeros, vec![2], DType::I64, 0, 0, InitRank::default()).unwrap().ints().unwrap(),
            &[0, 0]
        );
        assert!(init(&Init::Normal { std: 1.0 }, vec![2], DType::I64, 0, 0, InitRank::default()).is_err());
    }

    #[test]
    fn a_sharded_flat_buffer_is_each_ranks_slice_of_the_whole() {
        let members = vec![
            crate::op::FlatMember {
                name: "a".into(),
                shape: vec![3, 2],
                offset: 0,
                init: Box::new(Init::Normal { std: 1.0 }),
            },
            crate::op::FlatMember { name: "b".into(), shape: vec![4], offset: 6, init: Box::new(Init::Ones) },
        ];
        let flat = |shards| Init::Flat { members: members.as_slice().into(), shards };
        let whole = init(&flat(1), vec![12], DType::F32, 5, 0, InitRank::default()).unwrap();
        let shards: Vec<f64> = (0..2)
            .flat_map(|rank| {
                init(&flat(2), vec![6], DType::F32, 5, 0, InitRank { data: Some(rank), tensor: None })
                    .unwrap()
                    .floats()
                    .unwrap()
                    .to_vec()
            })
            .collect();
        assert_eq!(shards, whole.floats().unwrap());
        assert!(init(&flat(2), vec![6], DType::F32, 5, 0, InitRank::default()).unwrap_err().contains("per rank"));
        assert!(init(&flat(2), vec![6], DType::F32, 5, 0, InitRank { data: Some(2), tensor: None }).is_err());
    }
}
