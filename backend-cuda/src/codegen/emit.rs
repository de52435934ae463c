//! Kernel IR → CUDA C text, one `extern "C" __global__` function per
//! (kernel, dims), every size a constant:
//!
//! ```text
//! uniform values, once per thread, in double      // constants, scalar inputs, β^t
//! zero this block's cross-row partials
//! for row in this block's rows:
//!     row pointers of every operand               // from the row's coordinates
//!     for sweep in reduction sweeps:               // LayerNorm: Σx, then Σ(x−μ)²
//!         per-row values they need
//!         thread-local accumulators over the thread's columns:
//!             16-byte vector steps, then the scalar tail
//!         warp shuffles + shared memory → the row's totals
//!     the store sweep: every stored value, stored (vector, then tail);
//!         cross-row outputs add into the block's partials (double)
//! ```
//!
//! Thread `t` handles columns `t·V + k·T·V` (+ the `V` after each) and
//! tail columns `main + t + k·T`: the same columns in every sweep and every
//! row. So a cross-row output's partial element is only ever touched by one
//! thread of its block (no atomics), and an output may alias an input of
//! its shape and dtype: a thread writes an element only after it has read
//! it for the last time, and no other thread reads it.
//!
//! A second kernel (`…_finish`) adds each cross-row output's partials and
//! rounds the sum once to the output's dtype: warp `w` of its block sums the
//! partials of blocks `w, w + 8, …` in order, and the 8 warps' sums are
//! added in warp order. The order depends on the grid alone: deterministic,
//! like the CPU backend's chunk partials.

use std::collections::BTreeSet;

use zeroplan_ir::DType;
use zeroplan_ir::kernel::layout::{ArgLayout, Class, Layout};
use zeroplan_ir::kernel::{Expr, ExprId, Kernel};

use super::expr::{self, ComputeType};
use super::launch::{FINISH_COLUMNS, FINISH_THREADS, LaunchConfig};
use super::prelude;
use super::vector::{VectorSteps, vectorised};

/// The entry point names of a generated kernel.
pub(crate) struct Entries {
    pub main: String,
    pub finish: Option<String>,
}

/// A symbol-safe form of a kernel name.
pub(crate) fn entries(kernel: &Kernel, layout: &Layout) -> Entries {
    let base: String =
        kernel.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    let main = format!("zp_{base}");
    let finish = layout.outputs.iter().any(|o| o.cross_row).then(|| format!("{main}_finish"));
    Entries { main, finish }
}

/// The whole CUDA C source of `kernel` laid out as `layout`, its column
/// loops split as `vectors`.
pub(crate) fn source(kernel: &Kernel, layout: &Layout, vectors: VectorSteps, launch: &LaunchConfig) -> String {
    let mut e = Emitter { kernel, layout, vectors, launch, out: String::new() };
    e.header();
    e.main_kernel();
    e.finish_kernel();
    e.out
}

/// How a column loop reads and writes: 16-byte vector steps, or one column.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Vector,
    Scalar,
}

/// What each column of a sweep does with the values it computes.
enum Action {
    /// `acc ⊕= value` for reduction `id`.
    Reduce { id: ExprId, operand: ExprId, max: bool },
    /// A full output's element.
    Store { output: usize, value: ExprId },
    /// A cross-row output along the row: the block's partial of this column.
    Partial { output: usize, value: ExprId },
    /// A cross-row output not along the row: the row's sum, in `double`.
    RowSum { output: usize, value: ExprId },
}

struct Emitter<'a> {
    kernel: &'a Kernel,
    layout: &'a Layout,
    vectors: VectorSteps,
    launch: &'a LaunchConfig,
    out: String,
}

/// Comment text that cannot end a `//` comment early or splice lines.
fn comment(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == '\\' {
                '/'
            } else if c.is_control() {
                '?'
            } else {
                c
            }
        })
        .collect()
}

