//! The routine kernels *run*, without a GPU: each instruction planned by
//! `routines::plan::plan` (the launches the CUDA device queues), its sources
//! compiled as C++ by g++ against `tests/host/shim.h` and run on an arena of
//! random operands (never zero), the outputs poisoned (0xFF: NaN, or −1)
//! before; then compared with the host runtime's routine
//! (`zeroplan_backend_cpu::device::exec::run_routine`) on the same arena.
//! Copies, gathers, fills, the embedding's scatter-add (whose f64 sums run
//! in the host's order), broadcasts, sums (f64 sums of these operands are
//! exact in any order), casts and the optimizer's scalars must match byte
//! for byte; the cross-entropy at
//! 1e-5 relative (f32), its gradient at 1e-5 (f32), 1e-2 (bf16), 2e-3 (f16)
//! of the output's largest magnitude. Every byte outside the outputs must be
//! as it was. Shapes are odd, rows misaligned, dtypes every storage type
//! the host routine takes; the grid is capped at one multiprocessor's 8
//! blocks, so blocks loop. Mutated kernels (a tile read transposed, the
//! maximum not subtracted from large logits, ignored rows counted, every
//! position the head of its own list, a subtraction's operands swapped, a
//! four-wide load's first element repeated, a sum's first chunk dropped,
//! a float saturated into i32 where the host wraps its i64, a loss scale's
//! count not advanced) must fail. Without g++ the test
//! says SKIPPED and passes.

mod common;

use std::fmt::Write;

use common::host::{compile_and_run_cases, gxx_present};
use common::routines::{Case, Random, cases, compare, mutations, reference};
use zeroplan_backend_cuda::DeviceProperties;
use zeroplan_backend_cuda::routines::Routine;
use zeroplan_backend_cuda::routines::plan::{Arg, Op, plan};
use zeroplan_exec::Buf;

/// An `f64` as a C++ expression with exactly its bits.
fn f64_literal(x: f64) -> String {
    format!("__longlong_as_double(0x{:016x}LL)", x.to_bits())
}

fn dims(values: &[i64]) -> String {
    format!("{{{}}}", values.iter().map(|v| format!("{v}LL")).collect::<Vec<_>>().join(", "))
}

/// Case `i` as C++: each of its routines' sources in a namespace of its own
/// (symbols renamed per case, `mutation` applied), and `run{i}(dir)`, which
/// reads the arena, queues the plan's launches and writes the arena back.
fn harness(i: usize, case: &Case, device: &DeviceProperties) -> String {
    let planned =
        plan(&case.instr, &|b: &Buf| b.offset as u64, device).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let mut routines: Vec<Routine> = Vec::new();
    for op in &planned.ops {
        if let Op::Launch(l) = op
            && !routines.contains(&l.routine)
        {
            routines.push(l.routine);
        }
    }
    let mut c = String::new();
    let mut mutated = false;
    for (k, routine) in routines.iter().enumerate() {
        let rendered = routine.render().unwrap();
        let mut source = rendered.source.replace("#include <cuda_bf16.h>", "").replace("#include <cuda_fp16.h>", "");
        if let Some((from, to)) = case.mutation
            && source.contains(from)
        {
            source = source.replace(from, to);
            mutated = true;
        }
        let symbol = routine.symbol();
        source = source.replace(&symbol, &format!("{symbol}_c{i}"));
        let _ = writeln!(c, "namespace c{i}_{k} {{\n{source}\n}}");
    }
    assert!(case.mutation.is_none() || mutated, "{}: the mutation's text is in no source", case.name);
    let _ = writeln!(c, "static void run{i}(const std::string& dir) {{");
    let _ = writeln!(c, "  char* arena = zp_read(dir + \"/{i}.arena\", {});", case.arena.len());
    let _ = writeln!(c, "  char* scratch = zp_alloc({});", planned.scratch_bytes.max(1));
    for op in &planned.ops {
        match op {
            Op::Memcpy { from, to, bytes } => {
                let _ = writeln!(c, "  std::memcpy(arena + {to}, arena + {from}, {bytes});");
            }
            Op::Launch(l) => {
                let k = routines.iter().position(|r| *r == l.routine).unwrap();
                let ns = format!("c{i}_{k}");
                let suffix = l.routine.kernels()[l.kernel];
                let entry = if suffix.is_empty() {
                    format!("{}_c{i}", l.routine.symbol())
                } else {
                    format!("{}_c{i}_{suffix}", l.routine.symbol())
                };
                let args: Vec<String> = l
                    .args
                    .iter()
                    .map(|a| match a {
                        Arg::Ptr(at) => format!("ZpAddr{{arena + {at}}}"),
                        Arg::Scratch(at) => format!("ZpAddr{{scratch + {at}}}"),
                        Arg::U64(v) => format!("{v}ULL"),
                        Arg::I64(v) => format!("{v}LL"),
                        Arg::F64(v) => f64_literal(*v),
                        Arg::Strided(d) => format!(
                            "{ns}::ZpStrided{{{}, {}, {}, {}LL, {}, 0}}",
                            dims(&d.size),
                            dims(&d.src),
                            dims(&d.dst),
                            d.count,
                            d.rank
                        ),
                        Arg::Tiled(d) => format!(
                            "{ns}::ZpTiled{{{}LL, {}LL, {}LL, {}LL, {}LL, {}, {}, {}, {}, 0}}",
                            d.rows,
                            d.cols,
                            d.src_row,
                            d.dst_col,
                            d.batches,
                            dims(&d.size),
                            dims(&d.src),
                            dims(&d.dst),
                            d.rank
                        ),
                        Arg::Slopes(m) => format!(
                            "{ns}::ZpSlopes{{{{{}}}}}",
                            m.m.iter()
                                .map(|x| format!("__int_as_float(0x{:08x}u)", x.to_bits()))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })
                    .collect();
                let _ = writeln!(c, "  zp_launch({}, 256, [&] {{ {ns}::{entry}({}); }});", l.grid, args.join(", "));
            }
        }
    }
    let _ = writeln!(c, "  zp_write(dir + \"/{i}.after\", arena, {});", case.arena.len());
    let _ = writeln!(c, "}}");
    c
}

#[test]
fn routine_kernels_match_the_host_routines_under_host_emulation() {
    if !gxx_present() {
        eprintln!("SKIPPED: no g++ to compile the emulated kernels");
        return;
    }
    let mut cases = cases();
    cases.extend(mutations(&mut Random(7)));
    let device = DeviceProperties { multiprocessors: 1, ..DeviceProperties::H100_SXM };
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-routines-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from(
        "#include \"shim.h\"\n// Any pointer from an arena address.\nstruct ZpAddr { char* p; template <class T> operator T*() const { return (T*)p; } };\n",
    );
    for (i, case) in cases.iter().enumerate() {
        program.push_str(&harness(i, case, &device));
        std::fs::write(dir.join(format!("{i}.arena")), &case.arena).unwrap();
    }
    compile_and_run_cases(&dir, program, cases.len(), "-O1");

    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let got = std::fs::read(dir.join(format!("{i}.after"))).unwrap();
        let wrong = compare(case, &got, &reference(case));
        println!("{}: {}", case.name, wrong.as_deref().unwrap_or("matches"));
        match (case.mutation, wrong) {
            (None, Some(why)) => failures.push(format!("{}: {why}", case.name)),
            (Some(_), None) => failures.push(format!("{} passed: the comparison cannot see it", case.name)),
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), cases.len(), failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}
