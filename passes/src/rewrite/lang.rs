//! The e-graph language of a rewrite region, and its shape analysis.
//!
//! A region is a set of matmuls `x @ wᵀ` of one layer. Values from outside
//! the region (activations, weights) are [`TensorLang::Leaf`]s whose types
//! the analysis looks up in [`Shapes::leaves`]; every other e-class gets its
//! shape and dtype from its operands.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use egg::{Analysis, DidMerge, EGraph, Id, Symbol, define_language};
use zeroplan_ir::{DType, Dim};

// Terms of a region: `(mm_t x w)` is `x @ wᵀ` (`matmul {transpose_b:
// true}`); `(concat0 a b …)` concatenates along axis 0; `(cols start len t)`
// is columns `[start, start+len)` of `t`'s last axis (one output of a
// split); a `Leaf` is a value from outside the region. The clean-up
// terms: `(transpose p t)`, `(reshape s t)` and `(scale f t)` carry their
// attribute as a first child, an e-class holding a `Perm` (`perm[1,0,2]`),
// a `Dims` (`dims[batch,seq,768]`) or a `Factor` (`factor[0.125]`).
define_language! {
    /// Terms of a region (see the comment above).
    pub enum TensorLang {
        "mm_t" = MatMulT([Id; 2]),
        "concat0" = Concat(Vec<Id>),
        "cols" = Cols([Id; 3]),
        "transpose" = Transpose([Id; 2]),
        "reshape" = Reshape([Id; 2]),
        "scale" = Scale([Id; 2]),
        Perm(Perm),
        Dims(Dims),
        Factor(Factor),
        Num(i64),
        Leaf(Symbol),
    }
}

/// A transpose's permutation: output axis `d` is input axis `perm[d]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Perm(pub Vec<usize>);

/// A reshape's target shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dims(pub Vec<Dim>);

/// A scale's factor, by its bits (so that it hashes and orders).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Factor(pub u64);

impl Factor {
    pub fn new(value: f64) -> Factor {
        Factor(value.to_bits())
    }

    pub fn value(self) -> f64 {
        f64::from_bits(self.0)
    }
}

fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, head: &str, items: &[T]) -> fmt::Result {
    // Brackets and no spaces: an s-expression atom needs no quotes.
    let items: Vec<String> = items.iter().map(|i| i.to_string().replace(' ', "")).collect();
    write!(f, "{head}[{}]", items.join(","))
}

fn parse_list<T: FromStr>(s: &str, head: &str) -> Result<Vec<T>, String> {
    let inner = s.strip_prefix(head).and_then(|s| s.strip_prefix('[')).and_then(|s| s.strip_suffix(']'));
    let inner = inner.ok_or_else(|| format!("`{s}` is not a {head}[…]"))?;
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    inner.split(',').map(|i| i.trim().parse().map_err(|_| format!("bad item `{i}` in `{s}`"))).collect()
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        list(f, "perm", &self.0)
    }
}

impl FromStr for Perm {
    type Err = String;
    fn from_str(s: &str) -> Result<Perm, String> {
        parse_list(s, "perm").map(Perm)
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        list(f, "dims", &self.0)
    }
}

impl FromStr for Dims {
    type Err = String;
    fn from_str(s: &str) -> Result<Dims, String> {
        parse_list(s, "dims").map(Dims)
    }
}

impl fmt::Display for Factor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "factor[{}]", self.value())
    }
}

impl FromStr for Factor {
    type Err = String;
    fn from_str(s: &str) -> Result<Factor, String> {
        let inner = s.strip_prefix("factor[").and_then(|s| s.strip_suffix(']'));
        let inner = inner.ok_or_else(|| format!("`{s}` is not a factor[…]"))?;
        inner.parse::<f64>().map(Factor::new).map_err(|e| format!("`{s}`: {e}"))
    }
}

/// What a region knows of a leaf.
#[derive(Clone, Debug, PartialEq)]
pub struct LeafInfo {
    pub shape: Vec<Dim>,
    pub dtype: DType,
    /// The rank of a parameter leaf in graph order (merges concatenate in
    /// this order); `None` for other values.
    pub param: Option<usize>,
}

/// The analysis data of an e-class: shape and dtype, whether it is a
/// parameter leaf, or an integer constant.
#[derive(Clone, Debug, PartialEq)]
pub enum Info {
    Tensor(LeafInfo),
    Num(i64),
    /// A clean-up term's attribute.
    Perm(Vec<usize>),
    Dims(Vec<Dim>),
    Factor(f64),
    /// Ill-typed (never built by the rules; kept total for safety).
    Unknown,
}

impl Info {
    pub fn tensor(&self) -> Option<&LeafInfo> {
        match self {
            Info::Tensor(t) => Some(t),
            _ => None,
        }
    }

    pub fn num(&self) -> Option<i64> {
        match self {
            Info::Num(n) => Some(*n),
            _ => None,
        }
    }
}

