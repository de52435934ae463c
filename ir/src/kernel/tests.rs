use super::*;
use crate::dtype::DType;
use crate::graph::Graph;
use crate::interp::{Feeds, Interpreter, Rounding, State};
use crate::op::Op;
use crate::shape;
use crate::tensor::Tensor;

fn f32t(s: Shape) -> TensorType {
    TensorType::new(s, DType::F32)
}

/// `layer_norm(x + b)` over rows of 4, eps 1e-300, and the biased sum.
fn bias_layer_norm() -> Kernel {
    let mut k = KernelBuilder::new("bias_ln", shape![2, 4]);
    let x = k.load("x", f32t(shape![2, 4]), vec![0, 1]);
    let b = k.load("b", f32t(shape![4]), vec![1]);
    let s = k.binary(Binary::Add, x, b);
    let n = k.push(Expr::RowLen);
    let sum = k.push(Expr::ReduceSum(s));
    let mean = k.binary(Binary::Div, sum, n);
    let d = k.binary(Binary::Sub, s, mean);
    let d2 = k.binary(Binary::Mul, d, d);
    let ss = k.push(Expr::ReduceSum(d2));
    let var = k.binary(Binary::Div, ss, n);
    let eps = k.constant(1e-300);
    let ve = k.binary(Binary::Add, var, eps);
    let r = k.unary(Unary::Rsqrt, ve);
    let y = k.binary(Binary::Mul, d, r);
    k.store("sum", f32t(shape![2, 4]), s);
    k.store("y", f32t(shape![2, 4]), y);
    k.finish().unwrap()
}

fn run(kernel: &Kernel, inputs: Vec<Tensor>) -> Vec<Vec<f64>> {
    let mut g = Graph::new("k");
    let mut operands = Vec::new();
    let mut feeds = Feeds::new();
    for (arg, t) in kernel.inputs.iter().zip(inputs) {
        operands.push(g.input(arg.name.clone(), arg.ty.clone()).unwrap());
        feeds.insert(arg.name.clone(), t);
    }
    let outs = g.add_multi("fused", Op::Fused { kernel: Box::new(kernel.clone()) }, &operands).unwrap();
    g.verify().unwrap();
    let interp = Interpreter { rounding: Rounding::F64, seed: 5 };
    let values = interp.evaluate(&g, &State::new(), &feeds, 0).unwrap();
    (0..outs.len()).map(|i| values.outputs("fused").unwrap()[i].floats().unwrap().to_vec()).collect()
}

fn t(shape: Vec<usize>, v: &[f64]) -> Tensor {
    Tensor::float(shape, DType::F32, v.to_vec()).unwrap()
}

#[test]
fn bias_layer_norm_by_hand() {
    // Row 0: [0, 1, 2, 3] + [1, 1, 1, 1] = [1, 2, 3, 4]: μ = 2.5, σ² = 1.25.
    // Row 1: [3, 3, 3, 3] + 1: a constant row normalises to 0.
    let x = t(vec![2, 4], &[0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0]);
    let b = t(vec![4], &[1.0; 4]);
    let out = run(&bias_layer_norm(), vec![x, b]);
    assert_eq!(out[0], vec![1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0, 4.0]);
    let s = 1.25f64.sqrt();
    let want = [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s, 0.0, 0.0, 0.0, 0.0];
    for (g, w) in out[1].iter().zip(want) {
        assert!((g - w).abs() < 1e-15, "{out:?}");
    }
}

