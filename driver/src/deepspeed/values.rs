//! Reading a DeepSpeed configuration's values: each with its JSON path, so
//! a problem names the field and where it is written.
//!
//! DeepSpeed configurations write sizes as floats (`5e8`) and leave values
//! to Hugging Face's Trainer with `"auto"`; both are read here.

use serde_json::{Map, Value as Json};

/// What is wrong with one field, and how to fix it.
#[derive(Debug)]
pub struct Problem {
    /// The JSON path, `zero_optimization.offload_optimizer.device`.
    pub path: String,
    pub message: String,
    pub help: String,
}

impl Problem {
    pub fn new(path: &str, message: impl Into<String>, help: impl Into<String>) -> Problem {
        Problem { path: path.to_string(), message: message.into(), help: help.into() }
    }

    /// `file:line:column: error: `path`: message` and a `help:` line.
    pub fn render(&self, text: &str, file: &str) -> String {
        let at = super::locate(text, &self.path).map_or(String::new(), |(line, column)| format!(":{line}:{column}"));
        format!("{file}{at}: error: `{}`: {}\n  help: {}", self.path, self.message, self.help)
    }
}

pub type Read<T> = Result<T, Problem>;

/// `path.key`, or `key` at the top.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn is_auto(v: &Json) -> bool {
    v.as_str() == Some("auto")
}

/// A number; `None` for `"auto"`.
pub fn number(v: &Json, path: &str) -> Read<Option<f64>> {
    if is_auto(v) {
        return Ok(None);
    }
    v.as_f64()
        .filter(|x| x.is_finite())
        .map(Some)
        .ok_or_else(|| Problem::new(path, format!("{v} is not a number"), "write a number, or \"auto\""))
}

/// A whole number ≥ 0 (`5e8` included); `None` for `"auto"`.
pub fn count(v: &Json, path: &str) -> Read<Option<u64>> {
    match number(v, path)? {
        None => Ok(None),
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) => Ok(Some(x as u64)),
        Some(x) => Err(Problem::new(path, format!("{x} is not a whole number"), "write a whole number ≥ 0")),
    }
}

/// A boolean; `None` for `"auto"`.
pub fn flag(v: &Json, path: &str) -> Read<Option<bool>> {
    if is_auto(v) {
        return Ok(None);
    }
    v.as_bool().map(Some).ok_or_else(|| Problem::new(path, format!("{v} is not true or false"), "write true or false"))
}

pub fn string<'a>(v: &'a Json, path: &str) -> Read<&'a str> {
    v.as_str().ok_or_else(|| Problem::new(path, format!("{v} is not a string"), "write a quoted string"))
}

pub fn object<'a>(v: &'a Json, path: &str) -> Read<&'a Map<String, Json>> {
    v.as_object().ok_or_else(|| Problem::new(path, format!("{v} is not an object"), "write a JSON object `{ … }`"))
}

/// A feature section that zeroplan cannot plan is on: present, and not
/// `{"enabled": false}`.
pub fn enabled(v: &Json) -> bool {
    v.get("enabled").and_then(Json::as_bool) != Some(false) && v.as_bool() != Some(false)
}
