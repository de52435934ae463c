//! Binding the graph's symbols (`batch`, `seq`) from the fed inputs, and
//! turning symbolic shapes into concrete ones.
//!
//! Each input's declared shape is unified with its fed tensor's shape, axis
//! by axis. An axis whose dimension has exactly one unbound symbol binds it
//! (`batch*seq` binds `seq` once `batch` is known); a dimension with several
//! unbound symbols waits until other axes have bound all but one. Every
//! axis is then checked against the bindings, so inputs that disagree are
//! reported by name rather than producing a wrong shape downstream.

use crate::graph::NodeIndex;

use super::{Feeds, InterpError};
use crate::graph::Graph;
use crate::shape::{Bindings, Dim, Shape};

/// `shape` under `bindings`, or why it has no value.
pub(super) fn concrete_shape(shape: &Shape, bindings: &Bindings) -> Result<Vec<usize>, String> {
    shape.dims().iter().map(|d| concrete_dim(d, bindings)).collect()
}

fn concrete_dim(d: &Dim, bindings: &Bindings) -> Result<usize, String> {
    if let Some(s) = d.symbols().iter().find(|s| !bindings.contains_key(*s)) {
        return Err(format!("dimension `{d}` has the unbound symbol `{s}` ({})", describe(bindings)));
    }
    if let Some(why) = d.indivisible(bindings) {
        return Err(why);
    }
    d.eval(bindings)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("dimension `{d}` overflows under {}", describe(bindings)))
}

