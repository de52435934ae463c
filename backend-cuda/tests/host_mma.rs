//! The g++ emulation of the tensor-core instructions (`tests/host/shim.h`:
//! `mma.sync` m16n8k16 and `ldmatrix` .x4, lane by lane from the PTX ISA's
//! fragment layouts) agrees with a plain matrix product: one warp loads a
//! 16×16 A and a 16×16 B from "shared memory" with `ldmatrix` the way the
//! attention kernels do (B both from Bᵀ's rows and, `.trans`, from B's; A
//! also packed by hand, as the kernels pack their weights) and multiplies
//! them with `mma`. The two instructions are transcribed from two
//! sections of the ISA, so their agreement checks each against the other;
//! small integers make every product and sum exact, so the check is
//! equality. Each deliberately wrong mapping in a copy of the shim (a
//! fragment row, a column, the register order, the half order, `.trans`)
//! must fail it: the shim and its mutants are built as one program, each
//! copy in a namespace of its own (one g++ run). Without g++ the test says
//! SKIPPED and passes.

mod common;

use std::fmt::Write;
use std::path::Path;

use common::Rng;
use common::host::{compile_and_run, gxx_present, read_f32};

/// One variant's warp program, in the namespace of its copy of the shim:
/// A (row-major), Bᵀ (row-major, n×k) and B (row-major, k×n) staged in
/// 16-byte-aligned static arrays; D = A·B by `ldmatrix` + `mma` three times
/// (B from Bᵀ; B from B with `.trans`; that again with A's fragment packed
/// by hand, as the kernels pack P), written as `{dir}/{n}.d` (3 × 256 floats).
const VARIANT: &str = r#"
alignas(16) static unsigned short a_s[16 * 16], bt_s[16 * 16], b_s[16 * 16];
static float d[3][256];
static void product() {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  unsigned af[4];
  zp_ldmatrix_x4(af, a_s + (lane % 16) * 16 + 8 * (lane / 16));
  unsigned bf[4], bt[4];
  zp_ldmatrix_x4(bf, bt_s + (lane % 8 + 8 * (lane / 16)) * 16 + 8 * (lane / 8 % 2));
  zp_ldmatrix_x4_trans(bt, b_s + (lane % 8 + 8 * (lane / 8 % 2)) * 16 + 8 * (lane / 16));
  // A packed by hand as the ISA lays it out (the attention kernels' P·V
  // operand): rows g, g + 8, columns 2t, 2t + 1 (low half first), then + 8.
  const unsigned short* lo = a_s + g * 16 + 2 * t;
  const unsigned short* hi = lo + 8 * 16;
  const unsigned ap[4] = {lo[0] | (unsigned)lo[1] << 16, hi[0] | (unsigned)hi[1] << 16,
                          lo[8] | (unsigned)lo[9] << 16, hi[8] | (unsigned)hi[9] << 16};
  float acc[3][2][4] = {};
  for (int n = 0; n < 2; ++n) {
    zp_mma_m16n8k16_bf16(acc[0][n], af, bf[2 * n], bf[2 * n + 1]);
    zp_mma_m16n8k16_bf16(acc[1][n], af, bt[2 * n], bt[2 * n + 1]);
    zp_mma_m16n8k16_bf16(acc[2][n], ap, bt[2 * n], bt[2 * n + 1]);
  }
  for (int v = 0; v < 3; ++v) {
    for (int n = 0; n < 2; ++n) {
      for (int i = 0; i < 4; ++i) d[v][(g + 8 * (i / 2)) * 16 + 8 * n + 2 * t + i % 2] = acc[v][n][i];
    }
  }
}
static void run(const std::string& dir, int n) {
  std::memcpy(a_s, zp_read(dir + "/a", 512), 512);
  std::memcpy(bt_s, zp_read(dir + "/bt", 512), 512);
  std::memcpy(b_s, zp_read(dir + "/b", 512), 512);
  zp_launch(1, 32, product);
  zp_write(dir + "/" + std::to_string(n) + ".d", (const char*)d, sizeof d);
}
"#;

/// Small integers as bf16 bits: exact, and exactly summed in f32.
fn bf16_bits(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|&x| zeroplan_ir::to_bf16(x).to_le_bytes()).collect()
}

