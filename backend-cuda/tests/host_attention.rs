//! The fused attention kernels *run*, without a GPU: f32 specialisations'
//! forward and backward sources (and one bf16 and one f16, on the shim's
//! host bf16/f16 types), and the tensor-core kernels (bf16 and f16, head
//! dims 32, 64 and 128, their `mma.sync`/`ldmatrix` emulated lane by lane
//! from the PTX ISA's fragment layouts), are compiled as C++ by the host's g++ against
//! `tests/host/shim.h` (threads for a block's threads, barriers for
//! `__syncthreads`/`__syncwarp`, memory for warp shuffles) and run forward
//! then backward (on the forward's own `out` and `lse`, as in training);
//! every output is compared with an independent `f64` reference
//! (`tests/common/attention.rs`) at 1e-5 relative to its largest magnitude
//! (1e-2 for 16-bit storage). Cases cover both head dims, both mask types, ALiBi with a
//! tensor-rank head offset and a non-power-of-two head count, dropout, one
//! partial tile, exact tiles and several tiles with a partial last one,
//! masked keys and fully masked rows. Mutated kernels (a wrong scale, a
//! flipped ALiBi sign, a shifted dropout index, a tile that drops its last
//! key, a backward without its row term; on tensor cores, a wrong fragment
//! mapping: an `ldmatrix` lane address, an accumulator element's row or
//! column, the packing order, the store; and head dim 128's shared operand
//! buffer never restaged) must fail the same comparison.
//! Without g++ the test says SKIPPED and passes.

mod common;

use std::fmt::Write;
use std::path::Path;

use common::attention::{AttentionCase, AttentionData, AttentionOutputs, reference};
use common::host::{compile_and_run_cases, f32_bytes, f32_literal, gxx_present, read_f32};
use common::{error, from_bytes};
use zeroplan_backend_cuda::DeviceProperties;
use zeroplan_backend_cuda::attention::{AttentionKernel, Entry, Pass};
use zeroplan_ir::DType;

const F32_TOLERANCE: f64 = 1e-5;
const BF16_TOLERANCE: f64 = 1e-2;

/// A source edit that must make a case fail: `(pass, from, to)`.
type Mutation = (Pass, &'static str, &'static str);

fn kernel(head_dim: usize, mask: DType, alibi: bool, dropout: bool) -> AttentionKernel {
    AttentionKernel { head_dim, dtype: DType::F32, mask, alibi, dropout, tensor_cores: false }
}

fn mma_kernel(head_dim: usize, dtype: DType, mask: DType, alibi: bool, dropout: bool) -> AttentionKernel {
    AttentionKernel { head_dim, dtype, mask, alibi, dropout, tensor_cores: true }
}

fn half_kernel(head_dim: usize, dtype: DType) -> AttentionKernel {
    AttentionKernel { dtype, ..kernel(head_dim, DType::I64, true, true) }
}

/// The C type of the storage dtype.
fn storage(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "__nv_bfloat16",
        DType::F16 => "__half",
        _ => "float",
    }
}

fn to_storage(dtype: DType, values: &[f64]) -> Vec<u8> {
    match dtype {
        DType::BF16 => values.iter().flat_map(|&x| zeroplan_ir::to_bf16(x).to_le_bytes()).collect(),
        DType::F16 => values.iter().flat_map(|&x| zeroplan_ir::to_f16(x).to_le_bytes()).collect(),
        _ => f32_bytes(values),
    }
}

