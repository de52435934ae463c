//! Dimensions, shapes and tensor types.
//!
//! A dimension is a *monomial*: a constant factor times a product of named
//! symbols, such as `768`, `seq` or `batch*seq`. Symbols (`batch`, `seq`) are
//! bound to numbers at plan time. Monomials are closed under the products that
//! reshapes need (flattening `[batch, seq, 768]` to `[batch*seq, 768]`), so the
//! verifier can check element counts exactly without knowing the batch size.
//!
//! A monomial may also carry a constant divisor, `seq/2`: the sequence a
//! tensor rank keeps under sequence parallelism (Korthikanti et al., 2022)
//! is `1/t` of the whole, and saying so in the type keeps one graph for
//! every sequence length — and every size the memory and cost models read
//! exact — instead of a second symbol each caller would have to bind. The
//! factor and divisor are kept coprime, so `[batch, seq/2, 64]` has the
//! same element count as `[batch*seq, 32]`. A divisor that does not divide
//! the bound value has no value ([`Dim::eval`] is `None`; [`Dim::indivisible`]
//! says why).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::dtype::DType;

/// Values for the symbols of a graph, e.g. `batch = 32, seq = 128`.
pub type Bindings = BTreeMap<String, u64>;

/// One dimension: `factor × Π symbols / divisor` (symbols sorted, repeats
/// allowed; factor and divisor coprime, and the divisor 1 without symbols).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    factor: u64,
    symbols: Symbols,
    divisor: u64,
}

/// A dimension's symbols, shared: a pass that rebuilds a 300k-node step
/// copies every node's output types, and `batch × seq` must not cost an
/// allocation per string each time. None for a constant (most dimensions),
/// so a constant allocates nothing. Compares, orders, hashes and prints as
/// the slice of names it holds.
#[derive(Clone, Default)]
struct Symbols(Option<std::sync::Arc<[String]>>);

impl Symbols {
    fn of(names: Vec<String>) -> Symbols {
        Symbols((!names.is_empty()).then(|| names.into()))
    }
}

impl std::ops::Deref for Symbols {
    type Target = [String];

