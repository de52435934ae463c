//! Kernel IR → Cranelift IR → native code.
//!
//! One function per (kernel, dims), with every size a constant:
//!
//! ```text
//! extern "C" fn(inputs: *const *const u8, outputs: *const *mut u8,
//!               partials: *const *mut f64, row_begin: i64, row_end: i64,
//!               seed: u64, offset: u64)
//!
//! uniform expressions, once, in f64          // constants, scalar inputs, β^t
//! for row in row_begin..row_end {
//!     row pointers of every operand           // from the row's coordinates
//!     for sweep in 0..reduction_sweeps {      // the reductions this sweep can compute
//!         per-row values they need            // per-row inputs, earlier reductions
//!         for 2×4 columns at a time, then the tail one by one:
//!             acc ⊕= operand                   // f32x4 partials (sum) or NaN-propagating max
//!     }
//!     for 2×4 columns at a time, then the tail: // the store sweep
//!         compute every stored value, then
//!         full output:      out[col..] = round(value)
//!         cross-row output: partial[..] += (f64) value
//! }
//! ```
//!
//! Element expressions are recomputed in each sweep that needs them (cheap
//! next to the memory traffic they would otherwise cost), and nothing is
//! stored before the last sweep; within the last sweep a pair of four-column
//! groups is read completely before any of it is written. So an output may
//! alias an input of its shape and dtype (in-place).
//!
//! Cross-row outputs are summed in `f64` into the caller's per-chunk
//! `partials` (zeroed; see `launch.rs`): per column with `f64x2` adds when the
//! output runs along the row, else in row-local `f64` accumulators added to
//! the partial once per row.

use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, F64X2, I32, I32X4, I64};
use cranelift_codegen::ir::{AbiParam, FuncRef, InstBuilder, StackSlot, StackSlotData, StackSlotKind, Value};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use zeroplan_ir::kernel::layout::{Class, Layout};
use zeroplan_ir::kernel::{Binary, Expr, ExprId, Kernel, Unary};

use super::dropout::{self, PhiloxKey};
use super::libcalls::LibCall;
use super::math;
use super::simd::{self, LANES, mem, splat};
use super::storage::{self, Lanes};

/// The generated entry point; see the module docs.
pub(crate) type Entry = unsafe extern "C" fn(*const *const u8, *const *mut u8, *const *mut f64, i64, i64, u64, u64);

/// Compiles `kernel` laid out as `layout` into a fresh JIT module; the
/// module owns the code `Entry` points into.
pub(crate) fn generate(kernel: &Kernel, layout: &Layout) -> Result<(JITModule, Entry), String> {
    let isa = kernel_isa()?;
    let call_conv = isa.default_call_conv();
    let mut jit = JITBuilder::with_isa(isa, default_libcall_names());
    for h in LibCall::all() {
        if let Some(address) = h.address() {
            jit.symbol(h.symbol(), address);
        }
    }
    let mut module = JITModule::new(jit);
    let mut libcalls = HashMap::new();
    for h in LibCall::all() {
        let (arity, f32_args) = h.signature();
        let ty = if f32_args { F32 } else { F64 };
        let mut sig = module.make_signature();
        sig.call_conv = call_conv;
        sig.params.extend((0..arity).map(|_| AbiParam::new(ty)));
        sig.returns.push(AbiParam::new(ty));
        let id = module.declare_function(&h.symbol(), Linkage::Import, &sig).map_err(|e| e.to_string())?;
        libcalls.insert(h.symbol(), id);
    }

    let frontend = module.target_config();
    let ptr = frontend.pointer_type();
    if ptr != I64 {
        return Err(format!("the CPU backend needs a 64-bit host, not {ptr}-pointers"));
    }
    let mut ctx = module.make_context();
    ctx.func.signature.call_conv = call_conv;
    for ty in [ptr, ptr, ptr, I64, I64, I64, I64] {
        ctx.func.signature.params.push(AbiParam::new(ty));
    }
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let mut cg = Gen {
            kernel,
            layout,
            module: &mut module,
            libcalls: &libcalls,
            refs: HashMap::new(),
            in_base: Vec::new(),
            out_base: Vec::new(),
            uniform: HashMap::new(),
            key: None,
            sweep: 0,
            kept: HashMap::new(),
            coords: Vec::new(),
            masks: HashMap::new(),
        };
        cg.function(&mut b);
        b.seal_all_blocks();
        b.finalize(frontend);
    }
    let id = module
        .declare_function(&format!("zeroplan_kernel_{}", sanitise(&kernel.name)), Linkage::Local, &ctx.func.signature)
        .map_err(|e| e.to_string())?;
    // `ZEROPLAN_DUMP_ASM=1` prints each kernel's machine code (for tuning).
    let dump = std::env::var_os("ZEROPLAN_DUMP_ASM").is_some();
    ctx.set_disasm(dump);
    module.define_function(id, &mut ctx).map_err(|e| format!("{e:?}"))?;
    if let Some(code) = ctx.compiled_code().filter(|_| dump) {
        eprintln!("; kernel {}\n{}", kernel.name, code.vcode.as_deref().unwrap_or("(no disassembly)"));
    }
    module.clear_context(&mut ctx);
    module.finalize_definitions().map_err(|e| e.to_string())?;
    let code = module.get_finalized_function(id);
    // SAFETY: `code` was generated with exactly `Entry`'s signature in the
    // host's default (C) calling convention.
    let entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
    Ok((module, entry))
}

