//! The multi-tensor AdamW kernel *runs*, without a GPU: specialisations for
//! f32, bf16 and f16 gradients, with and without a 16-bit working copy (on
//! the shim's host bf16/f16), compiled as C++ by g++ against
//! `tests/host/shim.h`, fed
//! the table `AdamWKernel::table` builds (its pointers are offsets into
//! one arena, which the harness turns into addresses), and compared with an
//! independent `f64` AdamW (`tests/common/adamw.rs`) at 1e-5 relative to
//! each tensor's largest magnitude; a working copy must be the new f32
//! parameter rounded to its dtype, bit for bit. One multiprocessor caps the grid at 4
//! blocks for 8 chunks, so blocks loop over chunks of different tensors;
//! the tensors include a 1-element one, an empty one (left out of the
//! table), exact and partial chunks, with and without weight decay. An
//! overflowed step (`finite` = 0) must leave every byte as it was. Mutated
//! kernels (no bias correction, a chunk lookup off by one, one weight decay
//! for all) must fail. Without g++ the test says SKIPPED and passes.

mod common;

use std::fmt::Write;

use common::adamw::{AdamWCase, AdamWData, reference};
use common::attention::round_to;
use common::host::{compile_and_run_cases, f32_bytes, gxx_present};
use common::{error, from_bytes};
use zeroplan_backend_cuda::DeviceProperties;
use zeroplan_backend_cuda::adamw::{AdamWKernel, AdamWTensor};
use zeroplan_ir::DType;

const F32_TOLERANCE: f64 = 1e-5;

/// One launch: the case, its working copy's dtype, a source edit that must fail.
struct Run {
    case: AdamWCase,
    working: Option<DType>,
    mutation: Option<(&'static str, &'static str)>,
}

/// Where each tensor's `p, g, m, v` (and working copy) and the four
/// scalars lie in the arena.
struct Arena {
    bytes: Vec<u8>,
    /// Per tensor: the byte offsets of p, g, m, v, the working copy (0: none).
    tensors: Vec<[usize; 5]>,
    scalars: usize,
}

/// `values` in `dtype`'s storage (exact: the data is rounded to it).
fn storage(dtype: DType, values: &[f64]) -> Vec<u8> {
    match dtype {
        DType::BF16 => values.iter().flat_map(|&x| zeroplan_ir::to_bf16(x).to_le_bytes()).collect(),
        DType::F16 => values.iter().flat_map(|&x| zeroplan_ir::to_f16(x).to_le_bytes()).collect(),
        _ => f32_bytes(values),
    }
}

fn arena(case: &AdamWCase, working: Option<DType>, x: &AdamWData) -> Arena {
    let mut bytes = vec![0u8; 64]; // offset 0 would read as a null pointer
    let mut push = |data: Vec<u8>| {
        let at = bytes.len();
        bytes.extend(data);
        bytes.resize(bytes.len().next_multiple_of(16), 0);
        at
    };
    let mut tensors = Vec::new();
    for (t, &(n, _)) in case.tensors.iter().enumerate() {
        let [p, g] = [push(f32_bytes(&x.p[t])), push(storage(case.grad, &x.g[t]))];
        let [m, v] = [push(f32_bytes(&x.m[t])), push(f32_bytes(&x.v[t]))];
        let w = working.map_or(0, |w| push(vec![0xFF; n * w.size_bytes() as usize]));
        tensors.push([p, g, m, v, w]);
    }
    let scalars = push(f32_bytes(&[case.lr, case.step, case.multiplier, case.finite]));
    Arena { bytes, tensors, scalars }
}

/// Case `i` as C++: its source in a namespace (with `mutation` applied) and
/// `run{i}(dir)`, which reads the arena and the table, makes the table's
/// offsets addresses, launches, and writes the arena back; and the table.
fn harness(i: usize, run: &Run, arena: &Arena) -> (String, Vec<u8>) {
    let (case, mutation) = (&run.case, run.mutation);
    let kernel = AdamWKernel { grad: case.grad, working: run.working };
    let mut source = kernel.render().unwrap().source;
    source = source.replace("#include <cuda_bf16.h>", "").replace("#include <cuda_fp16.h>", "");
    if let Some((from, to)) = mutation {
        assert!(source.contains(from), "the mutation's `{from}` is not in the source");
        source = source.replace(from, to);
    }
    // Each case's own symbol: the cases share one specialisation.
    let symbol = format!("{}_c{i}", kernel.symbol());
    source = source.replace(&format!("{}(", kernel.symbol()), &format!("{symbol}("));
    let tensors: Vec<AdamWTensor> = case
        .tensors
        .iter()
        .zip(&arena.tensors)
        .map(|(&(len, weight_decay), at)| AdamWTensor {
            param: at[0] as u64,
            grad: at[1] as u64,
            m: at[2] as u64,
            v: at[3] as u64,
            working: run.working.map(|_| at[4] as u64),
            len,
            weight_decay,
        })
        .collect();
    let table = kernel.table(&tensors).unwrap();
    let one_sm = DeviceProperties { multiprocessors: 1, ..DeviceProperties::H100_SXM };
    let (grid, block) = table.launch(&one_sm);
    assert!(grid < table.chunks as u32, "blocks loop over chunks");
    let h = case.hyper;
    let s = arena.scalars;
    let mut c = String::new();
    let _ = writeln!(c, "namespace c{i} {{\n{source}\n}}");
    let _ = writeln!(c, "static void run{i}(const std::string& dir) {{");
    let _ = writeln!(c, "  char* arena = zp_read(dir + \"/{i}.arena\", {});", arena.bytes.len());
    let _ = writeln!(c, "  char* table = zp_read(dir + \"/{i}.table\", {});", table.bytes.len());
    let _ = writeln!(c, "  unsigned long long* words = (unsigned long long*)table;");
    let _ = writeln!(
        c,
        "  for (int t = 0; t < {}; ++t) for (int w = 0; w < 5; ++w) if (words[8 * t + w]) words[8 * t + w] += (unsigned long long)arena;",
        table.tensors
    );
    let _ = writeln!(
        c,
        "  zp_launch({grid}, {block}, [&] {{ c{i}::{}((const c{i}::ZpAdamTensor*)table, {}, {}LL, (const float*)(arena + {}), (const float*)(arena + {}), (const float*)(arena + {}), (const float*)(arena + {}), {:?}, {:?}, {:?}); }});",
        symbol,
        table.tensors,
        table.chunks,
        s,
        s + 4,
        s + 8,
        s + 12,
        h.beta1,
        h.beta2,
        h.eps
    );
    let _ = writeln!(c, "  zp_write(dir + \"/{i}.after\", arena, {});", arena.bytes.len());
    let _ = writeln!(c, "}}");
    (c, table.bytes)
}