/// `batch=2, seq=5`, or `no symbols bound`.
pub(super) fn describe(bindings: &Bindings) -> String {
    if bindings.is_empty() {
        return "no symbols bound".into();
    }
    bindings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// Binds every symbol of the inputs' declared shapes from `feeds`, checking
/// that each input is fed, with its declared dtype, rank and sizes.
pub(super) fn bind_inputs(graph: &Graph, inputs: &[NodeIndex], feeds: &Feeds) -> Result<Bindings, InterpError> {
    // (input name, axis, declared dimension, fed size), still to bind or check.
    let mut pending: Vec<(&str, usize, &Dim, u64)> = Vec::new();
    for &n in inputs {
        let node = graph.node(n);
        let declared = &node.outputs[0];
        let fail = |m: String| InterpError::new(&*node.name, m);
        let fed = feeds.get(&*node.name).ok_or_else(|| fail(format!("input {declared} is not fed")))?;
        if fed.dtype() != declared.dtype || fed.shape().len() != declared.shape.rank() {
            return Err(fail(format!("declared {declared}, but fed {}{:?}", fed.dtype(), fed.shape())));
        }
        for (axis, (dim, &size)) in declared.shape.dims().iter().zip(fed.shape()).enumerate() {
            pending.push((&node.name, axis, dim, size as u64));
        }
    }
    let mut bindings = Bindings::new();
    loop {
        let before = pending.len();
        let mut still = Vec::new();
        for item @ (name, axis, dim, size) in pending {
            let mut unknown: Vec<&String> = dim.symbols().iter().filter(|s| !bindings.contains_key(*s)).collect();
            unknown.dedup(); // symbols are sorted, so repeats are adjacent
            match unknown.as_slice() {
                [] => check(name, axis, dim, size, &bindings)?,
                [s] => {
                    if let Some(v) = solve(dim, s, size, &bindings) {
                        bindings.insert((*s).clone(), v);
                        check(name, axis, dim, size, &bindings)?;
                    } else if known_factor(dim, s, &bindings) == Some(0) {
                        still.push(item); // a zero factor says nothing of `s`: another axis must bind it
                    } else {
                        let why = format!(
                            "axis {axis} is `{dim}`, but the fed size {size} fits no value of `{s}` ({})",
                            describe(&bindings)
                        );
                        return Err(InterpError::new(name, why));
                    }
                }
                _ => still.push(item),
            }
        }
        pending = still;
        if pending.is_empty() || pending.len() == before {
            break;
        }
    }
    if let Some((name, axis, dim, _)) = pending.first() {
        return Err(InterpError::new(
            *name,
            format!("axis {axis} is `{dim}`, whose symbols no input binds one at a time ({})", describe(&bindings)),
        ));
    }
    Ok(bindings)
}

/// `dim` with the unbound symbol `s` set to 1: the factor `s`'s power is multiplied by.
fn known_factor(dim: &Dim, s: &str, bindings: &Bindings) -> Option<u64> {
    let mut with_one = bindings.clone();
    with_one.insert(s.to_string(), 1);
    dim.eval(&with_one)
}

/// The value of the single unbound symbol `s` that makes `dim` equal `size`.
fn solve(dim: &Dim, s: &str, size: u64, bindings: &Bindings) -> Option<u64> {
    let power = dim.symbols().iter().filter(|x| *x == s).count() as u32;
    let known = known_factor(dim, s, bindings)?;
    if known == 0 || !size.is_multiple_of(known) {
        return None;
    }
    let target = size / known;
    // The exact integer `power`-th root of `target`, if there is one.
    let guess = (target as f64).powf(1.0 / f64::from(power)).round() as u64;
    [guess.saturating_sub(1), guess, guess + 1].into_iter().find(|c| c.checked_pow(power) == Some(target))
}

fn check(name: &str, axis: usize, dim: &Dim, size: u64, bindings: &Bindings) -> Result<(), InterpError> {
    let expected = dim.eval(bindings);
    if expected != Some(size) {
        return Err(InterpError::new(
            name,
            format!(
                "axis {axis} is `{dim}` = {}, but the fed tensor has {size} ({})",
                expected.map_or("overflow".into(), |e| e.to_string()),
                describe(bindings)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::shape::TensorType;
    use crate::tensor::Tensor;

    fn ids(shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor::int(shape, DType::I64, vec![0; n]).unwrap()
    }

    fn graph_with(inputs: &[(&str, Shape)]) -> (Graph, Vec<NodeIndex>) {
        let mut g = Graph::new("g");
        let nodes = inputs
            .iter()
            .map(|(name, shape)| g.input(*name, TensorType::new(shape.clone(), DType::I64)).unwrap().node)
            .collect();
        (g, nodes)
    }

    #[test]
    fn binds_products_once_a_factor_is_known() {
        let bs: Dim = "batch*seq".parse().unwrap();
        let (g, inputs) =
            graph_with(&[("flat", Shape(vec![bs])), ("ids", Shape(vec![Dim::symbol("batch"), Dim::symbol("seq")]))]);
        let feeds = Feeds::from([("flat".into(), ids(vec![10])), ("ids".into(), ids(vec![2, 5]))]);
        let b = bind_inputs(&g, &inputs, &feeds).unwrap();
        assert_eq!(b, Bindings::from([("batch".into(), 2), ("seq".into(), 5)]));
    }

    #[test]
    fn disagreeing_inputs_are_named() {
        let (g, inputs) = graph_with(&[
            ("a", Shape(vec![Dim::symbol("batch"), Dim::symbol("seq")])),
            ("b", Shape(vec![Dim::symbol("batch"), Dim::symbol("seq")])),
        ]);
        let feeds = Feeds::from([("a".into(), ids(vec![2, 5])), ("b".into(), ids(vec![2, 6]))]);
        let err = bind_inputs(&g, &inputs, &feeds).unwrap_err();
        assert_eq!(err.node, "b");
        assert!(err.message.contains("seq") && err.message.contains('6'), "{err}");
        let missing = bind_inputs(&g, &inputs, &Feeds::from([("a".into(), ids(vec![2, 5]))])).unwrap_err();
        assert_eq!(missing.node, "b");
        let wrong_dtype = Feeds::from([
            ("a".into(), ids(vec![2, 5])),
            ("b".into(), Tensor::int(vec![2, 5], DType::I32, vec![0; 10]).unwrap()),
        ]);
        assert!(bind_inputs(&g, &inputs, &wrong_dtype).unwrap_err().message.contains("i32"));
    }

    #[test]
    fn squares_and_indivisible_sizes() {
        let sq: Dim = "seq*seq".parse().unwrap();
        let (g, inputs) = graph_with(&[("a", Shape(vec![sq.clone()]))]);
        let b = bind_inputs(&g, &inputs, &Feeds::from([("a".into(), ids(vec![49]))])).unwrap();
        assert_eq!(b["seq"], 7);
        assert!(bind_inputs(&g, &inputs, &Feeds::from([("a".into(), ids(vec![50]))])).is_err());
        let three: Dim = "3*seq".parse().unwrap();
        let (g, inputs) = graph_with(&[("a", Shape(vec![three]))]);
        assert!(bind_inputs(&g, &inputs, &Feeds::from([("a".into(), ids(vec![10]))])).is_err());
    }

    #[test]
    fn unbound_symbols_are_reported() {
        let shape = Shape(vec![Dim::symbol("seq"), Dim::constant(4)]);
        let err = concrete_shape(&shape, &Bindings::new()).unwrap_err();
        assert!(err.contains("`seq`"), "{err}");
        assert_eq!(concrete_shape(&shape, &Bindings::from([("seq".into(), 3)])).unwrap(), vec![3, 4]);
    }
}
