//! Errors as the user sees them: with the source line and a caret (miette),
//! or as one JSON object under `--json`.
//!
//! Every command fails with text in one convention, `FILE[:LINE:COLUMN]: error:
//! MESSAGE` (or `error: MESSAGE`), more lines, then `  help: FIX`, for each
//! problem (spec, `config.json`, plan and DeepSpeed errors all write it). This
//! module reads that convention back rather than threading a structured error
//! through every command: the first line stays as greppable as it was, and a
//! located problem whose file can be read gains its snippet below it.

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteDiagnostic, NamedSource, Report};
use serde_json::{Value as Json, json};
use std::io::IsTerminal;

/// One problem of an error text.
#[derive(Debug, PartialEq)]
pub struct Problem {
    pub file: Option<String>,
    /// 1-based line and column, where the problem has a place in `file`.
    pub location: Option<(usize, usize)>,
    pub message: String,
    pub help: Option<String>,
    /// The problem's lines as written, without its `help:` line.
    lines: Vec<String>,
}

/// Splits an error text into its problems: a line with `error: ` starts one,
/// `  help: ` gives its fix, any other line continues its message.
pub fn parse(text: &str) -> Vec<Problem> {
    let mut problems: Vec<Problem> = Vec::new();
    for line in text.lines() {
        if let Some(help) = line.strip_prefix("  help: ").filter(|_| !problems.is_empty()) {
            problems.last_mut().expect("checked").help = Some(help.to_string());
        } else if let Some(problem) = head(line) {
            problems.push(problem);
        } else if let Some(last) = problems.last_mut() {
            last.message.push('\n');
            last.message.push_str(line);
            last.lines.push(line.to_string());
        } else {
            problems.push(Problem {
                file: None,
                location: None,
                message: line.to_string(),
                help: None,
                lines: vec![line.to_string()],
            });
        }
    }
    problems
}

/// `FILE:LINE:COLUMN: error: MESSAGE`, `FILE: error: MESSAGE` or `error: MESSAGE`.
fn head(line: &str) -> Option<Problem> {
    let (prefix, message) = match line.strip_prefix("error: ") {
        Some(message) => ("", message),
        None => line.split_once(": error: ")?,
    };
    let mut parts = prefix.rsplitn(3, ':');
    let (column, line_no, file) = (parts.next(), parts.next(), parts.next());
    let location = match (line_no.map(str::parse::<usize>), column.map(str::parse::<usize>), file) {
        (Some(Ok(l)), Some(Ok(c)), Some(file)) if l > 0 && c > 0 => Some((file, (l, c))),
        _ => None,
    };
    let (file, location) = match location {
        Some((file, at)) => (Some(file.to_string()), Some(at)),
        None => ((!prefix.is_empty()).then(|| prefix.to_string()), None),
    };
    Some(Problem { file, location, message: message.to_string(), help: None, lines: vec![line.to_string()] })
}

/// The error text for a terminal: each located problem whose file reads gets
/// its snippet, caret and help from miette; the rest is printed as written.
/// Colour only where standard error is a terminal and `NO_COLOR` is unset.
pub fn render(text: &str) -> String {
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let theme = if colour { GraphicalTheme::unicode() } else { GraphicalTheme::unicode_nocolor() };
    // No wrapping: a long help line stays one greppable line.
    let handler = GraphicalReportHandler::new_themed(theme).with_width(usize::MAX).with_wrap_lines(false);
    parse(text).iter().map(|p| render_one(p, &handler)).collect::<Vec<_>>().join("\n")
}

fn render_one(problem: &Problem, handler: &GraphicalReportHandler) -> String {
    let written = || {
        let mut lines = problem.lines.clone();
        lines.extend(problem.help.as_ref().map(|h| format!("  help: {h}")));
        lines.join("\n")
    };
    let (Some(file), Some((line, column))) = (&problem.file, problem.location) else { return written() };
    let Ok(source) = std::fs::read_to_string(file) else { return written() };
    let Some(span) = span(&source, line, column) else { return written() };
    // The message is the greppable first line above; miette draws the place
    // under an empty message, whose one line is dropped below.
    let mut diagnostic = MietteDiagnostic::new("").with_label(LabeledSpan::at(span, "here"));
    if let Some(help) = &problem.help {
        diagnostic = diagnostic.with_help(help);
    }
    let report = Report::new(diagnostic).with_source_code(NamedSource::new(file, source));
    let mut drawn = String::new();
    if handler.render_report(&mut drawn, report.as_ref()).is_err() {
        return written();
    }
    let snippet = drawn.split_once('\n').map_or("", |(_, rest)| rest).trim_end();
    format!("{}\n{snippet}", problem.lines.join("\n"))
}

/// The byte range of the token at 1-based `line` and `column` (counted in
/// characters): a quoted string, a word, or one character.
fn span(source: &str, line: usize, column: usize) -> Option<std::ops::Range<usize>> {
    let line_start = if line == 1 { 0 } else { source.match_indices('\n').nth(line - 2)?.0 + 1 };
    let text = &source[line_start..];
    let text = &text[..text.find('\n').unwrap_or(text.len())];
    let start = text.char_indices().nth(column - 1).map_or(text.len(), |(i, _)| i);
    let rest = &text[start..];
    let len = if let Some(quoted) = rest.strip_prefix('"') {
        quoted.find('"').map_or(rest.len(), |end| end + 2)
    } else {
        let word = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '-'));
        match word.unwrap_or(rest.len()) {
            0 => rest.chars().next().map_or(0, char::len_utf8),
            n => n,
        }
    };
    Some(line_start + start..line_start + start + len)
}

/// `{"error": {file, line, column, message, help}}` (fields absent where
/// unknown) for `--json` runs, with `"also"` listing any further problems.
pub fn to_json(text: &str) -> Json {
    let object = |p: &Problem| {
        let mut o = serde_json::Map::new();
        if let Some(file) = &p.file {
            o.insert("file".into(), json!(file));
        }
        if let Some((line, column)) = p.location {
            o.insert("line".into(), json!(line));
            o.insert("column".into(), json!(column));
        }
        o.insert("message".into(), json!(p.message));
        if let Some(help) = &p.help {
            o.insert("help".into(), json!(help));
        }
        Json::Object(o)
    };
    let problems = parse(text);
    let mut out = json!({ "error": problems.first().map_or(json!({ "message": text }), object) });
    if problems.len() > 1 {
        out["also"] = problems[1..].iter().map(object).collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_convention_reads_back() {
        let text = "a.ron:9:5: error: bad heads\n  help: use 4\nb.json: error: gone\nmore\nerror: plain";
        let p = parse(text);
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p[0].file.as_deref(), p[0].location, p[0].help.as_deref()),
            (Some("a.ron"), Some((9, 5)), Some("use 4"))
        );
        assert_eq!((p[1].file.as_deref(), p[1].location, p[1].message.as_str()), (Some("b.json"), None, "gone\nmore"));
        assert_eq!((p[2].file.as_deref(), p[2].message.as_str()), (None, "plain"));
        let j = to_json(text);
        assert_eq!(j["error"]["line"], 9);
        assert_eq!(j["also"][1]["message"], "plain");
    }

    #[test]
    fn spans_cover_the_token() {
        let src = "(\n  heads: 5,\n  \"stage\": 3\n)";
        assert_eq!(&src[span(src, 2, 3).unwrap()], "heads");
        assert_eq!(&src[span(src, 3, 3).unwrap()], "\"stage\"");
        assert_eq!(&src[span(src, 2, 8).unwrap()], ":");
        assert_eq!(span(src, 9, 1), None);
    }
}