#[test]
fn masked_softmax_and_dropout_by_hand() {
    // Scores [1, 1, 2, 2], mask [1, 2] = [1, 0]: key 1 masked; then a softmax
    // over [x, −∞] is [1, 0]. Row max, exp, sum, divide, and zero an all −∞ row.
    let mut k = KernelBuilder::new("softmax", shape![1, 1, 2, 2]);
    let x = k.load("x", f32t(shape![1, 1, 2, 2]), vec![0, 1, 2, 3]);
    let m = k.load("mask", TensorType::new(shape![1, 2], DType::I64), vec![0, 3]);
    let zero = k.constant(0.0);
    let ninf = k.constant(f64::NEG_INFINITY);
    let is_masked = k.binary(Binary::Eq, m, zero);
    let masked = k.select(is_masked, ninf, x);
    let max = k.push(Expr::ReduceMax(masked));
    let d = k.binary(Binary::Sub, masked, max);
    let e = k.unary(Unary::Exp, d);
    let s = k.push(Expr::ReduceSum(e));
    let y = k.binary(Binary::Div, e, s);
    let keep = k.push(Expr::Keep { p: 0.5, stream: 3 });
    let two = k.constant(2.0);
    let scaled = k.binary(Binary::Mul, y, two);
    let dropped = k.select(keep, scaled, zero);
    k.store("y", f32t(shape![1, 1, 2, 2]), y);
    k.store("dropped", f32t(shape![1, 1, 2, 2]), dropped);
    let kernel = k.finish().unwrap();
    let out = run(
        &kernel,
        vec![t(vec![1, 1, 2, 2], &[5.0, 7.0, -1.0, 0.0]), Tensor::int(vec![1, 2], DType::I64, vec![1, 0]).unwrap()],
    );
    assert_eq!(out[0], vec![1.0, 0.0, 1.0, 0.0]);
    for (e, (&y, &d)) in out[0].iter().zip(&out[1]).enumerate() {
        let kept = crate::interp::random::dropout_keeps(5, 3, 0, e as u64, 0.5);
        assert_eq!(d, if kept { 2.0 * y } else { 0.0 });
    }
}

#[test]
fn text_form_is_stable() {
    let text = bias_layer_norm().to_text();
    let want = "\
kernel bias_ln over [2, 4] {
  in0 = %x: f32[2, 4]
  in1 = %b: f32[4] axes=[1]
  out0 = %sum: f32[2, 4]
  out1 = %y: f32[2, 4]
  v0 = load in0
  v1 = load in1
  v2 = add v0, v1
  v3 = row_len
  v4 = reduce_sum v2
  v5 = div v4, v3
  v6 = sub v2, v5
  v7 = mul v6, v6
  v8 = reduce_sum v7
  v9 = div v8, v3
  v10 = const 1e-300
  v11 = add v9, v10
  v12 = rsqrt v11
  v13 = mul v6, v12
  store out0 = v2
  store out1 = v13
}
";
    assert_eq!(text, want);
}

#[test]
fn serde_round_trips_through_a_graph_file() {
    let kernel = bias_layer_norm();
    let mut g = Graph::new("k");
    let x = g.input("x", kernel.inputs[0].ty.clone()).unwrap();
    let b = g.input("b", kernel.inputs[1].ty.clone()).unwrap();
    let outs = g.add_multi("fused", Op::Fused { kernel: Box::new(kernel) }, &[x, b]).unwrap();
    g.set_output("y", outs[1]);
    let back = Graph::from_ron(&g.to_ron()).unwrap();
    assert_eq!(back.to_text(), g.to_text());
    assert!(g.to_text().contains("= fused(%x, %b) {kernel=bias_ln}"), "{}", g.to_text());
    let json = serde_json::to_string(&bias_layer_norm()).unwrap();
    assert_eq!(serde_json::from_str::<Kernel>(&json).unwrap(), bias_layer_norm());
}

#[test]
fn check_rejects_malformed_kernels() {
    let mut k = bias_layer_norm();
    k.body[2] = Expr::Binary(Binary::Add, 0, 5);
    assert!(k.check().unwrap_err().contains("not defined before"));
    let mut k = bias_layer_norm();
    k.inputs[1].axes = vec![0];
    assert!(k.check().is_err());
    let mut k = bias_layer_norm();
    k.stores.pop();
    assert!(k.check().is_err());
    // No output: `fuse` once made such a kernel of a dead recomputed value,
    // and the host runtime panicked loading it.
    let mut k = bias_layer_norm();
    (k.outputs, k.stores) = (Vec::new(), Vec::new());
    assert!(k.check().unwrap_err().contains("has no output"), "{:?}", k.check());
    // A wrong operand type is a type error of the node.
    let mut g = Graph::new("k");
    let x = g.input("x", f32t(shape![2, 5])).unwrap();
    let b = g.input("b", f32t(shape![4])).unwrap();
    let err = g.add_multi("fused", Op::Fused { kernel: Box::new(bias_layer_norm()) }, &[x, b]).unwrap_err();
    assert!(err.message.contains("operand 0"), "{err}");
}