/// The host ISA with Cranelift's mid-end optimiser off. The generator
/// already places every value at its loop level (uniform values at entry,
/// per-row values before the column loops) and shares common
/// subexpressions; at `opt_level=speed` the e-graph pass re-places pure
/// values at their uses, *inside* the column loops (row pointers, reduction
/// totals, constants), which measured slower.
fn kernel_isa() -> Result<cranelift_codegen::isa::OwnedTargetIsa, String> {
    use cranelift_codegen::settings::{self, Configurable};
    let mut flags = settings::builder();
    flags.set("opt_level", "none").map_err(|e| e.to_string())?;
    let isa = cranelift_native::builder().map_err(|e| e.to_string())?;
    isa.finish(settings::Flags::new(flags)).map_err(|e| e.to_string())
}

/// A symbol-safe form of a kernel name.
fn sanitise(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// `for i in (begin..end).step_by(step) { body(i) }` with `i64` bounds,
/// leaving the builder after the loop.
fn for_range(
    b: &mut FunctionBuilder,
    begin: Value,
    end: Value,
    step: i64,
    mut body: impl FnMut(&mut FunctionBuilder, Value),
) {
    let var = b.declare_var(I64);
    b.def_var(var, begin);
    let (header, block, exit) = (b.create_block(), b.create_block(), b.create_block());
    b.ins().jump(header, &[]);
    b.switch_to_block(header);
    let i = b.use_var(var);
    let more = b.ins().icmp(IntCC::SignedLessThan, i, end);
    b.ins().brif(more, block, &[], exit, &[]);
    b.switch_to_block(block);
    body(b, i);
    let next = b.ins().iadd_imm_s(i, step);
    b.def_var(var, next);
    b.ins().jump(header, &[]);
    b.switch_to_block(exit);
}

/// Code generation state for one kernel function.
struct Gen<'a> {
    kernel: &'a Kernel,
    layout: &'a Layout,
    module: &'a mut JITModule,
    libcalls: &'a HashMap<String, FuncId>,
    refs: HashMap<String, FuncRef>,
    /// Base pointers of inputs and outputs (partials for cross-row outputs).
    in_base: Vec<Value>,
    out_base: Vec<Value>,
    /// Uniform expressions, splat to `f32x4`.
    uniform: HashMap<ExprId, Value>,
    key: Option<PhiloxKey>,
    /// The sweep being generated (`layout.reduction_sweeps` is the store sweep).
    sweep: usize,
    /// Expensive element values kept for later sweeps: the sweep that
    /// computes them and the row-sized stack buffer they are kept in.
    kept: HashMap<ExprId, (usize, StackSlot)>,
    /// The current row's coordinates along the outer axes (`i64` variables).
    coords: Vec<Variable>,
    /// The lane mask behind each 1.0/0.0 flag a comparison or dropout made,
    /// so a `select` on it needs no compare against zero.
    masks: HashMap<Value, Value>,
}

/// The most stack a kernel's kept values may take (rayon's worker threads
/// have 2 MiB stacks).
const KEPT_BYTES: usize = 64 << 10;

/// What is fixed for one row.
struct Row {
    /// Row pointers of inputs and outputs.
    inputs: Vec<Value>,
    outputs: Vec<Value>,
    /// Row- and launch-constant values, splat.
    values: HashMap<ExprId, Value>,
    /// The row's first element index (`i64`), for dropout.
    first_element: Value,
    /// ALiBi: the head's slope (splat) and the query position (`i32x4` splat).
    alibi: Option<(Value, Value)>,
}

/// One group of columns inside a sweep.
#[derive(Clone, Copy)]
struct Cols {
    /// The first column (`i64`).
    col: Value,
    lanes: Lanes,
}

/// How a reduction combines.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduce {
    Sum,
    Max,
}

impl Reduce {
    fn combine(self, b: &mut FunctionBuilder, x: Value, y: Value) -> Value {
        match self {
            Reduce::Sum => b.ins().fadd(x, y),
            // `fmax` propagates NaN, as ReduceMax must.
            Reduce::Max => b.ins().fmax(x, y),
        }
    }
    fn identity(self) -> f32 {
        match self {
            Reduce::Sum => -0.0,
            Reduce::Max => f32::NEG_INFINITY,
        }
    }
}

