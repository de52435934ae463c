//! Structured mutations of a serialised document (a plan's program, a
//! checkpoint's manifest) as a `serde_json::Value`: a leaf replaced by a
//! value near a boundary, an array's elements swapped, dropped or repeated.
//! Mutating the tree rather than the text keeps the mutant well formed, so
//! it reaches the checks past the parser; reading it back through serde is
//! what a file's reader does.

use serde_json::Value;

use crate::Choices;

/// A path from the root: object keys and array indices.
pub type Path = Vec<Key>;

/// One step of a [`Path`].
#[derive(Clone, Debug)]
pub enum Key {
    Field(String),
    Index(usize),
}

/// The node at `path`; `None` once a mutation has removed it.
pub fn at_mut<'v>(root: &'v mut Value, path: &[Key]) -> Option<&'v mut Value> {
    path.iter().try_fold(root, |v, key| match key {
        Key::Field(k) => v.get_mut(k.as_str()),
        Key::Index(i) => v.get_mut(*i),
    })
}

/// Every path under `root` whose node `keep` accepts, in document order.
pub fn paths(root: &Value, keep: &dyn Fn(&Value) -> bool) -> Vec<Path> {
    fn walk(v: &Value, at: &mut Path, keep: &dyn Fn(&Value) -> bool, out: &mut Vec<Path>) {
        if keep(v) {
            out.push(at.clone());
        }
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    at.push(Key::Field(k.clone()));
                    walk(child, at, keep, out);
                    at.pop();
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    at.push(Key::Index(i));
                    walk(child, at, keep, out);
                    at.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(root, &mut Vec::new(), keep, &mut out);
    out
}

/// Numbers and strings: what a leaf mutation changes.
pub fn is_leaf(v: &Value) -> bool {
    v.is_number() || v.is_string()
}

/// A count or offset near where arithmetic on it breaks: 0 and 1, powers
/// of two around 32-bit and 64-bit overflow, the largest values, `near`
/// (an arena's size) and its neighbours, or `n` nudged.
pub fn number(c: &mut Choices, n: u64, near: u64) -> u64 {
    let boundaries = [
        0,
        1,
        2,
        n.wrapping_add(1),
        n.wrapping_sub(1),
        n.wrapping_mul(2),
        n / 2,
        n.wrapping_add(4096),
        near,
        near.wrapping_sub(1),
        near.wrapping_add(1),
        near.wrapping_sub(n),
        u64::from(u32::MAX),
        1 << 32,
        1 << 62,
        u64::MAX / 4 + 1,
        u64::MAX - 3,
        u64::MAX,
    ];
    match c.below(boundaries.len() + 1) {
        i if i < boundaries.len() => boundaries[i],
        _ => c.u64(),
    }
}

/// Replaces the leaf at `path`: a number by a [`number`] of its kind, a
/// string by another of its field's `strings` (names and dimensions drawn
/// from the same document, so the mutant rewires rather than misspells).
pub fn mutate_leaf(
    root: &mut Value,
    path: &[Key],
    c: &mut Choices,
    near: u64,
    strings: &std::collections::BTreeMap<String, Vec<String>>,
) {
    let same_field = strings.get(field(path)).map_or(&[][..], Vec::as_slice);
    let Some(v) = at_mut(root, path) else { return };
    *v = match &*v {
        Value::Number(x) if x.is_u64() => Value::from(number(c, x.as_u64().unwrap_or(0), near)),
        Value::Number(x) if x.is_i64() => Value::from(number(c, x.as_i64().unwrap_or(0) as u64, near) as i64),
        Value::Number(x) => {
            let f = x.as_f64().unwrap_or(0.0);
            Value::from(*c.pick(&[0.0, -1.0, 1.0, 0.5, 1e300, -1e300, f * 2.0, -f, f64::MIN_POSITIVE]))
        }
        Value::String(_) if !same_field.is_empty() => Value::from(c.pick(same_field).clone()),
        other => other.clone(),
    };
}

/// Swaps two elements of the array at `path`, drops one, or repeats one.
pub fn mutate_array(root: &mut Value, path: &[Key], c: &mut Choices) {
    let Some(Value::Array(items)) = at_mut(root, path) else { return };
    if items.is_empty() {
        return;
    }
    let (i, j) = (c.below(items.len()), c.below(items.len()));
    match c.below(3) {
        0 => items.swap(i, j),
        1 => {
            items.remove(i);
        }
        _ => {
            let copy = items[i].clone();
            items.insert(j, copy);
        }
    }
}

/// The field a node at `path` belongs to: its own key, or for an array
/// element the nearest key above it (`operands`, `shape`, `place`).
pub fn field(path: &[Key]) -> &str {
    path.iter()
        .rev()
        .find_map(|k| match k {
            Key::Field(f) => Some(f.as_str()),
            Key::Index(_) => None,
        })
        .unwrap_or("")
}

/// Every string in `root` under each [`field`], each once, in document
/// order: the values a string of that field may be swapped for, so a
/// mutant renames an operand to another value, a dimension to another
/// dimension, rather than to nonsense the reader rejects at once.
pub fn strings(root: &Value) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut by_field: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for p in paths(root, &Value::is_string) {
        let mut node = root;
        for k in &p {
            node = match k {
                Key::Field(f) => &node[f.as_str()],
                Key::Index(i) => &node[*i],
            };
        }
        let list = by_field.entry(field(&p).to_string()).or_default();
        if let Some(s) = node.as_str()
            && !list.iter().any(|x| x == s)
        {
            list.push(s.to_string());
        }
    }
    by_field
}