    fn deref(&self) -> &[String] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl PartialEq for Symbols {
    fn eq(&self, other: &Symbols) -> bool {
        **self == **other
    }
}

impl Eq for Symbols {}

impl PartialOrd for Symbols {
    fn partial_cmp(&self, other: &Symbols) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Symbols {
    fn cmp(&self, other: &Symbols) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl std::hash::Hash for Symbols {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl fmt::Debug for Symbols {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// The value `bindings` gives `symbol`. A graph binds two or three symbols
/// (`batch`, `seq`), and the memory and cost models look one up for every
/// symbolic dimension of every value of every candidate: a scan that
/// compares lengths first finds it without the string comparisons a
/// search of the ordered map makes at each key it passes.
fn bound(bindings: &Bindings, symbol: &str) -> Option<u64> {
    if bindings.len() > 4 {
        return bindings.get(symbol).copied();
    }
    bindings.iter().find(|(name, _)| name.len() == symbol.len() && *name == symbol).map(|(_, &v)| v)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl Dim {
    pub fn constant(n: u64) -> Dim {
        Dim { factor: n, symbols: Symbols::default(), divisor: 1 }
    }

    pub fn symbol(name: &str) -> Dim {
        Dim { factor: 1, symbols: Symbols::of(vec![name.to_string()]), divisor: 1 }
    }

    /// `factor·Π symbols / divisor` in lowest terms.
    fn reduced(factor: u64, symbols: Symbols, divisor: u64) -> Dim {
        let g = gcd(factor, divisor).max(1);
        let (factor, divisor) = if factor == 0 { (0, 1) } else { (factor / g, divisor / g) };
        Dim { factor, symbols, divisor }
    }

    /// `self / n`: exact for a constant `n` divides (else `None`), and for
    /// a symbolic dimension a divisor its bound value must honour.
    pub fn divided_by(&self, n: u64) -> Option<Dim> {
        if n == 0 {
            return None;
        }
        if self.symbols.is_empty() {
            return self.factor.is_multiple_of(n).then(|| Dim::constant(self.factor / n));
        }
        Some(Dim::reduced(self.factor, self.symbols.clone(), self.divisor.checked_mul(n)?))
    }

    /// The constant this dimension is divided by (1 for most).
    pub fn divisor(&self) -> u64 {
        self.divisor
    }

    /// Why `self` has no value under `bindings` although every symbol is
    /// bound: the divisor does not divide the product, e.g. `seq/4` with
    /// `seq = 126`. `None` when it divides (or a symbol is unbound).
    pub fn indivisible(&self, bindings: &Bindings) -> Option<String> {
        if self.divisor == 1 {
            return None;
        }
        let whole = Dim { divisor: 1, ..self.clone() };
        let value = whole.eval(bindings)?;
        let named: Vec<String> = self.symbols.iter().map(|s| format!("{s} = {}", bindings[s])).collect();
        (!value.is_multiple_of(self.divisor)).then(|| {
            format!(
                "dimension `{self}` needs {whole} divisible by {} ({}): with sequence parallelism the sequence \
                 length must be a multiple of the tensor-parallel ranks",
                self.divisor,
                named.join(", ")
            )
        })
    }

    /// The value of a dimension without symbols.
    pub fn as_constant(&self) -> Option<u64> {
        self.symbols.is_empty().then_some(self.factor)
    }

    pub fn is_one(&self) -> bool {
        self.as_constant() == Some(1)
    }

    pub fn symbols(&self) -> &[String] {
        &self.symbols
    }

    /// `self × other`. A factor or divisor past `u64` saturates rather than
    /// wrapping (or panicking, in a debug build): only a crafted file's
    /// shapes get there, and loading refuses any tensor whose bound element
    /// count overflows (`zeroplan_exec::validate`).
    pub fn product(&self, other: &Dim) -> Dim {
        let mut symbols: Vec<String> = self.symbols.iter().chain(other.symbols.iter()).cloned().collect();
        symbols.sort();
        // Symbols are never cancelled, so a divisor keeps its symbols.
        let symbols = Symbols::of(symbols);
        Dim::reduced(self.factor.saturating_mul(other.factor), symbols, self.divisor.saturating_mul(other.divisor))
    }

    /// `self + other`, when the sum is again a monomial (same symbols and
    /// divisor, or a zero term).
    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        if self.factor == 0 {
            return Some(other.clone());
        }
        if other.factor == 0 {
            return Some(self.clone());
        }
        if self.symbols == other.symbols && self.divisor == other.divisor {
            let factor = self.factor.checked_add(other.factor)?;
            return Some(Dim::reduced(factor, self.symbols.clone(), self.divisor));
        }
        None
    }

    /// The dimension's value under `bindings`; `None` if a symbol is
    /// unbound, the product overflows or the divisor does not divide it.
    pub fn eval(&self, bindings: &Bindings) -> Option<u64> {
        let whole = self.symbols.iter().try_fold(self.factor, |acc, s| acc.checked_mul(bound(bindings, s)?))?;
        whole.is_multiple_of(self.divisor).then(|| whole / self.divisor)
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::constant(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.symbols.is_empty() {
            return write!(f, "{}", self.factor);
        }
        if self.factor != 1 {
            write!(f, "{}*", self.factor)?;
        }
        f.write_str(&self.symbols.join("*"))?;
        if self.divisor != 1 {
            write!(f, "/{}", self.divisor)?;
        }
        Ok(())
    }
}

/// Error from parsing a dimension such as `2*batch*seq`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a dimension: write a number, a symbol such as `seq`, a product such as `batch*seq`, or one \
     divided by a number such as `seq/2`"
)]
pub struct ParseDimError(pub String);

impl FromStr for Dim {
    type Err = ParseDimError;

    fn from_str(s: &str) -> Result<Dim, ParseDimError> {
        let err = || ParseDimError(s.to_string());
        let (s, divisor) = match s.split_once('/') {
            Some((product, divisor)) => {
                let divisor = divisor.trim();
                if divisor.is_empty() || !divisor.chars().all(|c| c.is_ascii_digit()) {
                    return Err(err());
                }
                (product, divisor.parse::<u64>().map_err(|_| err())?)
            }
            None => (s, 1),
        };
        let mut dim = Dim::constant(1);
        for part in s.split('*').map(str::trim) {
            let term = if part.chars().all(|c| c.is_ascii_digit()) && !part.is_empty() {
                Dim::constant(part.parse().map_err(|_| err())?)
            } else if is_identifier(part) {
                Dim::symbol(part)
            } else {
                return Err(err());
            };
            dim = dim.product(&term);
        }
        if divisor == 1 {
            return Ok(dim);
        }
        dim.divided_by(divisor).ok_or_else(err)
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Dimensions serialise as their text (`768`, `"batch*seq"`) so RON stays readable.
impl Serialize for Dim {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Dim {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dim, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A tensor shape: its dimensions, outermost first. `[]` is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn new(dims: impl IntoIterator<Item = Dim>) -> Shape {
        Shape(dims.into_iter().collect())
    }

    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    pub fn last(&self) -> Option<&Dim> {
        self.0.last()
    }

    /// The number of elements, as a monomial.
    pub fn numel(&self) -> Dim {
        self.0.iter().fold(Dim::constant(1), |acc, d| acc.product(d))
    }

    /// The number of elements under `bindings`: `self.numel().eval(bindings)`
    /// without building the monomial. The planner's memory and cost models
    /// size every value of every candidate this way, and the symbols' strings
    /// the product clones were most of that work.
    pub fn numel_value(&self, bindings: &Bindings) -> Option<u64> {
        let (mut factor, mut divisor, mut symbols) = (1u64, 1u64, 1u64);
        for d in &self.0 {
            if divisor == 1 && d.divisor == 1 {
                // Whole dimensions (all but sequence-parallel ones): no fraction to reduce.
                factor = factor.checked_mul(d.factor)?;
            } else {
                // Kept in lowest terms, as `Dim::product` keeps them.
                let (f, q) = (factor.checked_mul(d.factor)?, divisor.checked_mul(d.divisor)?);
                let g = gcd(f, q).max(1);
                (factor, divisor) = if f == 0 { (0, 1) } else { (f / g, q / g) };
            }
            for s in d.symbols.iter() {
                symbols = symbols.checked_mul(bound(bindings, s)?)?;
            }
        }
        let whole = if factor == 0 { 0 } else { factor.checked_mul(symbols)? };
        whole.is_multiple_of(divisor).then(|| whole / divisor)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Builds a [`Shape`] from numbers and symbols: `shape![Dim::symbol("seq"), 768]`.
#[macro_export]
macro_rules! shape {
    ($($d:expr),* $(,)?) => { $crate::Shape(vec![$($crate::Dim::from($d)),*]) };
}

/// The type of one tensor value: its shape and element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub shape: Shape,
    pub dtype: DType,
}

impl TensorType {
    pub fn new(shape: Shape, dtype: DType) -> TensorType {
        TensorType { shape, dtype }
    }

    /// Bytes of the tensor under `bindings`.
    pub fn size_bytes(&self, bindings: &Bindings) -> Option<u64> {
        self.shape.numel_value(bindings)?.checked_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monomials_multiply_and_print_canonically() {
        let d = Dim::symbol("seq").product(&Dim::symbol("batch")).product(&Dim::constant(3));
        assert_eq!(d.to_string(), "3*batch*seq");
        assert_eq!("seq*3*batch".parse::<Dim>().unwrap(), d);
        let b: Bindings = [("batch".to_string(), 2), ("seq".to_string(), 5)].into();
        assert_eq!(d.eval(&b), Some(30));
        assert_eq!(Dim::symbol("x").eval(&b), None);
    }

    #[test]
    fn an_element_count_evaluates_as_its_monomial_does() {
        let b: Bindings = [("batch".to_string(), 6), ("seq".to_string(), 10)].into();
        let odd: Bindings = [("batch".to_string(), 3), ("seq".to_string(), 7)].into();
        let seq_half = Dim::symbol("seq").divided_by(2).unwrap();
        let seq_quarter = Dim::symbol("seq").divided_by(4).unwrap();
        let shapes = [
            Shape(vec![]),
            Shape(vec![Dim::constant(0), Dim::symbol("seq")]),
            Shape(vec![Dim::symbol("batch"), Dim::symbol("seq"), Dim::constant(768)]),
            Shape(vec![Dim::symbol("batch"), seq_half.clone(), Dim::constant(64)]),
            Shape(vec![seq_half, Dim::constant(2), seq_quarter]),
            Shape(vec![Dim::symbol("heads")]),
        ];
        for shape in &shapes {
            for bindings in [&b, &odd] {
                assert_eq!(shape.numel_value(bindings), shape.numel().eval(bindings), "{shape} at {bindings:?}");
            }
        }
        assert_eq!(shapes[4].numel_value(&b), Some(25));
        assert_eq!(shapes[4].numel_value(&odd), None);
    }

    #[test]
    fn dims_add_only_when_the_sum_is_a_monomial() {
        let s = Dim::symbol("seq");
        assert_eq!(s.checked_add(&s), Some("2*seq".parse().unwrap()));
        assert_eq!(Dim::constant(3).checked_add(&Dim::constant(4)), Some(Dim::constant(7)));
        assert_eq!(s.checked_add(&Dim::constant(1)), None);
    }

    #[test]
    fn divided_monomials_reduce_and_evaluate_only_when_exact() {
        let half = Dim::symbol("seq").divided_by(2).unwrap();
        assert_eq!(half.to_string(), "seq/2");
        assert_eq!("seq/2".parse::<Dim>().unwrap(), half);
        // [batch, seq/2, 64] has as many elements as [batch*seq, 32].
        let numel = Shape(vec![Dim::symbol("batch"), half.clone(), Dim::constant(64)]).numel();
        assert_eq!(numel, "32*batch*seq".parse().unwrap());
        let three_halves = half.product(&Dim::constant(3));
        assert_eq!(three_halves.to_string(), "3*seq/2");
        assert_eq!(half.checked_add(&half), Some(Dim::symbol("seq")));
        assert_eq!(half.checked_add(&Dim::symbol("seq")), None);
        let b: Bindings = [("seq".to_string(), 6)].into();
        assert_eq!(three_halves.eval(&b), Some(9));
        assert_eq!(half.indivisible(&b), None);
        let odd: Bindings = [("seq".to_string(), 7)].into();
        assert_eq!(half.eval(&odd), None);
        let why = half.indivisible(&odd).unwrap();
        assert!(why.contains("seq = 7") && why.contains("divisible by 2"), "{why}");
        assert_eq!(Dim::constant(6).divided_by(4), None);
        assert_eq!(Dim::constant(8).divided_by(4), Some(Dim::constant(2)));
    }

    #[test]
    fn bad_dimensions_are_rejected() {
        for bad in ["", "2*", "a-b", "3x", "*", "seq/", "seq/0", "seq/x", "6/4"] {
            assert!(bad.parse::<Dim>().is_err(), "{bad:?} parsed");
        }
    }
}