/// Over `[2, 2, 3]`: `dy` stored per element, `Σ_rows dy·x` per column,
/// `Σ dy` per `[2, 3]` (over axis 1), `Σ x²` as a scalar, and `Σ_row x`
/// per row (over the last axis).
fn cross_row() -> Kernel {
    let s = shape![2, 2, 3];
    let mut k = KernelBuilder::new("cross", s.clone());
    let x = k.load("x", f32t(s.clone()), vec![0, 1, 2]);
    let dy = k.load("dy", f32t(s.clone()), vec![0, 1, 2]);
    let p = k.binary(Binary::Mul, dy, x);
    let x2 = k.binary(Binary::Mul, x, x);
    k.store("dy_copy", f32t(s), dy);
    k.store_sum("dgamma", f32t(shape![3]), vec![2], p);
    k.store_sum("db", f32t(shape![2, 3]), vec![0, 2], dy);
    k.store_sum("sq", f32t(shape![]), vec![], x2);
    k.store_sum("row", f32t(shape![2, 2]), vec![0, 1], x);
    k.finish().unwrap()
}

#[test]
fn cross_row_outputs_sum_over_the_omitted_axes() {
    let xs: Vec<f64> = (0..12).map(|i| i as f64 * 0.5 - 2.0).collect();
    let dys: Vec<f64> = (0..12).map(|i| (i * 7 % 5) as f64 - 1.5).collect();
    let out = run(&cross_row(), vec![t(vec![2, 2, 3], &xs), t(vec![2, 2, 3], &dys)]);
    assert_eq!(out[0], dys);
    // Accumulated from 0.0 in element order, exactly.
    let mut dgamma = [0.0; 3];
    let mut db = [0.0; 6];
    let mut sq = 0.0;
    let mut row = [0.0; 4];
    for e in 0..12 {
        let (b, j) = (e / 6, e % 3);
        dgamma[j] += dys[e] * xs[e];
        db[b * 3 + j] += dys[e];
        sq += xs[e] * xs[e];
        row[e / 3] += xs[e];
    }
    assert_eq!(out[1], dgamma);
    assert_eq!(out[2], db);
    assert_eq!(out[3], vec![sq]);
    assert_eq!(out[4], row);
    // By hand: Σ x² over −2, −1.5, …, 3.5 is 42.5.
    assert_eq!(sq, 42.5);
}

#[test]
fn cross_row_outputs_in_text_check_and_serde() {
    let k = cross_row();
    let text = k.to_text();
    assert!(text.contains("out1 = %dgamma: f32[3] axes=[2] sum\n"), "{text}");
    assert!(text.contains("out3 = %sq: f32[] axes=[] sum\n"), "{text}");
    assert!(text.contains("out0 = %dy_copy: f32[2, 2, 3]\n"), "{text}");
    let json = serde_json::to_string(&k).unwrap();
    assert_eq!(serde_json::from_str::<Kernel>(&json).unwrap(), k);
    // Old kernels without `epilogue_of` still read.
    let old = json.replace(",\"epilogue_of\":null", "");
    assert_ne!(old, json);
    assert_eq!(serde_json::from_str::<Kernel>(&old).unwrap(), k);
    // Dimensions must match the kernel axes they run along; axes increase.
    let mut bad = cross_row();
    bad.outputs[1].axes = vec![1];
    assert!(bad.check().unwrap_err().contains("kernel axis 1"), "{:?}", bad.check());
    let mut bad = cross_row();
    bad.outputs[2].axes = vec![2, 0];
    assert!(bad.check().is_err());
    let mut bad = cross_row();
    bad.outputs[3].ty = TensorType::new(shape![], DType::I64);
    assert!(bad.check().is_err());
}

