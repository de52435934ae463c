//! The kernel that remains when cuBLASLt adds the bias: the same IR with
//! the add replaced by a load of the (now biased) product and the bias
//! input gone.

use zeroplan_ir::kernel::{Expr, ExprId, Kernel};

/// `kernel` reading `mm` as the biased product: expression `add`
/// (`load mm + load bias`, the only use of either load, as
/// [`super::matching::fit`] checked) becomes `load mm`, the now unused
/// loads are dropped, and input `bias` is removed (later inputs move down
/// one). The result computes, from `mm + bias`, what `kernel` computes from
/// `mm` and `bias`; it is no longer a GEMM epilogue.
pub fn drop_bias(kernel: &Kernel, mm: usize, bias: usize, add: ExprId) -> Kernel {
    let dead = |e: &Expr| matches!(e, Expr::Load(i) if *i as usize == mm || *i as usize == bias);
    let input = |i: u32| if i as usize > bias { i - 1 } else { i };
    let mut renumber = vec![ExprId::MAX; kernel.body.len()];
    let mut body = Vec::with_capacity(kernel.body.len());
    for (e, expr) in kernel.body.iter().enumerate() {
        if e as ExprId != add && dead(expr) {
            continue;
        }
        let at = |x: &ExprId| renumber[*x as usize];
        let new = match expr {
            _ if e as ExprId == add => Expr::Load(input(mm as u32)),
            Expr::Load(i) => Expr::Load(input(*i)),
            Expr::Unary(u, a) => Expr::Unary(*u, at(a)),
            Expr::Binary(b, x, y) => Expr::Binary(*b, at(x), at(y)),
            Expr::Select(c, a, b) => Expr::Select(at(c), at(a), at(b)),
            Expr::ReduceSum(a) => Expr::ReduceSum(at(a)),
            Expr::ReduceMax(a) => Expr::ReduceMax(at(a)),
            other => other.clone(),
        };
        renumber[e] = body.len() as ExprId;
        body.push(new);
    }
    let mut inputs = kernel.inputs.clone();
    inputs.remove(bias);
    Kernel {
        name: format!("{}.bias_in_gemm", kernel.name),
        shape: kernel.shape.clone(),
        inputs,
        outputs: kernel.outputs.clone(),
        stores: kernel.stores.iter().map(|&e| renumber[e as usize]).collect(),
        body,
        epilogue_of: None,
        pattern: kernel.pattern.clone(),
    }
}
