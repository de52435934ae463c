//! The multi-tensor AdamW kernel *runs*, without a GPU: the f32-gradient
//! specialisation compiled as C++ by g++ against `tests/host/shim.h`, fed
//! the table `AdamWKernel::table` builds (its pointers are offsets into
//! one arena, which the harness turns into addresses), and compared with an
//! independent `f64` AdamW (`tests/common/adamw.rs`) at 1e-5 relative to
//! each tensor's largest magnitude. One multiprocessor caps the grid at 4
//! blocks for 8 chunks, so blocks loop over chunks of different tensors;
//! the tensors include a 1-element one, an empty one (left out of the
//! table), exact and partial chunks, with and without weight decay. An
//! overflowed step (`finite` = 0) must leave every byte as it was. Mutated
//! kernels (no bias correction, a chunk lookup off by one, one weight decay
//! for all) must fail. Without g++ the test says SKIPPED and passes.

mod common;

use std::fmt::Write;

use common::adamw::{AdamWCase, AdamWData, reference};
use common::error;
use common::host::{compile_and_run, f32_bytes, gxx_present};
use zeroplan_backend_cuda::DeviceProperties;
use zeroplan_backend_cuda::adamw::{AdamWKernel, AdamWTensor};
use zeroplan_ir::DType;

const F32_TOLERANCE: f64 = 1e-5;

/// Where each tensor's `p, g, m, v` and the four scalars lie in the arena.
struct Arena {
    bytes: Vec<u8>,
    /// Per tensor: the byte offsets of p, g, m, v.
    tensors: Vec<[usize; 4]>,
    scalars: usize,
}

fn arena(case: &AdamWCase, x: &AdamWData) -> Arena {
    let mut bytes = vec![0u8; 64]; // offset 0 would read as a null pointer
    let mut push = |values: &[f64]| {
        let at = bytes.len();
        bytes.extend(f32_bytes(values));
        bytes.resize(bytes.len().next_multiple_of(16), 0);
        at
    };
    let tensors =
        (0..case.tensors.len()).map(|t| [push(&x.p[t]), push(&x.g[t]), push(&x.m[t]), push(&x.v[t])]).collect();
    let scalars = push(&[case.lr, case.step, case.multiplier, case.finite]);
    Arena { bytes, tensors, scalars }
}

/// Case `i` as C++: its source in a namespace (with `mutation` applied) and
/// `run{i}(dir)`, which reads the arena and the table, makes the table's
/// offsets addresses, launches, and writes the arena back; and the table.
fn harness(i: usize, case: &AdamWCase, arena: &Arena, mutation: Option<(&str, &str)>) -> (String, Vec<u8>) {
    let kernel = AdamWKernel { grad: case.grad, working: None };
    let mut source = kernel.render().unwrap().source;
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
            working: None,
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
    let overflow = AdamWCase::new("an overflowed step", DType::F32, 0.0);
    let runs: Vec<(AdamWCase, Option<(&str, &str)>)> = vec![
        (step.clone(), None),
        (overflow, None),
        (AdamWCase { name: "no bias correction".into(), ..step.clone() }, Some(("(m1 / bc1)", "m1"))),
        (
            AdamWCase { name: "the chunk lookup off by one".into(), ..step.clone() },
            Some(("table[mid].first_chunk <= chunk", "table[mid].first_chunk < chunk")),
        ),
        (
            AdamWCase { name: "one weight decay for all".into(), ..step.clone() },
            Some(("(1.0 - lr * x.weight_decay)", "(1.0 - lr * 0.01)")),
        ),
    ];
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-adamw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from("#include \"shim.h\"\n");
    let mut expected = Vec::new();
    for (i, (case, mutation)) in runs.iter().enumerate() {
        let x = case.data(40 + i as u64);
        let a = arena(case, &x);
        let (code, table) = harness(i, case, &a, *mutation);
        program.push_str(&code);
        std::fs::write(dir.join(format!("{i}.arena")), &a.bytes).unwrap();
        std::fs::write(dir.join(format!("{i}.table")), table).unwrap();
        expected.push((reference(case, &x), a));
    }
    program.push_str("int main(int, char** argv) {\n  const std::string dir = argv[1];\n");
    for i in 0..runs.len() {
        let _ = writeln!(program, "  run{i}(dir);");
    }
    program.push_str("}\n");
    compile_and_run(&dir, &program);

    let mut failures = Vec::new();
    for (i, ((case, mutation), (want, a))) in runs.iter().zip(&expected).enumerate() {
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
            assert_eq!(&after[at[1]..at[1] + 4 * n], &a.bytes[at[1]..at[1] + 4 * n]);
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
