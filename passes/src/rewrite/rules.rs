//! The rewrite rules of a region.
//!
//! `merge-matmuls`: for a matmul `x @ wᵀ` whose `w` is a parameter leaf, the
//! group of all matmuls `x @ wᵢᵀ` on the same `x` (distinct e-classes) whose
//! `wᵢ` are parameter leaves of `w`'s shape and dtype: each member becomes
//! equal to its columns of `x @ concat(w₁, …, wₙ)ᵀ`. The group is built in
//! parameter order, so every member's match adds the same (hash-consed)
//! merged term: groups are disjoint and the rule saturates in two
//! iterations.
//!
//! The clean-ups ([`cleanup_rules`]), over chains of layout and scaling ops:
//! - `compose-transposes`: `(transpose q (transpose p x))` equals
//!   `(transpose p∘q x)` with `(p∘q)[d] = p[q[d]]`, or `x` itself when that
//!   is the identity;
//! - `compose-reshapes`: `(reshape s2 (reshape s1 x))` equals `(reshape s2 x)`
//!   (reshapes are row-major, so the intermediate shape does not matter);
//! - `compose-scales`: `(scale b (scale a x))` equals `(scale a·b x)`, or `x`
//!   when `a·b = 1`;
//! - `identity-transpose`, `identity-reshape`, `identity-scale`: a transpose
//!   by the identity, a reshape to the operand's own shape (by the shape
//!   analysis) and a scale by 1 equal their operand.
//!
//! Each only adds equivalents; extraction chooses what to keep.

use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

use super::lang::{Factor, Info, LeafInfo, Perm, RegionGraph, Shapes, TensorLang};

pub fn rules() -> Vec<Rewrite<TensorLang, Shapes>> {
    let searcher: Pattern<TensorLang> = "(mm_t ?x ?w)".parse().expect("a valid pattern");
    let applier = MergeMatmuls { x: "?x".parse().expect("a var"), w: "?w".parse().expect("a var") };
    vec![Rewrite::new("merge-matmuls", searcher, applier).expect("a valid rule")]
}

struct MergeMatmuls {
    x: Var,
    w: Var,
}

fn param(egraph: &RegionGraph, id: Id) -> Option<&LeafInfo> {
    match &egraph[id].data {
        Info::Tensor(t) if t.param.is_some() && t.shape.len() == 2 && t.shape[0].as_constant().is_some() => Some(t),
        _ => None,
    }
}

impl Applier<TensorLang, Shapes> for MergeMatmuls {
    fn apply_one(
        &self,
        egraph: &mut RegionGraph,
        _: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let x = egraph.find(subst[self.x]);
        let Some(w) = param(egraph, subst[self.w]).cloned() else { return Vec::new() };
        // Every sibling: a parameter of the same shape and dtype applied to the same x.
        let mut members: Vec<(usize, Id, u64)> = Vec::new();
        for class in egraph.classes() {
            for node in &class.nodes {
                let TensorLang::MatMulT([a, b]) = node else { continue };
                if egraph.find(*a) != x {
                    continue;
                }
                let b = egraph.find(*b);
                let Some(p) = param(egraph, b) else { continue };
                if p.shape != w.shape || p.dtype != w.dtype || members.iter().any(|m| m.1 == b) {
                    continue;
                }
                let rows = p.shape[0].as_constant().expect("checked by `param`");
                members.push((p.param.expect("a parameter"), b, rows));
            }
        }
        if members.len() < 2 {
            return Vec::new();
        }
        members.sort();
        let weights: Vec<Id> = members.iter().map(|m| m.1).collect();
        let concat = egraph.add(TensorLang::Concat(weights));
        let merged = egraph.add(TensorLang::MatMulT([x, concat]));
        let mut changed = Vec::new();
        let mut start = 0i64;
        for &(_, b, rows) in &members {
            let original = egraph.lookup(TensorLang::MatMulT([x, b])).expect("the member exists");
            let s = egraph.add(TensorLang::Num(start));
            let l = egraph.add(TensorLang::Num(rows as i64));
            let piece = egraph.add(TensorLang::Cols([s, l, merged]));
            if egraph.union(original, piece) {
                changed.push(original);
            }
            start += rows as i64;
        }
        changed
    }
}