/// Shape and dtype inference over [`TensorLang`].
#[derive(Clone, Debug, Default)]
pub struct Shapes {
    pub leaves: HashMap<Symbol, LeafInfo>,
}

pub type RegionGraph = EGraph<TensorLang, Shapes>;

fn tensor(shape: Vec<Dim>, dtype: DType) -> Info {
    Info::Tensor(LeafInfo { shape, dtype, param: None })
}

impl Analysis<TensorLang> for Shapes {
    type Data = Info;

    fn make(egraph: &mut RegionGraph, enode: &TensorLang, _: Id) -> Info {
        let t = |id: &Id| egraph[*id].data.tensor().cloned();
        let n = |id: &Id| egraph[*id].data.num();
        let made = match enode {
            TensorLang::Num(v) => Some(Info::Num(*v)),
            TensorLang::Leaf(s) => egraph.analysis.leaves.get(s).cloned().map(Info::Tensor),
            TensorLang::Perm(p) => Some(Info::Perm(p.0.clone())),
            TensorLang::Dims(d) => Some(Info::Dims(d.0.clone())),
            TensorLang::Factor(f) => Some(Info::Factor(f.value())),
            TensorLang::Transpose([p, x]) => (|| {
                let Info::Perm(p) = &egraph[*p].data else { return None };
                let x = t(x)?;
                let mut seen = vec![false; x.shape.len()];
                let valid = p.len() == seen.len()
                    && p.iter().all(|&a| a < seen.len() && !std::mem::replace(&mut seen[a], true));
                valid.then_some(())?;
                Some(tensor(p.iter().map(|&a| x.shape[a].clone()).collect(), x.dtype))
            })(),
            TensorLang::Reshape([s, x]) => (|| {
                let Info::Dims(s) = &egraph[*s].data else { return None };
                Some(tensor(s.clone(), t(x)?.dtype))
            })(),
            TensorLang::Scale([f, x]) => (|| {
                let Info::Factor(_) = &egraph[*f].data else { return None };
                let x = t(x)?;
                Some(tensor(x.shape, x.dtype))
            })(),
            TensorLang::MatMulT([x, w]) => (|| {
                let (x, w) = (t(x)?, t(w)?);
                let (k, rows) = x.shape.split_last()?;
                (w.shape.len() == 2 && &w.shape[1] == k && w.dtype == x.dtype).then_some(())?;
                let mut shape = rows.to_vec();
                shape.push(w.shape[0].clone());
                Some(tensor(shape, x.dtype))
            })(),
            TensorLang::Concat(parts) => (|| {
                let first = t(parts.first()?)?;
                let mut rows = first.shape.first()?.clone();
                for p in &parts[1..] {
                    let p = t(p)?;
                    (p.shape[1..] == first.shape[1..] && p.dtype == first.dtype).then_some(())?;
                    rows = rows.checked_add(p.shape.first()?)?;
                }
                let mut shape = first.shape.clone();
                shape[0] = rows;
                Some(tensor(shape, first.dtype))
            })(),
            TensorLang::Cols([start, len, x]) => (|| {
                let (start, len, x) = (n(start)?, n(len)?, t(x)?);
                let last = x.shape.last()?.as_constant()?;
                (start >= 0 && len > 0 && (start + len) as u64 <= last).then_some(())?;
                let mut shape = x.shape.clone();
                *shape.last_mut()? = Dim::constant(len as u64);
                Some(tensor(shape, x.dtype))
            })(),
        };
        made.unwrap_or(Info::Unknown)
    }

    fn merge(&mut self, to: &mut Info, from: Info) -> DidMerge {
        // Equal e-classes have equal types; a leaf keeps its parameter rank.
        match (&*to, from) {
            (Info::Unknown, from) if from != Info::Unknown => {
                *to = from;
                DidMerge(true, false)
            }
            (Info::Tensor(a), Info::Tensor(b)) if a.param.is_none() && b.param.is_some() => {
                *to = Info::Tensor(b);
                DidMerge(true, false)
            }
            _ => DidMerge(false, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_print_as_plain_atoms_and_parse_back() {
        let perm = Perm(vec![1, 0, 2]);
        let dims = Dims(vec!["batch*seq".parse().unwrap(), Dim::constant(8)]);
        let factor = Factor::new(0.125);
        assert_eq!(perm.to_string(), "perm[1,0,2]");
        assert_eq!(perm.to_string().parse::<Perm>().unwrap(), perm);
        assert_eq!(dims.to_string().parse::<Dims>().unwrap(), dims);
        assert_eq!(factor.to_string(), "factor[0.125]");
        assert_eq!(factor.to_string().parse::<Factor>().unwrap(), factor);
        assert!("perm(1)".parse::<Perm>().is_err() && "x".parse::<Factor>().is_err());
        let expr: egg::RecExpr<TensorLang> = "(transpose perm[1,0] (scale factor[2] x))".parse().unwrap();
        assert_eq!(expr.to_string(), "(transpose perm[1,0] (scale factor[2] x))");
    }
}