/// `case` (number `i`) as C++: its two sources in their own namespaces
/// (with `mutation` applied) and `run{i}(dir)`, which reads its operands,
/// runs the forward, then the backward on the forward's outputs, and
/// writes every output.
fn harness(i: usize, case: &AttentionCase, mutation: Option<Mutation>) -> String {
    let mut s = String::new();
    for pass in [Pass::Forward, Pass::Backward] {
        let mut source = case.kernel.render(pass).unwrap().source;
        source = source.replace("#include <cuda_bf16.h>", "").replace("#include <cuda_fp16.h>", "");
        if let Some((p, from, to)) = mutation
            && p == pass
        {
            assert!(source.contains(from), "the mutation's `{from}` is not in the {pass:?} source");
            source = source.replace(from, to);
        }
        // Each case's own symbols: a mutated copy shares its base case's.
        for entry in pass.entries() {
            let symbol = case.kernel.symbol(*entry);
            source = source.replace(&format!("{symbol}("), &format!("{symbol}_c{i}("));
        }
        let _ = writeln!(s, "namespace c{i}_{pass:?} {{\n{source}\n}}");
    }
    let a = case.args();
    let scalars = format!(
        "{}, {}, {}, {}, {}, {}u, {}, {}u, rng",
        a.heads,
        a.seq,
        f32_literal(a.scale),
        a.head_offset,
        a.total_heads,
        a.keep_threshold,
        f32_literal(a.keep_scale),
        a.stream,
    );
    let launch = case.kernel.launch(Pass::Backward, case.shape(), &DeviceProperties::H100_SXM);
    let (gx, gy) = launch.unwrap().kernels[0].grid;
    let n = case.elements() * case.kernel.dtype.size_bytes() as usize;
    let rows = case.batch * case.heads * case.seq * 4;
    let t_c = storage(case.kernel.dtype);
    let mask_t = if case.kernel.mask == DType::I32 { "int" } else { "long long" };
    let mask_bytes = case.batch * case.seq * case.kernel.mask.size_bytes() as usize;
    let symbol = |e| format!("{}_c{i}", case.kernel.symbol(e));
    let _ = writeln!(s, "static void run{i}(const std::string& dir) {{");
    // Dropout's words, which the kernels read from memory.
    let _ = writeln!(s, "  static const unsigned long long rng[2] = {{{}ULL, {}ULL}};", case.seed, case.offset);
    for t in ["q", "k", "v", "dout"] {
        let _ = writeln!(s, "  const {t_c}* {t} = (const {t_c}*)zp_read(dir + \"/{i}.{t}\", {n});");
    }
    let _ = writeln!(s, "  const {mask_t}* mask = (const {mask_t}*)zp_read(dir + \"/{i}.mask\", {mask_bytes});");
    for (t, bytes, c) in [("out", n, t_c), ("lse", rows, "float"), ("dq", n, t_c), ("dk", n, t_c), ("dv", n, t_c)] {
        let _ = writeln!(s, "  {c}* {t} = ({c}*)zp_alloc({bytes});");
    }
    let _ = writeln!(
        s,
        "  zp_launch2({gx}, {gy}, 128, [&] {{ c{i}_Forward::{}(q, k, v, mask, out, lse, {scalars}); }});",
        symbol(Entry::Forward)
    );
    let _ = writeln!(
        s,
        "  zp_launch2({gx}, {gy}, 128, [&] {{ c{i}_Backward::{}(q, k, v, mask, out, lse, dout, dq, {scalars}); }});",
        symbol(Entry::BackwardDq)
    );
    let _ = writeln!(
        s,
        "  zp_launch2({gx}, {gy}, 128, [&] {{ c{i}_Backward::{}(q, k, v, mask, out, lse, dout, dk, dv, {scalars}); }});",
        symbol(Entry::BackwardDkDv)
    );
    for (t, bytes) in [("out", n), ("lse", rows), ("dq", n), ("dk", n), ("dv", n)] {
        let _ = writeln!(s, "  zp_write(dir + \"/{i}.{t}\", (const char*){t}, {bytes});");
    }
    let _ = writeln!(s, "}}");
    s
}

fn write_inputs(dir: &Path, i: usize, case: &AttentionCase, x: &AttentionData) {
    for (t, values) in [("q", &x.q), ("k", &x.k), ("v", &x.v), ("dout", &x.dout)] {
        std::fs::write(dir.join(format!("{i}.{t}")), to_storage(case.kernel.dtype, values)).unwrap();
    }
    std::fs::write(dir.join(format!("{i}.mask")), case.mask_bytes(&x.mask)).unwrap();
}

/// The worst error of each output of case `i` against the reference.
fn errors(dir: &Path, i: usize, dtype: DType, want: &AttentionOutputs) -> Vec<(&'static str, f64)> {
    let read = |t: &str| {
        let path = dir.join(format!("{i}.{t}"));
        if t == "lse" { read_f32(&path) } else { from_bytes(&std::fs::read(path).unwrap(), dtype) }
    };
    want.named().into_iter().map(|(t, w)| (t, error(&read(t), w))).collect()
}

