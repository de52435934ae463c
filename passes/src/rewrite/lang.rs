//! The e-graph language of a rewrite region, and its shape analysis.
//!
//! A region is a set of matmuls `x @ wᵀ` of one layer. Values from outside
//! the region (activations, weights) are [`TensorLang::Leaf`]s whose types
//! the analysis looks up in [`Shapes::leaves`]; every other e-class gets its
//! shape and dtype from its operands.

use std::collections::HashMap;

use egg::{Analysis, DidMerge, EGraph, Id, Symbol, define_language};
use zeroplan_ir::{DType, Dim};

// Terms of a region: `(mm_t x w)` is `x @ wᵀ` (`matmul {transpose_b:
// true}`); `(concat0 a b …)` concatenates along axis 0; `(cols start len t)`
// is columns `[start, start+len)` of `t`'s last axis (one output of a
// split); a `Leaf` is a value from outside the region.
define_language! {
    /// Terms of a region (see the comment above).
    pub enum TensorLang {
        "mm_t" = MatMulT([Id; 2]),
        "concat0" = Concat(Vec<Id>),
        "cols" = Cols([Id; 3]),
        Num(i64),
        Leaf(Symbol),
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
            (Info::Unknown, from @ (Info::Tensor(_) | Info::Num(_))) => {
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