#[test]
fn epilogue_and_pow_in_text_and_interpreter() {
    let mut k = KernelBuilder::new("ep", shape![1, 2]);
    let x = k.load("x", f32t(shape![1, 2]), vec![0, 1]);
    let t2 = k.load("t", f32t(shape![]), vec![]);
    let p = k.binary(Binary::Pow, x, t2);
    k.store("y", f32t(shape![1, 2]), p);
    k.set_epilogue_of("mm");
    let kernel = k.finish().unwrap();
    assert!(kernel.to_text().starts_with("kernel ep over [1, 2] epilogue of %mm {\n"), "{}", kernel.to_text());
    assert!(kernel.to_text().contains("v2 = pow v0, v1\n"));
    let out = run(&kernel, vec![t(vec![1, 2], &[3.0, 0.5]), t(vec![], &[2.0])]);
    assert_eq!(out[0], vec![9.0, 0.25]);
}

#[test]
fn layout_classes_and_sweeps_of_layer_norm() {
    use layout::{Class::*, Layout};
    let l = Layout::bind(&bias_layer_norm(), &[2, 4]).unwrap();
    assert_eq!((l.shape.as_slice(), l.width, l.rows), (&[2, 4][..], 4, 2));
    // x, b, x+b, row_len, Σ, μ, x−μ, (x−μ)², Σ, σ², eps, σ²+eps, rsqrt, y.
    assert_eq!(
        l.class,
        [Element, Element, Element, Uniform, Row, Row, Element, Element, Row, Row, Uniform, Row, Row, Element]
    );
    assert_eq!(l.level, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 0, 2, 2, 2]);
    assert_eq!(l.reduction_sweeps, 2);
    let (x, b) = (&l.inputs[0], &l.inputs[1]);
    assert_eq!((x.len, x.strides.as_slice(), x.along_row, x.scalar), (8, &[4, 1][..], true, false));
    assert_eq!((b.len, b.strides.as_slice(), b.along_row, b.scalar), (4, &[0, 1][..], true, false));
    assert!(l.outputs.iter().all(|o| !o.cross_row && o.strides == [4, 1]));
}

#[test]
fn layout_of_per_row_scalar_and_cross_row_operands() {
    use layout::{Class::*, Layout};
    let mut k = KernelBuilder::new("rows", shape![2, 3]);
    let r = k.load("r", f32t(shape![2]), vec![0]);
    let s = k.load("s", f32t(shape![]), vec![]);
    let rs = k.binary(Binary::Mul, r, s);
    k.store("y", f32t(shape![2, 3]), rs);
    let l = Layout::bind(&k.finish().unwrap(), &[2, 3]).unwrap();
    assert_eq!(l.class, [Row, Uniform, Row]);
    assert_eq!(l.reduction_sweeps, 0);
    let (r, s) = (&l.inputs[0], &l.inputs[1]);
    assert_eq!((r.len, r.strides.as_slice(), r.along_row, r.scalar), (2, &[1, 0][..], false, false));
    assert_eq!((s.len, s.strides.as_slice(), s.along_row, s.scalar), (1, &[0, 0][..], false, true));

    // dy_copy, dgamma [2], db [0, 2], sq [], row [0, 1] over [2, 2, 3].
    let l = Layout::bind(&cross_row(), &[2, 2, 3]).unwrap();
    let o = &l.outputs;
    assert_eq!(o.iter().map(|o| o.cross_row).collect::<Vec<_>>(), [false, true, true, true, true]);
    assert_eq!(o.iter().map(|o| o.len).collect::<Vec<_>>(), [12, 3, 6, 1, 4]);
    assert_eq!(o[1].strides, [0, 0, 1]);
    assert_eq!(o[2].strides, [3, 0, 1]);
    assert_eq!(o[4].strides, [2, 1, 0]);
    assert!(o[3].scalar && !o[4].along_row && o[2].along_row);
    assert_eq!(l.rows, 4);
}