/// Runs `cases`, then each `(what, base case, mutation)` of `mutated` on a
/// copy of its base case, as one program; fails unless every case is within
/// tolerance and every mutant is not. `tag` names the run's directory.
fn check(tag: &str, cases: &[AttentionCase], mutated: &[(&str, usize, Mutation)]) {
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-attention-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from("#include \"shim.h\"\n");
    let mut runs: Vec<(String, AttentionOutputs, bool, DType)> = Vec::new();
    let all = cases.iter().map(|c| (c.clone(), None)).chain(mutated.iter().map(|(what, base, m)| {
        let mut c = cases[*base].clone();
        c.name = format!("{} with {what}", c.name);
        (c, Some(*m))
    }));
    for (i, (case, mutation)) in all.enumerate() {
        let x = case.data(100 + i as u64);
        write_inputs(&dir, i, &case, &x);
        program.push_str(&harness(i, &case, mutation));
        runs.push((case.name.clone(), reference(&case, &x), mutation.is_some(), case.kernel.dtype));
    }
    compile_and_run_cases(&dir, program, runs.len(), "-O1");

    let mut failures = Vec::new();
    for (i, (name, want, mutated, dtype)) in runs.iter().enumerate() {
        let tolerance = if *dtype == DType::F32 { F32_TOLERANCE } else { BF16_TOLERANCE };
        let errs = errors(&dir, i, *dtype, want);
        let worst = errs.iter().map(|e| e.1).fold(0.0, f64::max);
        println!("{name}: {}", errs.iter().map(|(t, e)| format!("{t} {e:.1e}")).collect::<Vec<_>>().join(", "));
        if !mutated && worst > tolerance {
            failures.push(format!("{name}: {errs:?}"));
        }
        if *mutated && worst <= tolerance {
            failures.push(format!("{name} passed (worst error {worst:e}): the comparison cannot see it"));
        }
    }
    // Fully masked rows: lse = −∞ and out = 0 exactly (the last batch entry of case 0).
    let seq = cases[0].seq;
    let lse = read_f32(&dir.join("0.lse"));
    assert!(lse[lse.len() - seq..].iter().all(|&x| x == f64::NEG_INFINITY), "{lse:?}");
    let out = from_bytes(&std::fs::read(dir.join("0.out")).unwrap(), cases[0].kernel.dtype);
    assert!(out.iter().rev().take(seq * cases[0].kernel.head_dim).all(|&x| x == 0.0));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fused_attention_matches_the_reference_under_host_emulation() {
    if !gxx_present() {
        eprintln!("SKIPPED: no g++ to compile the emulated kernels");
        return;
    }
    let cases = [
        // One partial tile, fewer rows than a block: the tails of everything.
        AttentionCase::new("d32 plain S=5", kernel(32, DType::I64, false, false), [2, 3, 5], 1, 0),
        // ALiBi on tensor rank 1 of 2 (heads 3..6 of 6: not a power of two).
        AttentionCase::new("d64 alibi rank 1/2 S=77", kernel(64, DType::I64, true, false), [2, 3, 77], 2, 1),
        AttentionCase::new("d32 dropout i32 mask S=77", kernel(32, DType::I32, false, true), [2, 2, 77], 1, 0),
        // Exactly one tile, 12 heads over 4 ranks (the 2n-slope half).
        AttentionCase::new("d32 alibi+dropout rank 3/4 S=64", kernel(32, DType::I64, true, true), [1, 3, 64], 4, 3),
        // Three tiles, the last partial.
        AttentionCase::new("d64 alibi+dropout S=130", kernel(64, DType::I64, true, true), [1, 2, 130], 1, 0),
        // 16-bit storage (the shim's bf16/f16), at 1e-2.
        AttentionCase::new("d64 bf16 alibi+dropout S=77", half_kernel(64, DType::BF16), [2, 2, 77], 1, 0),
        AttentionCase::new("d32 f16 alibi+dropout S=40", half_kernel(32, DType::F16), [2, 2, 40], 2, 0),
    ];
    let mutated: [(&str, usize, Mutation); 5] = [
        ("a wrong scale", 1, (Pass::Forward, "float s = dot * scale;", "float s = dot * (scale * 1.01f);")),
        ("ALiBi's sign flipped", 1, (Pass::Backward, "if (ZP_ALIBI) s -= slope", "if (ZP_ALIBI) s += slope")),
        (
            "dropout's index shifted",
            2,
            (
                Pass::Forward,
                "((unsigned long long)bh * seq + i) * seq + j;",
                "((unsigned long long)bh * seq + i) * seq + j + 1;",
            ),
        ),
        (
            "a tile missing its last key",
            1,
            (
                Pass::Forward,
                "const int keys = seq - key0 < ZP_TILE ? seq - key0 : ZP_TILE;",
                "const int keys = (seq - key0 < ZP_TILE ? seq - key0 : ZP_TILE) - 1;",
            ),
        ),
        (
            "the backward without D_i",
            2,
            (Pass::Backward, "(z * zp_dot(dorow, vrow) - d_i)", "(z * zp_dot(dorow, vrow))"),
        ),
    ];
    check("fma", &cases, &mutated);
}

/// The tensor-core kernels: both 16-bit types, head dims 32, 64 and 128
/// (its smaller tiles and the dK/dV kernel's two walks), one block and
/// several, one tile and several with a partial last; and mutants of their
/// fragment mappings.
#[test]
fn tensor_core_attention_matches_the_reference_under_host_emulation() {
    if !gxx_present() {
        eprintln!("SKIPPED: no g++ to compile the emulated kernels");
        return;
    }
    let cases = [
        // One partial tile and block, fully masked rows in the last batch entry.
        AttentionCase::new(
            "mma d32 f16 plain S=5",
            mma_kernel(32, DType::F16, DType::I64, false, false),
            [2, 1, 5],
            1,
            0,
        ),
        // Two blocks and three key tiles, the last partial; ALiBi on rank 1 of 2.
        AttentionCase::new(
            "mma d64 bf16 alibi+dropout S=77",
            mma_kernel(64, DType::BF16, DType::I64, true, true),
            [1, 1, 77],
            2,
            1,
        ),
        // Head dim 128: tiles of 16, dV then dK.
        AttentionCase::new(
            "mma d128 bf16 alibi+dropout S=40",
            mma_kernel(128, DType::BF16, DType::I64, true, true),
            [1, 1, 40],
            1,
            0,
        ),
        // Three blocks, five key tiles.
        AttentionCase::new(
            "mma d64 f16 dropout i32 mask S=130",
            mma_kernel(64, DType::F16, DType::I32, false, true),
            [1, 1, 130],
            1,
            0,
        ),
        // The mutants' base: one block, one tile each way.
        AttentionCase::new(
            "mma d32 bf16 alibi+dropout S=20",
            mma_kernel(32, DType::BF16, DType::I64, true, true),
            [1, 1, 20],
            1,
            0,
        ),
    ];
    let mutated: [(&str, usize, Mutation); 8] = [
        (
            "A's ldmatrix rows from 8 lanes",
            4,
            (
                Pass::Forward,
                "a + (lane % 16) * ZP_STRIDE + k + 8 * (lane / 16)",
                "a + (lane % 8) * ZP_STRIDE + k + 8 * (lane / 16)",
            ),
        ),
        (
            "B's ldmatrix matrices 1 and 2 swapped (transposed)",
            4,
            (
                Pass::Backward,
                "(k + lane % 8 + 8 * (lane / 8 % 2)) * ZP_STRIDE + d + 8 * (lane / 16)",
                "(k + lane % 8 + 8 * (lane / 16)) * ZP_STRIDE + d + 8 * (lane / 8 % 2)",
            ),
        ),
        (
            "an accumulator element's row (dropout's index)",
            4,
            (
                Pass::Forward,
                "i = row0 + lane / 4 + 8 * r, j = key0 + t;",
                "i = row0 + lane / 4 + 8 * (1 - r), j = key0 + t;",
            ),
        ),
        (
            "an accumulator element's column",
            4,
            (
                Pass::Forward,
                "const int t = 8 * n + 2 * (lane % 4) + e % 2, i = row0",
                "const int t = 8 * n + 2 * (lane % 4) + e / 2, i = row0",
            ),
        ),
        (
            "a key row's lanes in the dK/dV kernel",
            4,
            (Pass::Backward, "j = key_row0 + lane / 4 + 8 * r;", "j = key_row0 + lane % 8 + 8 * r;"),
        ),
        (
            "the high half packed first",
            4,
            (
                Pass::Backward,
                "(unsigned)zp_bits(lo) | ((unsigned)zp_bits(hi) << 16)",
                "(unsigned)zp_bits(hi) | ((unsigned)zp_bits(lo) << 16)",
            ),
        ),
        ("the store's columns", 4, (Pass::Forward, "8 * d + 2 * (lane % 4));", "8 * d + 2 * (lane / 8));")),
        // Head dim 128 stages V's then K's rows in one buffer: without the
        // second staging the dQ kernel multiplies by V.
        ("K's rows never replacing V's", 2, (Pass::Backward, "zp_restage(k_s, k + head, key0, seq);", "")),
    ];
    check("mma", &cases, &mutated);
}
