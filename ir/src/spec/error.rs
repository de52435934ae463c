//! Spec diagnostics: `file:line:column: message` plus a fix.

use std::fmt;

/// One problem in a spec file.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// 1-based line and column, where the problem has a place in the file.
    pub location: Option<(usize, usize)>,
    pub message: String,
    /// How to fix it.
    pub help: String,
}

/// A spec that could not be read, with every problem found.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct SpecError {
    pub file: String,
    pub diagnostics: Vec<Diagnostic>,
}

/// A semantic problem tied to a field, before it is located in the text.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldProblem {
    pub field: &'static str,
    pub message: String,
    pub help: String,
}

#[derive(Clone, Copy)]
pub(crate) enum Syntax {
    Ron,
    Json,
}

impl SpecError {
    pub(crate) fn whole_file(file: &str, message: String, help: String) -> SpecError {
        SpecError { file: file.to_string(), diagnostics: vec![Diagnostic { location: None, message, help }] }
    }

    pub(crate) fn io(file: &str, e: &std::io::Error) -> SpecError {
        SpecError::whole_file(file, format!("cannot read the file: {e}"), "check the path".into())
    }

    pub(crate) fn from_ron(file: &str, e: ron::error::SpannedError) -> SpecError {
        let help = match &e.code {
            ron::Error::MissingStructField { field, .. } => {
                format!("add `{field}: ...` to the spec (models/bert-base.ron lists every field)")
            }
            ron::Error::NoSuchStructField { expected, .. } | ron::Error::NoSuchEnumVariant { expected, .. } => {
                format!("use one of: {}", expected.join(", "))
            }
            _ => "fix the RON syntax here; models/bert-base.ron is a complete example".into(),
        };
        let location = Some((e.span.start.line, e.span.start.col));
        SpecError {
            file: file.to_string(),
            diagnostics: vec![Diagnostic { location, message: e.code.to_string(), help }],
        }
    }

    /// Places each field problem at its field's first mention in `text`.
    pub(crate) fn located(file: &str, text: &str, problems: Vec<FieldProblem>, syntax: Syntax) -> SpecError {
        let diagnostics = problems
            .into_iter()
            .map(|p| Diagnostic { location: locate_field(text, p.field, syntax), message: p.message, help: p.help })
            .collect();
        SpecError { file: file.to_string(), diagnostics }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match d.location {
                Some((line, col)) => write!(f, "{}:{line}:{col}: error: {}", self.file, d.message)?,
                None => write!(f, "{}: error: {}", self.file, d.message)?,
            }
            write!(f, "\n  help: {}", d.help)?;
        }
        Ok(())
    }
}

/// The 1-based line and column where `field` is first given a value: `field:`
/// in RON, `"field":` in JSON. Comments are not parsed; a field named in a
/// comment before its definition would be found there instead.
pub(crate) fn locate_field(text: &str, field: &str, syntax: Syntax) -> Option<(usize, usize)> {
    let needle = match syntax {
        Syntax::Ron => field.to_string(),
        Syntax::Json => format!("\"{field}\""),
    };
    let mut from = 0;
    while let Some(found) = text[from..].find(&needle) {
        let start = from + found;
        let end = start + needle.len();
        let before_ok = text[..start].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let after_ok = text[end..].trim_start().starts_with(':');
        if before_ok && after_ok {
            let line = text[..start].matches('\n').count() + 1;
            let col = start - text[..start].rfind('\n').map_or(0, |i| i + 1) + 1;
            return Some((line, col));
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_found_at_their_definition() {
        let ron = "(\n  heads_total: 3,\n  heads: 7,\n)";
        assert_eq!(locate_field(ron, "heads", Syntax::Ron), Some((3, 3)));
        let json = "{\n \"num_attention_heads\" : 7\n}";
        assert_eq!(locate_field(json, "num_attention_heads", Syntax::Json), Some((2, 2)));
        assert_eq!(locate_field(ron, "layers", Syntax::Ron), None);
    }
}