impl Emitter<'_> {
    fn line(&mut self, depth: usize, text: impl AsRef<str>) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
        self.out.push_str(text.as_ref());
        self.out.push('\n');
    }

    fn rank(&self) -> usize {
        self.layout.shape.len()
    }

    fn has(&self, f: impl Fn(&Expr) -> bool) -> bool {
        self.kernel.body.iter().any(f)
    }

    fn uses_dtype(&self, dtype: DType) -> bool {
        self.layout.inputs.iter().chain(&self.layout.outputs).any(|a| a.dtype == dtype)
    }

    fn has_reduction(&self) -> bool {
        self.has(|e| matches!(e, Expr::ReduceSum(_) | Expr::ReduceMax(_)))
    }

    fn has_row_sums(&self) -> bool {
        self.layout.outputs.iter().any(|o| o.cross_row && !o.along_row)
    }

    fn cross_rows(&self) -> impl Iterator<Item = (usize, &ArgLayout)> {
        self.layout.outputs.iter().enumerate().filter(|(_, o)| o.cross_row)
    }

    /// The kernel's IR as a comment, the headers, the helpers it needs.
    fn header(&mut self) {
        let (l, n) = (self.layout, self.launch);
        self.line(0, format!("// zeroplan kernel `{}` over {:?}", comment(&self.kernel.name), l.shape));
        self.line(
            0,
            format!(
                "// {} rows of {}; {} threads per block, {} rows per block, {} blocks; {} columns per vector step",
                l.rows, l.width, n.block, n.rows_per_block, n.grid, self.vectors.columns
            ),
        );
        for text in self.kernel.to_text().lines() {
            self.line(0, format!("//   {}", comment(text)));
        }
        let types = prelude::types_and_math(self.uses_dtype(DType::BF16), self.uses_dtype(DType::F16));
        self.out.push_str(&types);
        for (needed, text) in [
            (self.has_reduction(), prelude::REDUCE),
            (self.has_row_sums(), prelude::REDUCE_F64),
            (self.has(|e| matches!(e, Expr::Keep { .. })), prelude::PHILOX),
        ] {
            if needed {
                self.out.push_str(text);
            }
        }
        if self.has(|e| *e == Expr::AlibiPenalty) {
            // `Kernel::check` makes an ALiBi kernel [B, H, Sq, Sk].
            let slopes = zeroplan_ir::interp::alibi_slopes(l.shape[1]);
            let list: Vec<String> = slopes.iter().map(|&m| ComputeType::Float.literal(m)).collect();
            self.line(0, "// ALiBi's slope per head.");
            self.line(
                0,
                format!("__constant__ float zp_alibi_slopes[{}] = {{{}}};", slopes.len().max(1), list.join(", ")),
            );
        }
        self.out.push('\n');
    }

    /// The main kernel's parameters: inputs, full outputs, the partials,
    /// the two words holding dropout's seed and offset.
    fn parameters(&self) -> Vec<String> {
        let mut params = Vec::new();
        for (k, (a, arg)) in self.layout.inputs.iter().zip(&self.kernel.inputs).enumerate() {
            params.push(format!("const {}* in{k} /* %{} */", expr::c_type(a.dtype), comment_safe(&arg.name)));
        }
        for (k, (o, arg)) in self.layout.outputs.iter().zip(&self.kernel.outputs).enumerate() {
            if !o.cross_row {
                params.push(format!("{}* out{k} /* %{} */", expr::c_type(o.dtype), comment_safe(&arg.name)));
            }
        }
        if self.cross_rows().next().is_some() {
            params.push("double* partials".into());
        }
        params.push("const unsigned long long* __restrict__ zp_rng".into());
        params
    }

    fn main_kernel(&mut self) {
        let main = entries(self.kernel, self.layout).main;
        let params = self.parameters();
        self.line(0, format!("extern \"C\" __global__ void __launch_bounds__({}) {main}(", self.launch.block));
        let last = params.len() - 1;
        for (i, p) in params.iter().enumerate() {
            self.line(2, format!("{p}{}", if i == last { ")" } else { "," }));
        }
        self.line(0, "{");
        if self.kernel.body.iter().any(|e| matches!(e, Expr::Keep { .. })) {
            // Read when the kernel runs, so a replayed CUDA graph draws the step's masks.
            self.line(1, "const unsigned long long seed = zp_rng[0], offset = zp_rng[1];");
        }
        if self.has_reduction() {
            self.line(1, "__shared__ float zp_red[32];");
        }
        if self.has_row_sums() {
            self.line(1, "__shared__ double zp_red64[32];");
        }
        self.uniforms();
        self.partial_slots();
        let (rows, rpb) = (self.layout.rows, self.launch.rows_per_block);
        self.line(1, format!("const long long first = (long long)blockIdx.x * {rpb};"));
        self.line(1, format!("const long long last = first + {rpb} < {rows} ? first + {rpb} : {rows};"));
        self.line(1, "for (long long row = first; row < last; ++row) {");
        self.row_pointers();
        let mut defined = BTreeSet::new();
        for sweep in 0..self.layout.reduction_sweeps {
            self.reduction_sweep(sweep, &mut defined);
        }
        self.store_sweep(&mut defined);
        self.line(1, "}");
        self.line(0, "}");
    }

    /// Launch-uniform values in `double` (`dN`), and as `float` (`vN`)
    /// where per-row or per-element code reads them.
    fn uniforms(&mut self) {
        let l = self.layout;
        let mut in_float = vec![false; self.kernel.body.len()];
        for (i, e) in self.kernel.body.iter().enumerate() {
            if l.class[i] != Class::Uniform {
                for o in e.operands() {
                    in_float[o as usize] = true;
                }
            }
        }
        for &s in &self.kernel.stores {
            in_float[s as usize] = true;
        }
        if !l.class.contains(&Class::Uniform) {
            return;
        }
        self.line(1, "// Launch-uniform values, in double as the interpreter computes them.");
        for (i, e) in self.kernel.body.iter().enumerate() {
            if l.class[i] != Class::Uniform {
                continue;
            }
            let id = i as ExprId;
            let p = ComputeType::Double;
            let value = match *e {
                Expr::Load(k) => format!("zp_ld_f64(in{k})"),
                ref other => self.arithmetic(p, other, id),
            };
            self.line(1, format!("const double {} = {value};", p.name(id)));
            if in_float[i] {
                self.line(1, format!("const float v{id} = (float)d{id};"));
            }
        }
    }

    /// Arithmetic, constants and `row_len` (loads, dropout, ALiBi and
    /// reductions are the callers').
    fn arithmetic(&self, p: ComputeType, e: &Expr, id: ExprId) -> String {
        let name = |a: ExprId| p.name(a);
        match *e {
            Expr::Const(c) => p.literal(c),
            Expr::RowLen => p.literal(self.layout.width as f64),
            Expr::Unary(u, a) => expr::unary(u, &name(a)),
            Expr::Binary(op, x, y) => expr::binary(p, op, &name(x), &name(y)),
            Expr::Select(c, x, y) => expr::select(p, &name(c), &name(x), &name(y)),
            Expr::Load(_) | Expr::Keep { .. } | Expr::AlibiPenalty | Expr::ReduceSum(_) | Expr::ReduceMax(_) => {
                unreachable!("v{id}: the caller emits loads, dropout, ALiBi and reductions")
            }
        }
    }

    /// Each cross-row output's partials for this block, zeroed.
    fn partial_slots(&mut self) {
        let mut base = 0usize;
        let slots: Vec<(usize, usize)> = self.cross_rows().map(|(k, o)| (k, o.len)).collect();
        if slots.is_empty() {
            return;
        }
        self.line(1, "// This block's partial sums of the cross-row outputs (added up in block order by _finish).");
        for (k, len) in slots {
            self.line(1, format!("double* part{k} = partials + ({base}LL + (long long)blockIdx.x * {len});"));
            self.line(
                1,
                format!("for (long long i = threadIdx.x; i < {len}; i += {}) part{k}[i] = 0.0;", self.launch.block),
            );
            base += len * self.launch.grid as usize;
        }
        self.line(1, "__syncthreads();");
    }

    /// `arg`'s offset at the current row: `Σ coord·stride` over the outer
    /// axes where it has a stride (`row · width` for a full operand), and
    /// the coordinates that reads.
    fn row_offset(&self, arg: &ArgLayout) -> (String, Vec<usize>) {
        let l = self.layout;
        let outer = self.rank() - 1;
        let full = (0..outer).all(|a| arg.strides[a] == l.shape[a + 1..].iter().product::<usize>());
        if full && arg.along_row && !arg.cross_row {
            return (format!("row * {}", l.width), Vec::new());
        }
        let axes: Vec<usize> = (0..outer).filter(|&a| arg.strides[a] != 0 && l.shape[a] > 1).collect();
        let terms: Vec<String> = axes
            .iter()
            .map(|&a| if arg.strides[a] == 1 { format!("c{a}") } else { format!("c{a} * {}", arg.strides[a]) })
            .collect();
        (terms.join(" + "), axes)
    }

    /// The row's coordinates along the outer axes, and every operand's row pointer.
    fn row_pointers(&mut self) {
        let l = self.layout;
        let mut pointers = Vec::new();
        // ALiBi reads the head (axis 1) and the query position (axis 2).
        let mut coords: BTreeSet<usize> =
            if self.has(|e| *e == Expr::AlibiPenalty) { [1, 2].into() } else { BTreeSet::new() };
        // Scalars are read once, with the launch-uniform values.
        for (k, a) in l.inputs.iter().enumerate().filter(|(_, a)| !a.scalar) {
            let (offset, axes) = self.row_offset(a);
            coords.extend(axes);
            pointers.push((format!("const {}* in{k}_r = in{k}", expr::c_type(a.dtype)), offset));
        }
        for (k, o) in l.outputs.iter().enumerate() {
            let (offset, axes) = self.row_offset(o);
            coords.extend(axes);
            let decl = if o.cross_row {
                format!("double* part{k}_r = part{k}")
            } else {
                format!("{}* out{k}_r = out{k}", expr::c_type(o.dtype))
            };
            pointers.push((decl, offset));
        }
        let outer = self.rank() - 1;
        for a in coords {
            let inner: usize = l.shape[a + 1..outer].iter().product();
            let quotient = if inner == 1 { "row".to_string() } else { format!("(row / {inner})") };
            let coord = if a == 0 { quotient } else { format!("{quotient} % {}", l.shape[a]) };
            self.line(2, format!("const long long c{a} = {coord};"));
        }
        for (decl, offset) in pointers {
            if offset.is_empty() {
                self.line(2, format!("{decl};"));
            } else {
                self.line(2, format!("{decl} + ({offset});"));
            }
        }
    }

    /// Defines (once) every per-row value the expressions `roots` read.
    fn row_values(&mut self, roots: &[ExprId], defined: &mut BTreeSet<ExprId>) {
        let mut needed = BTreeSet::new();
        let mut stack = roots.to_vec();
        while let Some(id) = stack.pop() {
            if defined.contains(&id) || !needed.insert(id) {
                continue;
            }
            match self.layout.class[id as usize] {
                Class::Uniform => {}
                _ => {
                    if !matches!(self.kernel.body[id as usize], Expr::ReduceSum(_) | Expr::ReduceMax(_)) {
                        stack.extend(self.kernel.body[id as usize].operands());
                    }
                }
            }
        }
        for id in needed {
            if self.layout.class[id as usize] != Class::Row || defined.contains(&id) {
                continue;
            }
            let value = match self.kernel.body[id as usize] {
                Expr::Load(k) => format!("zp_ld(in{k}_r)"),
                Expr::ReduceSum(_) | Expr::ReduceMax(_) => {
                    unreachable!("v{id}: reductions are defined by their sweep")
                }
                ref e => self.arithmetic(ComputeType::Float, e, id),
            };
            self.line(2, format!("const float v{id} = {value};"));
            defined.insert(id);
        }
    }

    fn reduction_sweep(&mut self, sweep: usize, defined: &mut BTreeSet<ExprId>) {
        let l = self.layout;
        let actions: Vec<Action> = self
            .kernel
            .body
            .iter()
            .enumerate()
            .filter(|&(i, _)| l.level[i] == sweep + 1)
            .filter_map(|(i, e)| match *e {
                Expr::ReduceSum(a) => Some(Action::Reduce { id: i as ExprId, operand: a, max: false }),
                Expr::ReduceMax(a) => Some(Action::Reduce { id: i as ExprId, operand: a, max: true }),
                _ => None,
            })
            .collect();
        self.line(2, format!("// Sweep {sweep}: {}.", describe(&actions)));
        let roots: Vec<ExprId> = actions.iter().map(action_value).collect();
        self.row_values(&roots, defined);
        for a in &actions {
            if let Action::Reduce { id, max, .. } = *a {
                let init = if max { "-__int_as_float(0x7f800000)" } else { "0.0f" };
                self.line(2, format!("float acc{id} = {init};"));
            }
        }
        self.columns(&actions, defined);
        for a in &actions {
            if let Action::Reduce { id, max, .. } = *a {
                let f = if max { "zp_block_max" } else { "zp_block_sum" };
                self.line(2, format!("const float v{id} = {f}(acc{id}, zp_red);"));
                defined.insert(id);
            }
        }
    }

    fn store_sweep(&mut self, defined: &mut BTreeSet<ExprId>) {
        let actions: Vec<Action> = self
            .layout
            .outputs
            .iter()
            .zip(&self.kernel.stores)
            .enumerate()
            .map(|(output, (o, &value))| match (o.cross_row, o.along_row) {
                (false, _) => Action::Store { output, value },
                (true, true) => Action::Partial { output, value },
                (true, false) => Action::RowSum { output, value },
            })
            .collect();
        self.line(2, format!("// The store sweep: {}.", describe(&actions)));
        let roots: Vec<ExprId> = actions.iter().map(action_value).collect();
        self.row_values(&roots, defined);
        for a in &actions {
            if let Action::RowSum { output, .. } = *a {
                self.line(2, format!("double sum{output} = 0.0;"));
            }
        }
        self.columns(&actions, defined);
        for a in &actions {
            if let Action::RowSum { output, .. } = *a {
                self.line(2, "{");
                self.line(3, format!("const double total = zp_block_sum_f64(sum{output}, zp_red64);"));
                self.line(3, format!("if (threadIdx.x == 0) part{output}_r[0] += total;"));
                self.line(2, "}");
            }
        }
    }

    /// The vector steps, then the scalar tail, of one sweep.
    fn columns(&mut self, actions: &[Action], defined: &BTreeSet<ExprId>) {
        let (l, vs, threads) = (self.layout, self.vectors, self.launch.block);
        let v = vs.columns;
        if vs.main > 0 {
            self.line(
                2,
                format!(
                    "for (long long col = (long long)threadIdx.x * {v}; col < {}; col += {}) {{",
                    vs.main,
                    threads as usize * v
                ),
            );
            self.lanes(Step::Vector, actions, defined);
            self.line(2, "}");
        }
        if l.width > vs.main {
            self.line(
                2,
                format!("for (long long col = {} + threadIdx.x; col < {}; col += {threads}) {{", vs.main, l.width),
            );
            self.lanes(Step::Scalar, actions, defined);
            self.line(2, "}");
        }
    }

    /// The body of one column loop: per-element values, then the actions.
    fn lanes(&mut self, step: Step, actions: &[Action], defined: &BTreeSet<ExprId>) {
        let l = self.layout;
        let v = self.vectors.columns;
        // The element expressions the actions read, in SSA order.
        let mut needed = BTreeSet::new();
        let mut stack: Vec<ExprId> = actions.iter().map(action_value).collect();
        while let Some(id) = stack.pop() {
            if l.class[id as usize] == Class::Element && !defined.contains(&id) && needed.insert(id) {
                stack.extend(self.kernel.body[id as usize].operands());
            }
        }
        let (depth, j) = match step {
            Step::Vector => (4, "col + l"),
            Step::Scalar => (3, "col"),
        };
        let vectorised_input = |k: u32| step == Step::Vector && vectorised(&l.inputs[k as usize]);
        if step == Step::Vector {
            let loaded: BTreeSet<u32> = needed
                .iter()
                .filter_map(|&id| match self.kernel.body[id as usize] {
                    Expr::Load(k) if vectorised_input(k) => Some(k),
                    _ => None,
                })
                .collect();
            for k in loaded {
                self.line(3, format!("float x{k}[{v}];"));
                self.line(3, format!("zp_ld{v}(in{k}_r + col, x{k});"));
            }
            for a in actions {
                if let Action::Store { output, .. } = *a {
                    self.line(3, format!("float o{output}[{v}];"));
                }
            }
            self.line(0, "#pragma unroll");
            self.line(3, format!("for (int l = 0; l < {v}; ++l) {{"));
        }
        for &id in &needed {
            let value = match self.kernel.body[id as usize] {
                Expr::Load(k) if vectorised_input(k) => format!("x{k}[l]"),
                Expr::Load(k) => format!("zp_ld(in{k}_r + {j})"),
                Expr::Keep { p, stream } => format!(
                    "zp_keep(seed, {stream}u, (unsigned)offset, (unsigned long long)(row * {} + {j}), {}u) ? 1.0f : 0.0f",
                    l.width,
                    expr::keep_threshold(p)
                ),
                Expr::AlibiPenalty => format!("zp_alibi_slopes[c1] * (float)llabs(c2 - ({j}))"),
                ref e => self.arithmetic(ComputeType::Float, e, id),
            };
            self.line(depth, format!("const float v{id} = {value};"));
        }
        for a in actions {
            let text = match *a {
                Action::Reduce { id, operand, max: false } => format!("acc{id} += v{operand};"),
                Action::Reduce { id, operand, max: true } => format!("acc{id} = zp_max_nan(acc{id}, v{operand});"),
                Action::Store { output, value } if step == Step::Vector => format!("o{output}[l] = v{value};"),
                Action::Store { output, value } => format!("zp_st(out{output}_r + col, v{value});"),
                Action::Partial { output, value } => format!("part{output}_r[{j}] += (double)v{value};"),
                Action::RowSum { output, value } => format!("sum{output} += (double)v{value};"),
            };
            self.line(depth, text);
        }
        if step == Step::Vector {
            self.line(3, "}");
            for a in actions {
                if let Action::Store { output, .. } = *a {
                    self.line(3, format!("zp_st{v}(out{output}_r + col, o{output});"));
                }
            }
        }
    }

    /// The kernel adding each cross-row output's partials: a block per
    /// [`FINISH_COLUMNS`] output elements (across outputs, in order), each
    /// warp summing every `segments`-th block's partials, then the warps'
    /// sums in warp order.
    fn finish_kernel(&mut self) {
        let Some(finish) = entries(self.kernel, self.layout).finish else { return };
        let grid = self.launch.grid as usize;
        let segments = FINISH_THREADS / FINISH_COLUMNS;
        let outputs: Vec<(usize, ArgLayout)> = self.cross_rows().map(|(k, o)| (k, o.clone())).collect();
        let mut params = vec!["const double* partials".to_string()];
        for (k, o) in &outputs {
            params.push(format!(
                "{}* out{k} /* %{} */",
                expr::c_type(o.dtype),
                comment_safe(&self.kernel.outputs[*k].name)
            ));
        }
        self.out.push('\n');
        self.line(0, "// Each cross-row output: its blocks' partial sums added in a fixed order, rounded once.");
        self.line(
            0,
            format!(
                "extern \"C\" __global__ void __launch_bounds__({FINISH_THREADS}) {finish}({}) {{",
                params.join(", ")
            ),
        );
        self.line(1, format!("__shared__ double zp_segment[{segments}][{FINISH_COLUMNS}];"));
        self.line(
            1,
            format!("const int lane = threadIdx.x % {FINISH_COLUMNS}, segment = threadIdx.x / {FINISH_COLUMNS};"),
        );
        self.line(1, format!("long long i = (long long)blockIdx.x * {FINISH_COLUMNS} + lane;"));
        // Which output element `i` is: `which` = n past the last one.
        let mut pick = String::from("int which = ");
        for (n, (_, o)) in outputs.iter().enumerate() {
            let len = o.len;
            pick += &match n {
                0 => format!("i < {len}LL ? 0"),
                _ => format!(" : (i -= {}LL) < {len}LL ? {n}", outputs[n - 1].1.len),
            };
        }
        pick += &format!(" : {};", outputs.len());
        self.line(1, pick);
        self.line(1, "double total = 0.0;");
        let mut base = 0usize;
        for (n, (_, o)) in outputs.iter().enumerate() {
            let len = o.len;
            self.line(
                1,
                format!(
                    "if (which == {n}) for (long long b = segment; b < {grid}; b += {segments}) total += partials[{base}LL + b * {len}LL + i];"
                ),
            );
            base += len * grid;
        }
        self.line(1, "zp_segment[segment][lane] = total;");
        self.line(1, "__syncthreads();");
        self.line(1, "if (segment != 0) return;");
        self.line(1, "double sum = 0.0;");
        self.line(1, format!("for (int s = 0; s < {segments}; ++s) sum += zp_segment[s][lane];"));
        for (n, (k, _)) in outputs.iter().enumerate() {
            self.line(1, format!("if (which == {n}) zp_st(out{k} + i, sum);"));
        }
        self.line(0, "}");
    }
}

/// Names in `/* … */` comments: no `*/` inside, no line breaks.
fn comment_safe(name: &str) -> String {
    comment(name).replace("*/", "*_/")
}

fn action_value(a: &Action) -> ExprId {
    match *a {
        Action::Reduce { operand, .. } => operand,
        Action::Store { value, .. } | Action::Partial { value, .. } | Action::RowSum { value, .. } => value,
    }
}

/// What a sweep does, for its comment.
fn describe(actions: &[Action]) -> String {
    let parts: Vec<String> = actions
        .iter()
        .map(|a| match *a {
            Action::Reduce { id, operand, max } => {
                format!("v{id} = {} v{operand}", if max { "max" } else { "sum" })
            }
            Action::Store { output, value } => format!("out{output} = v{value}"),
            Action::Partial { output, value } | Action::RowSum { output, value } => {
                format!("out{output} += v{value} (cross-row)")
            }
        })
        .collect();
    parts.join(", ")
}