#[test]
fn layout_rejects_dims_that_do_not_fit() {
    use crate::shape::Dim;
    use layout::Layout;
    let k = bias_layer_norm();
    assert!(Layout::bind(&k, &[2]).unwrap_err().contains("rank"));
    assert_eq!(Layout::bind(&k, &[3, 4]).unwrap_err(), "axis 0 is the constant 2 but dims give 3");
    let mut big = KernelBuilder::new("big", Shape::new([Dim::symbol("n"), Dim::symbol("m")]));
    let x = big.load("x", f32t(big.shape().clone()), vec![0, 1]);
    big.store("y", f32t(big.shape().clone()), x);
    let err = Layout::bind(&big.finish().unwrap(), &[1 << 32, 1 << 30]).unwrap_err();
    assert!(err.contains("more elements than fit"), "{err}");
}

/// `y = x·b·s` kept by dropout, `Σ x²` and the per-column `Σ x` over
/// `[2, 12]`.
fn splittable() -> Kernel {
    let mut k = KernelBuilder::new("split", shape![2, 12]);
    let x = k.load("x", f32t(shape![2, 12]), vec![0, 1]);
    let b = k.load("b", f32t(shape![12]), vec![1]);
    let s = k.load("s", f32t(shape![]), vec![]);
    let xb = k.binary(Binary::Mul, x, b);
    let y = k.binary(Binary::Mul, xb, s);
    let keep = k.push(Expr::Keep { p: 0.5, stream: 1 });
    let zero = k.constant(0.0);
    let kept = k.select(keep, y, zero);
    let x2 = k.binary(Binary::Mul, x, x);
    k.store("y", f32t(shape![2, 12]), kept);
    k.store_sum("sq", f32t(shape![]), vec![], x2);
    k.store_sum("col", f32t(shape![12]), vec![1], x);
    k.finish().unwrap()
}

#[test]
fn a_split_row_computes_the_same_function() {
    let kernel = splittable();
    let (split, dims) = kernel.split_row(&[2, 12], 4).unwrap();
    split.check().unwrap();
    assert_eq!(dims, [2, 3, 4]);
    assert_eq!(split.shape, shape![2, 3, 4]);
    assert_eq!(split.inputs[1].axes, [1, 2]);
    assert_eq!(split.inputs[2].axes, Vec::<usize>::new());
    assert_eq!(split.outputs[2].ty.shape, shape![3, 4]);
    let xs: Vec<f64> = (0..24).map(|i| (i * 5 % 7) as f64 - 2.5).collect();
    let bs: Vec<f64> = (0..12).map(|i| 0.25 * i as f64 - 1.0).collect();
    let whole = run(&kernel, vec![t(vec![2, 12], &xs), t(vec![12], &bs), t(vec![], &[1.5])]);
    let parts = run(&split, vec![t(vec![2, 3, 4], &xs), t(vec![3, 4], &bs), t(vec![], &[1.5])]);
    // Same elements in the same row-major order: equal to the bit, dropout
    // included (it hashes the row-major index).
    assert_eq!(whole, parts);
    assert!(whole[0].contains(&0.0) && whole[0].iter().any(|&v| v != 0.0));
}

#[test]
fn rows_that_depend_on_the_whole_row_are_not_split() {
    assert!(bias_layer_norm().split_row(&[2, 4], 2).is_none());
    assert!(splittable().split_row(&[2, 12], 5).is_none());
    assert_eq!(split_row_length(7_077_888, MAX_SPLIT_ROW), Some(4096));
    // 23,835,648 = 2¹⁰·3·7759: no multiple of 8 between 2048 and 4096 divides it.
    assert_eq!(split_row_length(23_835_648, MAX_SPLIT_ROW), Some(3072));
    assert_eq!(split_row_length(4096, MAX_SPLIT_ROW), None);
    // A prime width has no divisor to split at.
    assert_eq!(split_row_length(1_000_003, MAX_SPLIT_ROW), None);
}