/// Runs [`VARIANT`] against each of `shims` (the real one, then mutated
/// copies) in one program; per shim, the products it computed: from Bᵀ's
/// rows, from B's rows with `.trans`, and that with A packed by hand.
fn run(dir: &Path, shims: &[String], a: &[f64], b: &[f64]) -> Vec<[Vec<f64>; 3]> {
    let bt: Vec<f64> = (0..256).map(|x| b[(x % 16) * 16 + x / 16]).collect();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("a"), bf16_bits(a)).unwrap();
    std::fs::write(dir.join("bt"), bf16_bits(&bt)).unwrap();
    std::fs::write(dir.join("b"), bf16_bits(b)).unwrap();
    // The standard headers first, at global scope, so each copy's own
    // includes of them are no-ops inside its namespace.
    let mut program: String =
        shims[0].lines().filter(|l| l.starts_with("#include <")).map(|l| format!("{l}\n")).collect();
    for (n, shim) in shims.iter().enumerate() {
        std::fs::write(dir.join(format!("shim{n}.h")), shim).unwrap();
        let _ = writeln!(program, "namespace v{n} {{\n#include \"shim{n}.h\"\n{VARIANT}}}");
    }
    program.push_str("int main(int, char** argv) {\n");
    for n in 0..shims.len() {
        let _ = writeln!(program, "  v{n}::run(argv[1], {n});");
    }
    program.push_str("}\n");
    compile_and_run(dir, &program, "-O0");
    (0..shims.len())
        .map(|n| {
            let d = read_f32(&dir.join(format!("{n}.d")));
            [0, 1, 2].map(|v| d[256 * v..256 * (v + 1)].to_vec())
        })
        .collect()
}

#[test]
fn tensor_core_emulation_matches_a_plain_product() {
    if !gxx_present() {
        eprintln!("SKIPPED: no g++ to compile the emulated instructions");
        return;
    }
    let mut rng = Rng::new(29);
    let mut small = || (rng.next() % 17) as f64 - 8.0;
    let a: Vec<f64> = (0..256).map(|_| small()).collect();
    let b: Vec<f64> = (0..256).map(|_| small()).collect();
    let want: Vec<f64> =
        (0..256).map(|x| (0..16).map(|k| a[(x / 16) * 16 + k] * b[k * 16 + x % 16]).sum::<f64>()).collect();
    let shim = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/host/shim.h")).unwrap();

    // (what, from, to): each a wrong reading of the ISA's layouts.
    let mutations = [
        (
            "A's row for a4, a5 taken as groupID + 8",
            "(i < 2 || (4 <= i && i < 6)) ? group : group + 8",
            "(i < 4) ? group : group + 8",
        ),
        ("A's column + 8 from a2 on", "(i & 1) + (i >= 4 ? 8 : 0);", "(i & 1) + (i >= 2 ? 8 : 0);"),
        ("B's row + 8 in the first register", "(i & 1) + (i >= 2 ? 8 : 0);", "(i & 1) + (i >= 2 ? 0 : 8);"),
        ("C's second row from c1 on", "i < 2 ? group : group + 8, col", "i < 1 ? group : group + 8, col"),
        (
            "ldmatrix rows across lanes rather than groups",
            "i = lane / 4, j = 2 * (lane % 4) + h;",
            "i = lane % 8, j = 2 * (lane / 8) + h;",
        ),
        (
            "ldmatrix's matrices four lanes apart",
            "lanes[warp0 + 8 * m + stored_row]",
            "lanes[warp0 + 4 * m + stored_row]",
        ),
        ("ldmatrix's .trans ignored", "stored_row = trans ? j : i", "stored_row = i"),
        ("the high half first", "(unsigned)e[0] | ((unsigned)e[1] << 16)", "(unsigned)e[1] | ((unsigned)e[0] << 16)"),
    ];
    let mut shims = vec![shim.clone()];
    for (_, from, to) in &mutations {
        assert!(shim.contains(from), "the mutation's `{from}` is not in the shim");
        shims.push(shim.replacen(from, to, 1));
    }
    let dir = std::env::temp_dir().join(format!("zeroplan-cuda-mma-{}", std::process::id()));
    let results = run(&dir, &shims, &a, &b);

    let [rows, trans, packed] = &results[0];
    assert_eq!(*rows, want, "ldmatrix + mma from Bᵀ's rows");
    assert_eq!(*trans, want, "ldmatrix.trans + mma from B's rows");
    assert_eq!(*packed, want, "A packed by hand, ldmatrix.trans + mma");
    let unseen: Vec<&str> = mutations
        .iter()
        .zip(&results[1..])
        .filter(|(_, products)| products.iter().all(|d| *d == want))
        .map(|((what, _, _), _)| *what)
        .collect();
    assert!(unseen.is_empty(), "wrong layouts the product does not see: {unseen:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