/// The clean-up rules (see the module docs).
pub fn cleanup_rules() -> Vec<Rewrite<TensorLang, Shapes>> {
    let pattern = |s: &str| -> Pattern<TensorLang> { s.parse().expect("a valid pattern") };
    let var = |s: &str| -> Var { s.parse().expect("a var") };
    let rule = |name: &str, searcher: &str, applier: Cleanup| {
        Rewrite::new(name, pattern(searcher), applier).expect("a valid rule")
    };
    let (a, b, x) = (var("?a"), var("?b"), var("?x"));
    vec![
        rule("compose-transposes", "(transpose ?b (transpose ?a ?x))", Cleanup::ComposeTransposes { a, b, x }),
        rule("compose-scales", "(scale ?b (scale ?a ?x))", Cleanup::ComposeScales { a, b, x }),
        Rewrite::new("compose-reshapes", pattern("(reshape ?b (reshape ?a ?x))"), pattern("(reshape ?b ?x)"))
            .expect("a valid rule"),
        rule("identity-transpose", "(transpose ?a ?x)", Cleanup::Identity { a, x }),
        rule("identity-reshape", "(reshape ?a ?x)", Cleanup::Identity { a, x }),
        rule("identity-scale", "(scale ?a ?x)", Cleanup::Identity { a, x }),
    ]
}

enum Cleanup {
    ComposeTransposes {
        a: Var,
        b: Var,
        x: Var,
    },
    ComposeScales {
        a: Var,
        b: Var,
        x: Var,
    },
    /// The term is `x` when its attribute `a` makes it an identity.
    Identity {
        a: Var,
        x: Var,
    },
}

/// Whether a term with attribute `attr` applied to `x` is `x`.
fn is_identity(attr: &Info, x: &Info) -> bool {
    match (attr, x) {
        (Info::Perm(p), _) => p.iter().enumerate().all(|(i, &a)| i == a),
        (Info::Dims(s), Info::Tensor(x)) => *s == x.shape,
        (Info::Factor(f), _) => *f == 1.0,
        _ => false,
    }
}

impl Applier<TensorLang, Shapes> for Cleanup {
    fn apply_one(
        &self,
        egraph: &mut RegionGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let x = subst[match self {
            Cleanup::ComposeTransposes { x, .. } | Cleanup::ComposeScales { x, .. } | Cleanup::Identity { x, .. } => *x,
        }];
        let equal = match self {
            Cleanup::ComposeTransposes { a, b, .. } => {
                let (Info::Perm(p), Info::Perm(q)) = (&egraph[subst[*a]].data, &egraph[subst[*b]].data) else {
                    return Vec::new();
                };
                if p.len() != q.len() {
                    return Vec::new();
                }
                let composed: Vec<usize> = q.iter().map(|&d| p[d]).collect();
                if composed.iter().enumerate().all(|(i, &a)| i == a) {
                    x
                } else {
                    let perm = egraph.add(TensorLang::Perm(Perm(composed)));
                    egraph.add(TensorLang::Transpose([perm, x]))
                }
            }
            Cleanup::ComposeScales { a, b, .. } => {
                let (Info::Factor(f), Info::Factor(g)) = (&egraph[subst[*a]].data, &egraph[subst[*b]].data) else {
                    return Vec::new();
                };
                let product = f * g;
                if product == 1.0 {
                    x
                } else {
                    let factor = egraph.add(TensorLang::Factor(Factor::new(product)));
                    egraph.add(TensorLang::Scale([factor, x]))
                }
            }
            Cleanup::Identity { a, .. } => {
                if !is_identity(&egraph[subst[*a]].data, &egraph[x].data) {
                    return Vec::new();
                }
                x
            }
        };
        if egraph.union(eclass, equal) { vec![eclass] } else { Vec::new() }
    }
}