impl Gen<'_> {
    fn libcall(&mut self, b: &mut FunctionBuilder, h: LibCall, args: &[Value]) -> Value {
        let symbol = h.symbol();
        let fref = match self.refs.get(&symbol) {
            Some(&r) => r,
            None => {
                let r = self.module.declare_func_in_func(self.libcalls[&symbol], b.func);
                self.refs.insert(symbol, r);
                r
            }
        };
        let call = b.ins().call(fref, args);
        b.inst_results(call)[0]
    }

    fn function(&mut self, b: &mut FunctionBuilder) {
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let (ins, outs, partials, row_begin, row_end, seed, offset) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
        let ptr_ty = b.func.dfg.value_type(ins);
        let word = ptr_ty.bytes() as i32;
        self.in_base =
            (0..self.layout.inputs.len()).map(|k| b.ins().load(ptr_ty, mem(), ins, word * k as i32)).collect();
        self.out_base = self
            .layout
            .outputs
            .iter()
            .enumerate()
            .map(|(k, o)| b.ins().load(ptr_ty, mem(), if o.cross_row { partials } else { outs }, word * k as i32))
            .collect();
        if self.kernel.body.iter().any(|e| matches!(e, Expr::Keep { .. })) {
            let k0 = b.ins().ireduce(I32, seed);
            let hi = b.ins().ushr_imm_s(seed, 32);
            let k1 = b.ins().ireduce(I32, hi);
            let offset = b.ins().ireduce(I32, offset);
            self.key = Some(PhiloxKey { k0, k1, offset });
        }
        self.uniforms(b);
        self.plan_kept(b);
        // No rows (a zero dimension): nothing to run, and no division by a zero size.
        if self.layout.rows > 0 {
            // The first row's coordinates, by division (once per call).
            let shape = &self.layout.shape;
            let mut inner = 1usize;
            let mut coords = Vec::new();
            for a in (0..shape.len() - 1).rev() {
                let q = if inner == 1 { row_begin } else { b.ins().udiv_imm_s(row_begin, inner as i64) };
                let c = b.ins().urem_imm_s(q, shape[a] as i64);
                let var = b.declare_var(I64);
                b.def_var(var, c);
                coords.push(var);
                inner *= shape[a];
            }
            coords.reverse();
            self.coords = coords;
            for_range(b, row_begin, row_end, 1, |b, row| self.row(b, row));
        }
        b.ins().return_(&[]);
    }

    /// Every uniform expression in `f64`, rounded to `f32` and splat.
    fn uniforms(&mut self, b: &mut FunctionBuilder) {
        let mut scalar: HashMap<ExprId, Value> = HashMap::new();
        for (i, e) in self.kernel.body.iter().enumerate() {
            if self.layout.class[i] != Class::Uniform {
                continue;
            }
            let arg = |id: ExprId| scalar[&id];
            let v = match *e {
                Expr::Load(k) => storage::load_f64(b, self.layout.inputs[k as usize].dtype, self.in_base[k as usize]),
                Expr::Const(c) => b.ins().f64const(c),
                Expr::RowLen => b.ins().f64const(self.layout.width as f64),
                Expr::Unary(u, a) => {
                    let x = arg(a);
                    match u {
                        Unary::Neg => b.ins().fneg(x),
                        Unary::Sqrt => b.ins().sqrt(x),
                        Unary::Rsqrt | Unary::Recip => {
                            let d = if u == Unary::Rsqrt { b.ins().sqrt(x) } else { x };
                            let one = b.ins().f64const(1.0);
                            b.ins().fdiv(one, d)
                        }
                        _ => {
                            let h = LibCall::for_unary(u).expect("the other unary functions have libcalls");
                            self.libcall(b, h, &[x])
                        }
                    }
                }
                Expr::Binary(op, x, y) => {
                    let (x, y) = (arg(x), arg(y));
                    match op {
                        Binary::Add => b.ins().fadd(x, y),
                        Binary::Sub => b.ins().fsub(x, y),
                        Binary::Mul => b.ins().fmul(x, y),
                        Binary::Div => b.ins().fdiv(x, y),
                        Binary::Pow => self.libcall(b, LibCall::PowF64, &[x, y]),
                        Binary::Max | Binary::Min => {
                            let m = if op == Binary::Max { b.ins().fmax(x, y) } else { b.ins().fmin(x, y) };
                            // Rust's max/min ignore a NaN operand.
                            let x_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
                            let m = b.ins().select(x_nan, y, m);
                            let y_nan = b.ins().fcmp(FloatCC::Unordered, y, y);
                            b.ins().select(y_nan, x, m)
                        }
                        Binary::Lt | Binary::Gt | Binary::Eq => {
                            let cc = compare(op);
                            let c = b.ins().fcmp(cc, x, y);
                            let (one, zero) = (b.ins().f64const(1.0), b.ins().f64const(0.0));
                            b.ins().select(c, one, zero)
                        }
                    }
                }
                Expr::Select(c, x, y) => {
                    let zero = b.ins().f64const(0.0);
                    // Unordered-or-not-equal: a NaN condition takes `x`, as `NaN != 0.0` does.
                    let nz = b.ins().fcmp(FloatCC::NotEqual, arg(c), zero);
                    b.ins().select(nz, arg(x), arg(y))
                }
                Expr::Keep { .. } | Expr::AlibiPenalty | Expr::ReduceSum(_) | Expr::ReduceMax(_) => {
                    unreachable!("never uniform")
                }
            };
            scalar.insert(i as ExprId, v);
            let narrow = b.ins().fdemote(F32, v);
            let splat = b.ins().splat(F32X4, narrow);
            self.uniform.insert(i as ExprId, splat);
        }
    }

    /// One row: its pointers, the reduction sweeps, the store sweep.
    fn row(&mut self, b: &mut FunctionBuilder, row: Value) {
        let layout = self.layout;
        let rank = layout.shape.len();
        // The row's coordinates along the outer axes (kept in variables and
        // stepped once per row: a division per axis per row costs more than
        // the row's arithmetic on short rows).
        let coords: Vec<Value> = self.coords.iter().map(|&v| b.use_var(v)).collect();
        let row_ptr = |b: &mut FunctionBuilder, base: Value, strides: &[usize], bytes: usize| {
            let mut p = base;
            for (a, &c) in coords.iter().enumerate() {
                if strides[a] != 0 {
                    let off = b.ins().imul_imm_s(c, (strides[a] * bytes) as i64);
                    p = b.ins().iadd(p, off);
                }
            }
            p
        };
        let inputs = layout
            .inputs
            .iter()
            .zip(&self.in_base)
            .map(|(a, &base)| row_ptr(b, base, &a.strides, a.dtype.size_bytes() as usize))
            .collect();
        let outputs = layout
            .outputs
            .iter()
            .zip(&self.out_base)
            .map(|(a, &base)| row_ptr(b, base, &a.strides, if a.cross_row { 8 } else { a.dtype.size_bytes() as usize }))
            .collect();
        let first_element = b.ins().imul_imm_s(row, layout.width as i64);
        let alibi = self.kernel.body.contains(&Expr::AlibiPenalty).then(|| {
            // `Kernel::check` makes an ALiBi kernel rank 4: [B, H, Sq, Sk].
            let (head, query) = (coords[1], coords[2]);
            let slopes = zeroplan_ir::interp::alibi_slopes(layout.shape[1]);
            let mut slope = b.ins().f32const(slopes.last().copied().unwrap_or(0.0) as f32);
            for (h, &m) in slopes.iter().enumerate().rev().skip(1) {
                let is_h = b.ins().icmp_imm_s(IntCC::Equal, head, h as i64);
                let m = b.ins().f32const(m as f32);
                slope = b.ins().select(is_h, m, slope);
            }
            let slope = b.ins().splat(F32X4, slope);
            let q = b.ins().ireduce(I32, query);
            let q = b.ins().splat(I32X4, q);
            (slope, q)
        });
        let mut r = Row { inputs, outputs, values: self.uniform.clone(), first_element, alibi };

        for sweep in 0..layout.reduction_sweeps {
            self.sweep = sweep;
            let reductions: Vec<(ExprId, ExprId, Reduce)> = self
                .kernel
                .body
                .iter()
                .enumerate()
                .filter(|&(i, _)| layout.level[i] == sweep + 1)
                .filter_map(|(i, e)| match *e {
                    Expr::ReduceSum(a) => Some((i as ExprId, a, Reduce::Sum)),
                    Expr::ReduceMax(a) => Some((i as ExprId, a, Reduce::Max)),
                    _ => None,
                })
                .collect();
            let operands: Vec<ExprId> = reductions.iter().map(|&(_, a, _)| a).collect();
            self.row_values(b, &mut r, &operands);
            // Per reduction: the f32x4 accumulator, the tail's scalar one, and
            // (max) the lanes that saw a NaN. The vector max is a compare and
            // select (NaN never wins it) plus that NaN mask: four instructions
            // where Cranelift's NaN-propagating `fmax` takes eight.
            let accs: Vec<(Variable, Variable, Variable)> = reductions
                .iter()
                .map(|&(_, _, op)| {
                    let (v, s, nan) = (b.declare_var(F32X4), b.declare_var(F32), b.declare_var(I32X4));
                    let init = b.ins().f32const(op.identity());
                    let init_v = b.ins().splat(F32X4, init);
                    let no_nan = simd::splat_i(b, 0);
                    b.def_var(v, init_v);
                    b.def_var(s, init);
                    b.def_var(nan, no_nan);
                    (v, s, nan)
                })
                .collect();
            let order = self.post_order(&operands);
            self.column_groups(b, |cg, b, group| {
                // The groups' operands interleaved (see `store_sweep`), then
                // accumulated group after group: the same additions, in the
                // same column order, as one group at a time.
                let mut memos = vec![HashMap::new(); group.len()];
                for &id in &order {
                    for (cols, memo) in group.iter().zip(&mut memos) {
                        cg.element(b, &r, *cols, memo, id);
                    }
                }
                for (&cols, memo) in group.iter().zip(&mut memos) {
                    for (&(_, a, op), &(acc_v, acc_s, acc_nan)) in reductions.iter().zip(&accs) {
                        let x = cg.element(b, &r, cols, memo, a);
                        if cols.lanes == Lanes::Four {
                            let acc = b.use_var(acc_v);
                            let next = match op {
                                Reduce::Sum => b.ins().fadd(acc, x),
                                Reduce::Max => {
                                    let bigger = simd::fcmp(b, FloatCC::GreaterThan, x, acc);
                                    let is_nan = simd::fcmp(b, FloatCC::Unordered, x, x);
                                    let seen = b.use_var(acc_nan);
                                    let seen = b.ins().bor(seen, is_nan);
                                    b.def_var(acc_nan, seen);
                                    simd::select(b, bigger, x, acc)
                                }
                            };
                            b.def_var(acc_v, next);
                        } else {
                            let acc = b.use_var(acc_s);
                            let x = simd::lane(b, x, 0);
                            let next = op.combine(b, acc, x);
                            b.def_var(acc_s, next);
                        }
                    }
                }
            });
            let (vectors, tail) = self.column_split();
            for (&(id, _, op), &(acc_v, acc_s, acc_nan)) in reductions.iter().zip(&accs) {
                let total = match (vectors > 0, tail > 0) {
                    (true, false) => {
                        let v = b.use_var(acc_v);
                        simd::horizontal(b, v, |b, x, y| op.combine(b, x, y))
                    }
                    (false, _) => b.use_var(acc_s),
                    (true, true) => {
                        let v = b.use_var(acc_v);
                        let h = simd::horizontal(b, v, |b, x, y| op.combine(b, x, y));
                        let s = b.use_var(acc_s);
                        op.combine(b, h, s)
                    }
                };
                let total = if op == Reduce::Max && vectors > 0 {
                    let seen = b.use_var(acc_nan);
                    let any = b.ins().vany_true(seen);
                    let nan = b.ins().f32const(f32::NAN);
                    b.ins().select(any, nan, total)
                } else {
                    total
                };
                let total = b.ins().splat(F32X4, total);
                r.values.insert(id, total);
            }
        }
        self.sweep = layout.reduction_sweeps;
        self.store_sweep(b, &mut r);
        // The next row's coordinates: the last outer axis steps, carrying.
        let mut carry = b.ins().iconst(I64, 1);
        for a in (0..rank - 1).rev() {
            let next = b.ins().iadd(coords[a], carry);
            let wraps = b.ins().icmp_imm_s(IntCC::Equal, next, layout.shape[a] as i64);
            let zero = b.ins().iconst(I64, 0);
            let next = b.ins().select(wraps, zero, next);
            b.def_var(self.coords[a], next);
            carry = b.ins().uextend(I64, wraps);
        }
    }

    /// The last sweep: every stored value, then the stores and cross-row sums.
    fn store_sweep(&mut self, b: &mut FunctionBuilder, r: &mut Row) {
        let layout = self.layout;
        let stores = self.kernel.stores.clone();
        self.row_values(b, r, &stores);
        // Row-local f64 sums of cross-row outputs that do not run along the row:
        // lanes 0–1, lanes 2–3 (f64x2) and the tail.
        let mut row_sums: HashMap<usize, (Variable, Variable, Variable)> = HashMap::new();
        for (k, o) in layout.outputs.iter().enumerate() {
            if o.cross_row && !o.along_row {
                let (lo, hi, t) = (b.declare_var(F64X2), b.declare_var(F64X2), b.declare_var(F64));
                let zero = b.ins().f64const(0.0);
                let zeros = b.ins().splat(F64X2, zero);
                b.def_var(lo, zeros);
                b.def_var(hi, zeros);
                b.def_var(t, zero);
                row_sums.insert(k, (lo, hi, t));
            }
        }
        let r_ref: &Row = r;
        let order = self.post_order(&stores);
        self.column_groups(b, |cg, b, group| {
            // Every group's value of each expression before the next
            // expression: the groups' dependency chains interleave, so one
            // group's latency hides behind the other's work.
            let mut memos = vec![HashMap::new(); group.len()];
            for &id in &order {
                for (cols, memo) in group.iter().zip(&mut memos) {
                    cg.element(b, r_ref, *cols, memo, id);
                }
            }
            for (&cols, memo) in group.iter().zip(&mut memos) {
                let values: Vec<Value> = stores.iter().map(|&s| cg.element(b, r_ref, cols, memo, s)).collect();
                for (k, (o, &v)) in layout.outputs.iter().zip(&values).enumerate() {
                    let four = cols.lanes == Lanes::Four;
                    if !o.cross_row {
                        let at = offset(b, r_ref.outputs[k], cols.col, o.dtype.size_bytes() as i64);
                        storage::store(b, o.dtype, v, at, cols.lanes);
                    } else if o.along_row {
                        let at = offset(b, r_ref.outputs[k], cols.col, 8);
                        if four {
                            let lo = b.ins().fvpromote_low(v);
                            let high = simd::high_half(b, v);
                            let hi = b.ins().fvpromote_low(high);
                            for (part, disp) in [(lo, 0), (hi, 16)] {
                                let old = b.ins().load(F64X2, mem(), at, disp);
                                let sum = b.ins().fadd(old, part);
                                b.ins().store(mem(), sum, at, disp);
                            }
                        } else {
                            let x = simd::lane(b, v, 0);
                            let x = b.ins().fpromote(F64, x);
                            let old = b.ins().load(F64, mem(), at, 0);
                            let sum = b.ins().fadd(old, x);
                            b.ins().store(mem(), sum, at, 0);
                        }
                    } else {
                        let (lo, hi, t) = row_sums[&k];
                        if four {
                            let l = b.ins().fvpromote_low(v);
                            let high = simd::high_half(b, v);
                            let h = b.ins().fvpromote_low(high);
                            for (var, part) in [(lo, l), (hi, h)] {
                                let acc = b.use_var(var);
                                let next = b.ins().fadd(acc, part);
                                b.def_var(var, next);
                            }
                        } else {
                            let x = simd::lane(b, v, 0);
                            let x = b.ins().fpromote(F64, x);
                            let acc = b.use_var(t);
                            let next = b.ins().fadd(acc, x);
                            b.def_var(t, next);
                        }
                    }
                }
            }
        });
        let mut sums: Vec<_> = row_sums.into_iter().collect();
        sums.sort_by_key(|&(k, _)| k);
        for (k, (lo, hi, t)) in sums {
            let (lo, hi, t) = (b.use_var(lo), b.use_var(hi), b.use_var(t));
            let pair = b.ins().fadd(lo, hi);
            let (p0, p1) = (b.ins().extractlane(pair, 0), b.ins().extractlane(pair, 1));
            let s = b.ins().fadd(p0, p1);
            let s = b.ins().fadd(s, t);
            let at = r.outputs[k];
            let old = b.ins().load(F64, mem(), at, 0);
            let sum = b.ins().fadd(old, s);
            b.ins().store(mem(), sum, at, 0);
        }
    }

    /// `(full vectors, tail columns)` of a row.
    fn column_split(&self) -> (usize, usize) {
        (self.layout.width / LANES, self.layout.width % LANES)
    }

    /// Runs `body` over the row: two groups of four columns at a time (the
    /// groups' independent dependency chains interleaved keep the core busy
    /// where one chain would leave it waiting on latency), one group for an
    /// odd last vector, then the tail one column at a time.
    fn column_groups(
        &mut self,
        b: &mut FunctionBuilder,
        mut body: impl FnMut(&mut Self, &mut FunctionBuilder, &[Cols]),
    ) {
        let (vectors, tail) = self.column_split();
        let four = LANES as i64;
        let (pairs_end, main_end) = ((vectors / 2) as i64 * 2 * four, vectors as i64 * four);
        if pairs_end > 0 {
            let (begin, end) = (b.ins().iconst(I64, 0), b.ins().iconst(I64, pairs_end));
            for_range(b, begin, end, 2 * four, |b, col| {
                let next = b.ins().iadd_imm_s(col, four);
                let group = [Cols { col, lanes: Lanes::Four }, Cols { col: next, lanes: Lanes::Four }];
                body(self, b, &group)
            });
        }
        if main_end > pairs_end {
            let col = b.ins().iconst(I64, pairs_end);
            body(self, b, &[Cols { col, lanes: Lanes::Four }]);
        }
        if tail > 0 {
            let (begin, end) = (b.ins().iconst(I64, main_end), b.ins().iconst(I64, self.layout.width as i64));
            for_range(b, begin, end, 1, |b, col| body(self, b, &[Cols { col, lanes: Lanes::One }]));
        }
    }

    /// The expressions `roots` depend on, each after its operands.
    fn post_order(&self, roots: &[ExprId]) -> Vec<ExprId> {
        let mut order = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<(ExprId, bool)> = roots.iter().rev().map(|&r| (r, false)).collect();
        while let Some((id, expanded)) = stack.pop() {
            if expanded {
                order.push(id);
            } else if seen.insert(id) {
                stack.push((id, true));
                stack.extend(self.kernel.body[id as usize].operands().into_iter().rev().map(|a| (a, false)));
            }
        }
        order
    }

    /// Emits, in the row's block, the per-row values the expressions `roots`
    /// read, so every column loop after this point can use them.
    fn row_values(&mut self, b: &mut FunctionBuilder, r: &mut Row, roots: &[ExprId]) {
        let mut stack: Vec<ExprId> = roots.to_vec();
        let mut seen = std::collections::HashSet::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id) || r.values.contains_key(&id) {
                continue;
            }
            match self.layout.class[id as usize] {
                Class::Element => stack.extend(self.kernel.body[id as usize].operands()),
                Class::Row => {
                    self.row_value(b, r, id);
                }
                Class::Uniform => {}
            }
        }
    }

    /// A per-row value (splat), emitted in the row's block.
    fn row_value(&mut self, b: &mut FunctionBuilder, r: &mut Row, id: ExprId) -> Value {
        if let Some(&v) = r.values.get(&id) {
            return v;
        }
        let v = match self.kernel.body[id as usize] {
            Expr::Load(k) => {
                let dtype = self.layout.inputs[k as usize].dtype;
                let x = storage::load(b, dtype, r.inputs[k as usize], Lanes::One);
                let x = simd::lane(b, x, 0);
                b.ins().splat(F32X4, x)
            }
            ref e => {
                // Reductions were computed by earlier sweeps (see `Layout::level`).
                let args: Vec<Value> = e.operands().into_iter().map(|a| self.row_value(b, r, a)).collect();
                self.op(b, e, &args)
            }
        };
        r.values.insert(id, v);
        v
    }

    /// The value of `id` at columns `cols` (per-row values come from `r`).
    fn element(
        &mut self,
        b: &mut FunctionBuilder,
        r: &Row,
        cols: Cols,
        memo: &mut HashMap<ExprId, Value>,
        id: ExprId,
    ) -> Value {
        if let Some(&v) = r.values.get(&id).or_else(|| memo.get(&id)) {
            return v;
        }
        let kept = self.kept.get(&id).copied();
        if let Some((first, slot)) = kept
            && self.sweep > first
        {
            let at = self.kept_address(b, slot, cols);
            let v = storage::load(b, zeroplan_ir::DType::F32, at, cols.lanes);
            memo.insert(id, v);
            return v;
        }
        let v = match self.kernel.body[id as usize] {
            Expr::Load(k) => {
                let arg = &self.layout.inputs[k as usize];
                let at = offset(b, r.inputs[k as usize], cols.col, arg.dtype.size_bytes() as i64);
                storage::load(b, arg.dtype, at, cols.lanes)
            }
            Expr::Keep { p, stream } => {
                let key = self.key.expect("set up for kernels with dropout");
                let e0 = b.ins().iadd(r.first_element, cols.col);
                let mask = dropout::keep_lanes(b, key, stream, dropout::threshold(p), e0);
                self.flag(b, mask)
            }
            Expr::AlibiPenalty => {
                let (slope, query) = r.alibi.expect("set up for ALiBi kernels");
                let c = b.ins().ireduce(I32, cols.col);
                let c = b.ins().splat(I32X4, c);
                let iota = simd::iota(b);
                let key = b.ins().iadd(c, iota);
                let d = b.ins().isub(key, query);
                let d = b.ins().iabs(d);
                let d = b.ins().fcvt_from_sint(F32X4, d);
                b.ins().fmul(slope, d)
            }
            ref e => {
                let args: Vec<Value> = e.operands().into_iter().map(|a| self.element(b, r, cols, memo, a)).collect();
                self.op(b, e, &args)
            }
        };
        if let Some((first, slot)) = kept
            && self.sweep == first
        {
            let at = self.kept_address(b, slot, cols);
            storage::store(b, zeroplan_ir::DType::F32, v, at, cols.lanes);
        }
        memo.insert(id, v);
        v
    }

    /// `1.0`/`0.0` from a lane mask, remembering the mask.
    fn flag(&mut self, b: &mut FunctionBuilder, mask: Value) -> Value {
        let v = simd::flag(b, mask);
        self.masks.insert(v, mask);
        v
    }

    fn kept_address(&self, b: &mut FunctionBuilder, slot: StackSlot, cols: Cols) -> Value {
        // Pointers are 64-bit on every host Cranelift's JIT supports; `col` is an `i64`.
        let base = b.ins().stack_addr(I64, slot, 0);
        offset(b, base, cols.col, 4)
    }

    /// Chooses the element values worth keeping in a row buffer: those that
    /// cost a transcendental function, a Philox draw or an i64 load, and that more than one
    /// sweep reads (a softmax's `exp(x − max)` is summed in one sweep and
    /// divided in the next). Later candidates (bigger expressions) first, so
    /// a kept value hides the values inside it.
    fn plan_kept(&mut self, b: &mut FunctionBuilder) {
        let (body, layout) = (&self.kernel.body, self.layout);
        let mut expensive = vec![false; body.len()];
        for (i, e) in body.iter().enumerate() {
            let own = match *e {
                Expr::Keep { .. } | Expr::Binary(Binary::Pow, ..) => true,
                // i64 operands (the attention mask) load and convert lane by lane.
                Expr::Load(k) => layout.inputs[k as usize].dtype == zeroplan_ir::DType::I64,
                Expr::Unary(u, _) => !matches!(u, Unary::Neg | Unary::Sqrt | Unary::Rsqrt | Unary::Recip | Unary::Relu),
                _ => false,
            };
            expensive[i] = layout.class[i] == Class::Element
                && (own
                    || e.operands()
                        .iter()
                        .any(|&o| expensive[o as usize] && layout.class[o as usize] == Class::Element));
        }
        let sweep_roots: Vec<Vec<ExprId>> = (0..=layout.reduction_sweeps)
            .map(|s| {
                if s == layout.reduction_sweeps {
                    self.kernel.stores.clone()
                } else {
                    body.iter()
                        .enumerate()
                        .filter(|&(i, _)| layout.level[i] == s + 1)
                        .filter_map(|(_, e)| match *e {
                            Expr::ReduceSum(a) | Expr::ReduceMax(a) => Some(a),
                            _ => None,
                        })
                        .collect()
                }
            })
            .collect();
        let mut chosen: HashMap<ExprId, usize> = HashMap::new();
        let budget = KEPT_BYTES / (4 * layout.width.max(1));
        for candidate in (0..body.len()).rev().filter(|&i| expensive[i]) {
            if chosen.len() >= budget {
                break;
            }
            // The sweeps that evaluate `candidate`, not looking inside kept values.
            let mut sweeps = Vec::new();
            for (s, roots) in sweep_roots.iter().enumerate() {
                let mut stack = roots.clone();
                let mut seen = std::collections::HashSet::new();
                while let Some(id) = stack.pop() {
                    if !seen.insert(id) || layout.class[id as usize] != Class::Element {
                        continue;
                    }
                    if id as usize == candidate {
                        sweeps.push(s);
                        break;
                    }
                    if !chosen.contains_key(&id) {
                        stack.extend(body[id as usize].operands());
                    }
                }
            }
            if sweeps.len() > 1 {
                chosen.insert(candidate as ExprId, sweeps[0]);
            }
        }
        for (id, first) in chosen {
            let size = (4 * layout.width) as u32;
            let slot = b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, size, 4));
            self.kept.insert(id, (first, slot));
        }
    }

    /// An arithmetic expression on `f32x4` operands.
    fn op(&mut self, b: &mut FunctionBuilder, e: &Expr, args: &[Value]) -> Value {
        match *e {
            Expr::Unary(u, _) => self.unary(b, u, args[0]),
            Expr::Binary(op, _, _) => self.binary(b, op, args[0], args[1]),
            Expr::Select(..) => {
                let nz = match self.masks.get(&args[0]) {
                    Some(&mask) => mask,
                    None => {
                        let zero = splat(b, 0.0);
                        // Unordered-or-not-equal: a NaN condition takes the first operand.
                        simd::fcmp(b, FloatCC::NotEqual, args[0], zero)
                    }
                };
                simd::select(b, nz, args[1], args[2])
            }
            _ => unreachable!("loads, constants, reductions, dropout and ALiBi are handled by the caller"),
        }
    }

    fn unary(&mut self, b: &mut FunctionBuilder, u: Unary, x: Value) -> Value {
        match u {
            Unary::Neg => b.ins().fneg(x),
            Unary::Sqrt => b.ins().sqrt(x),
            Unary::Rsqrt => {
                let one = splat(b, 1.0);
                let s = b.ins().sqrt(x);
                b.ins().fdiv(one, s)
            }
            Unary::Recip => {
                let one = splat(b, 1.0);
                b.ins().fdiv(one, x)
            }
            Unary::Relu => {
                // `x` where `x > 0` or NaN, else +0.
                let zero = splat(b, 0.0);
                let keep = simd::fcmp(b, FloatCC::UnorderedOrGreaterThan, x, zero);
                simd::select(b, keep, x, zero)
            }
            Unary::Exp => math::exp(b, x),
            Unary::Erf => math::erf(b, x),
            Unary::Tanh => math::tanh(b, x),
            Unary::Silu => math::silu(b, x),
            Unary::SiluDeriv => math::silu_deriv(b, x),
            Unary::Gelu(form) => math::gelu(b, form, x),
            Unary::GeluDeriv(form) => math::gelu_deriv(b, form, x),
        }
    }

    fn binary(&mut self, b: &mut FunctionBuilder, op: Binary, x: Value, y: Value) -> Value {
        match op {
            Binary::Add => b.ins().fadd(x, y),
            Binary::Sub => b.ins().fsub(x, y),
            Binary::Mul => b.ins().fmul(x, y),
            Binary::Div => b.ins().fdiv(x, y),
            Binary::Max | Binary::Min => {
                let m = if op == Binary::Max { b.ins().fmax(x, y) } else { b.ins().fmin(x, y) };
                // Rust's `f64::max`/`min` ignore a NaN operand; Cranelift's propagate it.
                let x_nan = simd::fcmp(b, FloatCC::Unordered, x, x);
                let m = simd::select(b, x_nan, y, m);
                let y_nan = simd::fcmp(b, FloatCC::Unordered, y, y);
                simd::select(b, y_nan, x, m)
            }
            Binary::Lt | Binary::Gt | Binary::Eq => {
                let mask = simd::fcmp(b, compare(op), x, y);
                self.flag(b, mask)
            }
            Binary::Pow => {
                // One call per lane; only per-element exponents get here.
                let mut out = splat(b, 0.0);
                for l in 0..LANES {
                    let (p, q) = (simd::lane(b, x, l), simd::lane(b, y, l));
                    let v = self.libcall(b, LibCall::PowF32, &[p, q]);
                    out = b.ins().insertlane(out, v, l as u8);
                }
                out
            }
        }
    }
}

/// The condition of a comparison.
fn compare(op: Binary) -> FloatCC {
    match op {
        Binary::Lt => FloatCC::LessThan,
        Binary::Gt => FloatCC::GreaterThan,
        _ => FloatCC::Equal,
    }
}

/// `base + col·bytes`.
fn offset(b: &mut FunctionBuilder, base: Value, col: Value, bytes: i64) -> Value {
    let off = b.ins().imul_imm_s(col, bytes);
    b.ins().iadd(base, off)
}