fn floats(bytes: &[u8], at: usize, n: usize) -> Vec<f64> {
    bytes[at..at + 4 * n].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
}

#[test]
fn multi_tensor_adamw_matches_the_reference_under_host_emulation() {
    if !gxx_present() {
        eprintln!("SKIPPED: no g++ to compile the emulated kernels");
        return;
    }
    let step = AdamWCase::new("f32 gradients", DType::F32, 1.0);
    let run = |case: AdamWCase, working, mutation| Run { case, working, mutation };
    let named = |name: &str| AdamWCase { name: name.into(), ..step.clone() };
    let runs = [
        run(step.clone(), None, None),
        run(AdamWCase::new("an overflowed step", DType::F32, 0.0), None, None),
        // Mixed precision on the shim's bf16/f16: 16-bit gradients, the working copy written.
        run(AdamWCase::new("bf16 gradients, bf16 working copy", DType::BF16, 1.0), Some(DType::BF16), None),
        run(AdamWCase::new("f16 gradients, f16 working copy", DType::F16, 1.0), Some(DType::F16), None),
        run(named("f32 accumulated gradients, bf16 working copy"), Some(DType::BF16), None),
        run(named("no bias correction"), None, Some(("(m1 / bc1)", "m1"))),
        run(
            named("the chunk lookup off by one"),
            None,
            Some(("table[mid].first_chunk <= chunk", "table[mid].first_chunk < chunk")),
        ),
        run(named("one weight decay for all"), None, Some(("(1.0 - lr * x.weight_decay)", "(1.0 - lr * 0.01)"))),
    ];
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-adamw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from("#include \"shim.h\"\n");
    let mut expected = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let x = r.case.data(40 + i as u64);
        let a = arena(&r.case, r.working, &x);
        let (code, table) = harness(i, r, &a);
        program.push_str(&code);
        std::fs::write(dir.join(format!("{i}.arena")), &a.bytes).unwrap();
        std::fs::write(dir.join(format!("{i}.table")), table).unwrap();
        expected.push((reference(&r.case, &x), a));
    }
    compile_and_run_cases(&dir, program, runs.len(), "-O1");

    let mut failures = Vec::new();
    for (i, (Run { case, working, mutation }, (want, a))) in runs.iter().zip(&expected).enumerate() {
        let after = std::fs::read(dir.join(format!("{i}.after"))).unwrap();
        if case.finite == 0.0 {
            assert_eq!(after, a.bytes, "an overflowed step changed the tensors");
            println!("{}: every byte unchanged", case.name);
            continue;
        }
        let mut worst = 0.0f64;
        for (t, &(n, _)) in case.tensors.iter().enumerate() {
            let at = a.tensors[t];
            for (got, w) in [
                (floats(&after, at[0], n), &want.p[t]),
                (floats(&after, at[2], n), &want.m[t]),
                (floats(&after, at[3], n), &want.v[t]),
            ] {
                worst = worst.max(error(&got, w));
            }
            // The gradient is read only.
            let g_bytes = n * case.grad.size_bytes() as usize;
            assert_eq!(&after[at[1]..at[1] + g_bytes], &a.bytes[at[1]..at[1] + g_bytes]);
            // The working copy is the new parameter rounded to its dtype.
            if let Some(w) = working {
                let got = from_bytes(&after[at[4]..at[4] + n * w.size_bytes() as usize], *w);
                let p = floats(&after, at[0], n);
                // (element, working copy, the f32 parameter) where they disagree.
                let wrong: Vec<(usize, f64, f64)> =
                    (0..n).filter(|&e| got[e] != round_to(*w, p[e])).map(|e| (e, got[e], p[e])).collect();
                assert!(
                    wrong.is_empty(),
                    "{}: tensor {t}'s working copy differs at {} elements: {:?}",
                    case.name,
                    wrong.len(),
                    &wrong[..wrong.len().min(5)]
                );
            }
        }
        println!("{}: worst error {worst:.1e}", case.name);
        match mutation {
            None if worst > F32_TOLERANCE => failures.push(format!("{}: error {worst:e}", case.name)),
            Some(_) if worst <= F32_TOLERANCE => {
                failures.push(format!("{} passed (error {worst:e}): the comparison cannot see it", case.name))
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}
