//! The reference interpreter on whole graphs: sources and symbol binding,
//! precision modes, the step driver's phases and updates, run-time errors,
//! and the tiny BERT forward pass. Per-op semantics are tested next to each
//! kernel in `ir/src/interp/`.

mod common;

use common::load_model;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Feeds, Interpreter, Rounding, State};
use zeroplan_ir::{DType, Dim, Graph, Init, Op, Phase, Shape, Tensor, TensorType, Value};

fn ty(dims: Vec<Dim>, dtype: DType) -> TensorType {
    TensorType::new(Shape(dims), dtype)
}

fn c(n: u64) -> Dim {
    Dim::constant(n)
}

fn f32s(shape: Vec<usize>, v: &[f64]) -> Tensor {
    Tensor::float(shape, DType::F32, v.to_vec()).unwrap()
}

fn ids(shape: Vec<usize>, v: &[i64]) -> Tensor {
    Tensor::int(shape, DType::I64, v.to_vec()).unwrap()
}

fn feeds(items: Vec<(&str, Tensor)>) -> Feeds {
    items.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

const F64: Interpreter = Interpreter { rounding: Rounding::F64, seed: 1 };
const NATIVE: Interpreter = Interpreter { rounding: Rounding::Native, seed: 1 };

/// A batch of 2×5 tokens for the tiny BERT (vocab 64), two labels ignored.
fn tiny_batch() -> Feeds {
    feeds(vec![
        ("input_ids", ids(vec![2, 5], &[2, 17, 33, 9, 3, 2, 60, 4, 3, 0])),
        ("token_type_ids", ids(vec![2, 5], &[0, 0, 0, 1, 1, 0, 0, 0, 0, 0])),
        ("attention_mask", ids(vec![2, 5], &[1, 1, 1, 1, 1, 1, 1, 1, 1, 0])),
        ("labels", ids(vec![2, 5], &[-100, 17, 5, 9, 63, -100, 1, 2, 3, 0])),
    ])
}

#[test]
fn tiny_bert_loss_at_init_is_near_ln_vocab() {
    let spec = load_model("tiny/tiny-bert.ron");
    let graph = forward(&spec, &BuildOptions::default()).unwrap();
    for interp in [F64, NATIVE] {
        let state = interp.init_state(&graph).unwrap();
        let values = interp.evaluate(&graph, &state, &tiny_batch(), 0).unwrap();
        let loss = values.output("loss").unwrap().item().unwrap();
        // Logits have std ≈ 0.02·√32 at init, so the loss is ln 64 plus a little.
        assert!(loss.is_finite() && (loss - 64f64.ln()).abs() < 0.1, "{interp:?}: loss {loss}");
        assert_eq!(values.graph_output(&graph, "logits").unwrap().shape(), &[2, 5, 64]);
        assert!(values.output("logits").is_none(), "node names are not output names");
        assert_eq!(values.bindings()["seq"], 5);
        // Dropout draws another mask at another offset.
        let other = interp.evaluate(&graph, &state, &tiny_batch(), 1).unwrap();
        assert_ne!(other.output("loss").unwrap().item().unwrap(), loss);
        let again = interp.evaluate(&graph, &state, &tiny_batch(), 0).unwrap();
        assert_eq!(again.output("loss").unwrap().item().unwrap(), loss);
    }
}

#[test]
fn tiny_bert_in_bf16_agrees_with_f64() {
    let spec = load_model("tiny/tiny-bert.ron");
    let bf16 = forward(&spec, &BuildOptions::new(DType::BF16)).unwrap();
    let state = NATIVE.init_state(&bf16).unwrap();
    assert!(state.values().all(|t| t.dtype() == DType::BF16));
    let native = NATIVE.evaluate(&bf16, &state, &tiny_batch(), 0).unwrap();
    let exact = F64.evaluate(&bf16, &state, &tiny_batch(), 0).unwrap();
    let (a, b) = (native.output("loss").unwrap().item().unwrap(), exact.output("loss").unwrap().item().unwrap());
    assert!((a - b).abs() < 0.05, "bf16 {a} vs f64 {b}");
    // Every bf16 activation in Native mode is a bf16 value.
    for (_, outs) in native.iter() {
        for t in outs.iter().filter(|t| t.dtype() == DType::BF16) {
            assert!(t.floats().unwrap().iter().all(|&x| zeroplan_ir::to_bf16(x).to_f64() == x || x.is_nan()));
        }
    }
}

#[test]
fn native_rounds_each_output_and_f64_never_does() {
    // bf16 has 8 significant bits: 1 + 2⁻⁹ rounds to 1, and 1 + 3·2⁻⁹ to 1 + 2⁻⁷.
    let mut g = Graph::new("g");
    let x = g.input("x", ty(vec![c(2)], DType::BF16)).unwrap();
    let y = g.input("y", ty(vec![c(2)], DType::BF16)).unwrap();
    g.add("sum", Op::Add, &[x, y]).unwrap();
    let wide = g.input("wide", ty(vec![c(1)], DType::F32)).unwrap();
    g.add("narrow", Op::Cast { to: DType::BF16 }, &[wide]).unwrap();
    let tiny = 2f64.powi(-9);
    let f = feeds(vec![
        ("x", Tensor::float(vec![2], DType::BF16, vec![1.0, 1.0]).unwrap()),
        ("y", Tensor::float(vec![2], DType::BF16, vec![tiny, 3.0 * tiny]).unwrap()),
        ("wide", f32s(vec![1], &[1.0 + 3.0 * tiny])),
    ]);
    let native = NATIVE.evaluate(&g, &State::new(), &f, 0).unwrap();
    assert_eq!(native.output("sum").unwrap().floats().unwrap(), &[1.0, 1.0 + 4.0 * tiny]);
    assert_eq!(native.output("narrow").unwrap().floats().unwrap(), &[1.0 + 4.0 * tiny]);
    let exact = F64.evaluate(&g, &State::new(), &f, 0).unwrap();
    assert_eq!(exact.output("sum").unwrap().floats().unwrap(), &[1.0 + tiny, 1.0 + 3.0 * tiny]);
    assert_eq!(exact.output("narrow").unwrap().floats().unwrap(), &[1.0 + 3.0 * tiny]);
    assert_eq!(exact.output("narrow").unwrap().dtype(), DType::BF16);
}

#[test]
fn sources_arange_fill_and_symbol_binding() {
    let mut g = Graph::new("g");
    let x = g.input("x", ty(vec![Dim::symbol("batch"), Dim::symbol("seq")], DType::I64)).unwrap();
    let positions = g.source("positions", Op::Arange, ty(vec![Dim::symbol("seq")], DType::I64)).unwrap();
    g.add("shifted", Op::Add, &[x, positions]).unwrap();
    g.source("half", Op::Fill { value: 0.5 }, ty(vec![Dim::symbol("batch"), c(2)], DType::F32)).unwrap();
    g.source("three", Op::Fill { value: 3.7 }, ty(vec![c(2)], DType::I32)).unwrap();
    let v = F64.evaluate(&g, &State::new(), &feeds(vec![("x", ids(vec![2, 3], &[10, 20, 30, 40, 50, 60]))]), 0);
    let v = v.unwrap();
    assert_eq!(v.output("positions").unwrap().ints().unwrap(), &[0, 1, 2]);
    assert_eq!(v.output("shifted").unwrap().ints().unwrap(), &[10, 21, 32, 40, 51, 62]);
    assert_eq!(v.output("half").unwrap().shape(), &[2, 2]);
    assert_eq!(v.output("half").unwrap().floats().unwrap(), &[0.5; 4]);
    assert_eq!(v.output("three").unwrap().ints().unwrap(), &[3, 3]);
    let x_value = Value { node: g.node_by_name("x").unwrap(), output: 0 };
    assert_eq!(v.value(&g, x_value).shape(), &[2, 3]);
}

#[test]
fn run_time_errors_name_the_node() {
    let mut g = Graph::new("g");
    let x = g.input("x", ty(vec![Dim::symbol("batch"), Dim::symbol("seq")], DType::I64)).unwrap();
    g.add("window", Op::Slice { axis: 1, start: 3, len: 4 }, &[x]).unwrap();
    let err = F64.evaluate(&g, &State::new(), &feeds(vec![("x", ids(vec![1, 5], &[0; 5]))]), 0).unwrap_err();
    assert_eq!(err.node, "window");
    assert!(err.to_string().contains("out of axis 1 of length 5"), "{err}");
    // Long enough: fine.
    assert!(F64.evaluate(&g, &State::new(), &feeds(vec![("x", ids(vec![1, 7], &[0; 7]))]), 0).is_ok());
    // Missing and mistyped inputs.
    assert_eq!(F64.evaluate(&g, &State::new(), &Feeds::new(), 0).unwrap_err().node, "x");
    let wrong = feeds(vec![("x", f32s(vec![1, 7], &[0.0; 7]))]);
    assert_eq!(F64.evaluate(&g, &State::new(), &wrong, 0).unwrap_err().node, "x");

    // An unbound symbol.
    let mut g = Graph::new("g");
    g.source("zeros", Op::Fill { value: 0.0 }, ty(vec![Dim::symbol("seq")], DType::F32)).unwrap();
    let err = F64.evaluate(&g, &State::new(), &Feeds::new(), 0).unwrap_err();
    assert_eq!(err.node, "zeros");
    assert!(err.message.contains("`seq`"), "{err}");

    // A bad id, and a missing parameter.
    let mut g = Graph::new("g");
    let table = g.param("table", ty(vec![c(4), c(2)], DType::F32), Init::Ones).unwrap();
    let i = g.input("ids", ty(vec![c(2)], DType::I64)).unwrap();
    g.add("embed", Op::Embedding, &[table, i]).unwrap();
    let state = F64.init_state(&g).unwrap();
    let err = F64.evaluate(&g, &state, &feeds(vec![("ids", ids(vec![2], &[1, 4]))]), 0).unwrap_err();
    assert_eq!(err.node, "embed");
    assert!(err.message.contains("id 4"), "{err}");
    let err = F64.evaluate(&g, &State::new(), &feeds(vec![("ids", ids(vec![2], &[1, 2]))]), 0).unwrap_err();
    assert_eq!(err.node, "table");
}

#[test]
fn init_state_covers_params_and_states_in_order() {
    let mut g = Graph::new("g");
    let shape = ty(vec![c(3), c(4)], DType::F32);
    g.param("a", shape.clone(), Init::Normal { std: 1.0 }).unwrap();
    g.param("b", shape.clone(), Init::Normal { std: 1.0 }).unwrap();
    g.source("m", Op::State { init: Init::Zeros }, shape.clone()).unwrap();
    g.source("scale", Op::State { init: Init::Constant { value: 65536.0 } }, ty(vec![], DType::F32)).unwrap();
    let s = F64.init_state(&g).unwrap();
    assert_eq!(s.len(), 4);
    assert_ne!(s["a"], s["b"], "each parameter has its own ordinal");
    assert_eq!(s["m"].floats().unwrap(), &[0.0; 12]);
    assert_eq!(s["scale"].item(), Some(65536.0));
    // Another seed, other values; the same seed, the same values.
    assert_ne!(Interpreter { seed: 2, ..F64 }.init_state(&g).unwrap()["a"], s["a"]);
    assert_eq!(F64.init_state(&g).unwrap(), s);
}

/// `y = x·w` (forward); `acc ← acc + x` (backward, a stand-in gradient);
/// `w ← w − acc`, `acc ← 0` (optimizer). With `read_forward`, the optimizer
/// also reads `y` directly.
fn accumulating_graph(read_forward: bool) -> Graph {
    let mut g = Graph::new("acc");
    let vec2 = ty(vec![c(2)], DType::F32);
    let x = g.input("x", vec2.clone()).unwrap();
    let w = g.param("w", vec2.clone(), Init::Ones).unwrap();
    let acc = g.source("acc", Op::State { init: Init::Zeros }, vec2.clone()).unwrap();
    let y = g.add("y", Op::Mul, &[x, w]).unwrap();
    g.set_output("y", y);
    g.phase = Phase::Backward;
    let summed = g.add("acc.next", Op::Add, &[acc, x]).unwrap();
    g.set_update(acc.node, summed).unwrap();
    g.phase = Phase::Optimizer;
    let mut step = g.add("w.next", Op::Sub, &[w, acc]).unwrap();
    if read_forward {
        step = g.add("w.next.plus_y", Op::Add, &[step, y]).unwrap();
    }
    let zero = g.source("zero", Op::Fill { value: 0.0 }, vec2).unwrap();
    g.set_update(acc.node, zero).unwrap();
    g.set_update(w.node, step).unwrap();
    g.set_output("w.next", step);
    g
}

/// A target updated twice in one phase is refused by the verifier, naming
/// it; once in each of two phases (the accumulator above) is a step.
#[test]
fn a_target_updated_twice_in_one_phase_is_refused() {
    let mut g = accumulating_graph(false);
    assert!(g.verify().is_ok());
    let acc = g.node_by_name("acc").unwrap();
    let again = g.node_by_name("w.next").unwrap();
    g.set_update(acc, Value { node: again, output: 0 }).unwrap();
    let e = g.verify().unwrap_err();
    assert!(e.to_string().contains("acc") && e.to_string().contains("updated twice in one phase"), "{e}");
}

#[test]
fn step_accumulates_over_micro_batches_then_updates_once() {
    let g = accumulating_graph(false);
    let mut state = F64.init_state(&g).unwrap();
    let batches = [feeds(vec![("x", f32s(vec![2], &[1.0, 2.0]))]), feeds(vec![("x", f32s(vec![2], &[3.0, 4.0]))])];
    let out = F64.step(&g, &mut state, &batches, 0).unwrap();
    // Both micro-batches see w = 1; the optimizer sees acc = [4, 6].
    assert_eq!(out.micro_batches.len(), 2);
    assert_eq!(out.micro_batches[0]["y"].floats().unwrap(), &[1.0, 2.0]);
    assert_eq!(out.micro_batches[1]["y"].floats().unwrap(), &[3.0, 4.0]);
    assert!(!out.micro_batches[0].contains_key("w.next"));
    assert_eq!(out.optimizer["w.next"].floats().unwrap(), &[-3.0, -5.0]);
    assert_eq!(state["w"].floats().unwrap(), &[-3.0, -5.0]);
    assert_eq!(state["acc"].floats().unwrap(), &[0.0, 0.0]);
    // The next step reads the updated weights.
    let out = F64.step(&g, &mut state, &batches[..1], 1).unwrap();
    assert_eq!(out.micro_batches[0]["y"].floats().unwrap(), &[-3.0, -10.0]);
    assert_eq!(state["w"].floats().unwrap(), &[-4.0, -7.0]);
}

#[test]
fn optimizer_may_read_forward_values_only_with_one_micro_batch() {
    let g = accumulating_graph(true);
    let mut state = F64.init_state(&g).unwrap();
    let one = feeds(vec![("x", f32s(vec![2], &[1.0, 2.0]))]);
    let out = F64.step(&g, &mut state, std::slice::from_ref(&one), 0).unwrap();
    // w − acc + y = [1, 1] − [1, 2] + [1, 2]
    assert_eq!(out.optimizer["w.next"].floats().unwrap(), &[1.0, 1.0]);
    let err = F64.step(&g, &mut state, &[one.clone(), one], 1).unwrap_err();
    assert_eq!(err.node, "w.next.plus_y");
    assert!(err.message.contains("`y`") && err.message.contains("2"), "{err}");
    assert!(F64.step(&g, &mut state, &[], 0).is_err());
}

#[test]
fn step_offsets_dropout_by_step_and_micro_batch() {
    let mut g = Graph::new("drop");
    let x = g.input("x", ty(vec![c(64)], DType::F32)).unwrap();
    let d = g.add("d", Op::Dropout { p: 0.5, stream: 3 }, &[x]).unwrap();
    g.set_output("d", d);
    let f = feeds(vec![("x", f32s(vec![64], &[1.0; 64]))]);
    let mut state = State::new();
    let out = NATIVE.step(&g, &mut state, &[f.clone(), f.clone()], 3).unwrap();
    for (i, offset) in [(0, 6), (1, 7)] {
        let direct = NATIVE.evaluate(&g, &state, &f, offset).unwrap();
        assert_eq!(&out.micro_batches[i]["d"], direct.output("d").unwrap(), "micro-batch {i}");
    }
    assert_ne!(out.micro_batches[0]["d"], out.micro_batches[1]["d"]);
    // Survivors are scaled by 1/(1 − p) = 2.
    assert!(out.micro_batches[0]["d"].floats().unwrap().iter().all(|&v| v == 0.0 || v == 2.0));
}

#[test]
fn optimizer_chain_wires_operands_in_order() {
    // squared_sum → grad_scale → adamw with lr from lr_schedule, then loss scaling.
    let mut g = Graph::new("opt");
    let scalar = ty(vec![], DType::F32);
    let vec1 = ty(vec![c(1)], DType::F32);
    let p = g.param("p", vec1.clone(), Init::Ones).unwrap();
    let grad = g.input("grad", vec1.clone()).unwrap();
    let m = g.source("m", Op::State { init: Init::Zeros }, vec1.clone()).unwrap();
    let v = g.source("v", Op::State { init: Init::Zeros }, vec1).unwrap();
    let done = g.input("done", scalar.clone()).unwrap();
    let t = g.input("t", scalar.clone()).unwrap();
    let scale = g.input("scale", scalar.clone()).unwrap();
    let good = g.input("good", scalar).unwrap();
    let sq = g.add("sq", Op::SquaredSum, &[grad]).unwrap();
    let gs = g.add_multi("gs", Op::GradScale { max_norm: Some(1.0), micro_batches: 1 }, &[sq, scale]).unwrap();
    let lr = g.add("lr", Op::LrSchedule { peak: 0.1, warmup_steps: 2, total_steps: None }, &[done]).unwrap();
    let adam = Op::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    g.add_multi("adam", adam, &[p, grad, m, v, lr, t, gs[0], gs[1]]).unwrap();
    let lsu = Op::LossScaleUpdate { growth_interval: 2, growth: 2.0, backoff: 0.5 };
    g.add_multi("lsu", lsu, &[scale, good, gs[1]]).unwrap();
    let scalar_of = |x: f64| Tensor::scalar(x);
    let mut f = feeds(vec![
        ("grad", f32s(vec![1], &[8.0])),
        ("done", scalar_of(1.0)),
        ("t", scalar_of(2.0)),
        ("scale", scalar_of(2.0)),
        ("good", scalar_of(1.0)),
    ]);
    let state = F64.init_state(&g).unwrap();
    let out = F64.evaluate(&g, &state, &f, 0).unwrap();
    // norm = 8/2 = 4 > 1: multiplier = (1/(4 + 1e-6))/2; g' = 8·multiplier ≈ 1 (clipped, unscaled).
    let mult = 1.0 / (4.0 + 1e-6) / 2.0;
    assert!((out.outputs("gs").unwrap()[0].item().unwrap() - mult).abs() < 1e-15);
    assert_eq!(out.output("lr").unwrap().item(), Some(0.05)); // 1 of 2 warm-up steps
    let gp = 8.0 * mult;
    let (m1, v1) = (0.1 * gp, 0.001 * gp * gp);
    let want = 1.0 - 0.05 * (m1 / (1.0 - 0.81)) / ((v1 / (1.0 - 0.998001)).sqrt() + 1e-8);
    let adam = out.outputs("adam").unwrap();
    assert!((adam[0].item().unwrap() - want).abs() < 1e-12, "{adam:?} vs {want}");
    assert!((adam[1].item().unwrap() - m1).abs() < 1e-15);
    // good 1 + 1 reaches the interval 2: the scale doubles.
    let lsu = out.outputs("lsu").unwrap();
    assert_eq!((lsu[0].item(), lsu[1].item()), (Some(4.0), Some(0.0)));
    // An infinite gradient: nothing moves, the scale backs off.
    f.insert("grad".into(), f32s(vec![1], &[f64::INFINITY]));
    let out = F64.evaluate(&g, &state, &f, 0).unwrap();
    assert_eq!(out.outputs("adam").unwrap()[0].item(), Some(1.0));
    let lsu = out.outputs("lsu").unwrap();
    assert_eq!((lsu[0].item(), lsu[1].item()), (Some(1.0), Some(0.0)));
}
