//! The rewrite rules of a region.
//!
//! `merge-matmuls`: for a matmul `x @ wᵀ` whose `w` is a parameter leaf, the
//! group of all matmuls `x @ wᵢᵀ` on the same `x` (distinct e-classes) whose
//! `wᵢ` are parameter leaves of `w`'s shape and dtype: each member becomes
//! equal to its columns of `x @ concat(w₁, …, wₙ)ᵀ`. The group is built in
//! parameter order, so every member's match adds the same (hash-consed)
//! merged term: groups are disjoint and the rule saturates in two
//! iterations.

use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

use super::lang::{Info, LeafInfo, RegionGraph, Shapes, TensorLang};

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
