//! Errors as people and programs read them: the source line with the
//! problem underlined below the greppable first line, or one JSON object on
//! standard error under `--json`.

mod common;

use common::{failure, root};
use std::path::PathBuf;

/// A scratch directory for one test, removed when it ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("zeroplan-diag-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, file: &str, text: &str) -> String {
        let path = self.0.join(file);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether every one of `lines` is a line of `text` (trailing blanks aside).
fn has_lines(text: &str, lines: &[&str]) -> bool {
    lines.iter().all(|line| text.lines().any(|l| l.trim_end() == *line))
}

fn json_error(args: &[&str]) -> serde_json::Value {
    let err = failure(args);
    serde_json::from_str(&err).unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e}): {err}"))
}

fn bad_bert_base(scratch: &Scratch) -> String {
    let text = std::fs::read_to_string(root().join("models/bert-base.ron")).unwrap();
    scratch.write("bad.ron", &text.replace("heads: 12,", "heads: 5,"))
}

#[test]
fn a_bad_ron_spec_shows_its_line_with_the_field_underlined() {
    let scratch = Scratch::new("ron");
    let bad = bad_bert_base(&scratch);
    let err = failure(&["graph", &bad]);
    assert!(err.starts_with(&format!("{bad}:9:5: error: hidden size 768 is not divisible by 5 heads\n")), "{err}");
    let snippet = [
        &format!("    ╭─[{bad}:9:5]") as &str,
        "  9 │     heads: 5,",
        "    ·     ──┬──",
        "    ·       ╰── here",
        "  help: choose `heads` dividing `hidden` (for hidden 768: 3, 4, 6)",
    ];
    assert!(has_lines(&err, &snippet), "{err}");
    assert!(!err.contains('\u{1b}'), "no colour off a terminal: {err}");

    // A RON syntax error in a training spec, at the character ron names.
    let train = scratch.write("train.ron", "(\n  lr: 1e-4,\n  betas: (0.9 0.999),\n)");
    let err = failure(&["graph", "models/tiny/tiny-bert.ron", "--train", &train]);
    assert!(err.starts_with(&format!("{train}:3:")) && err.contains(" 3 │   betas: (0.9 0.999),"), "{err}");
}

#[test]
fn errors_under_json_are_one_object_with_the_place_and_the_fix() {
    let scratch = Scratch::new("json");
    let bad = bad_bert_base(&scratch);
    let e = &json_error(&["graph", &bad, "--summary", "--json"])["error"];
    assert_eq!((e["file"].as_str(), e["line"].as_u64(), e["column"].as_u64()), (Some(bad.as_str()), Some(9), Some(5)));
    assert_eq!(e["message"], "hidden size 768 is not divisible by 5 heads");
    assert_eq!(e["help"], "choose `heads` dividing `hidden` (for hidden 768: 3, 4, 6)");

    // A plan file that is not one: located, with its snippet, and as JSON.
    let plan = scratch.write("plan.ron", "(\n  format: 1,\n  oops\n)");
    let err = failure(&["inspect", &plan]);
    assert!(err.starts_with(&format!("{plan}:3:7: error: ")) && err.contains(" 3 │   oops"), "{err}");
    let e = &json_error(&["export-deepspeed", &plan, "--json"])["error"];
    assert_eq!((e["line"].as_u64(), e["column"].as_u64()), (Some(3), Some(7)), "{e}");
    assert!(e["help"].as_str().unwrap().contains("compile the plan again"), "{e}");

    // An error with no place has only a message.
    let missing = scratch.0.join("no-such-save");
    let out = scratch.0.join("m.safetensors");
    let e = &json_error(&["export", missing.to_str().unwrap(), "-o", out.to_str().unwrap(), "--json"])["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()) && e.get("line").is_none(), "{e}");
    // `train` and `finetune` spell --log-json --json too.
    let e = &json_error(&["train", &bad, "--json"])["error"];
    assert_eq!(e["line"].as_u64(), Some(9), "{e}");
}

#[test]
fn verbose_logs_each_pass_and_quiet_runs_print_nothing_new() {
    let summary = ["graph", "models/tiny/tiny-bert.ron", "--summary"];
    let quiet = common::zeroplan(&summary);
    assert!(quiet.status.success() && quiet.stderr.is_empty(), "{}", String::from_utf8_lossy(&quiet.stderr));
    let loud = common::zeroplan(&[&summary[..], &["-v"]].concat());
    let stderr = String::from_utf8_lossy(&loud.stderr);
    assert!(loud.status.success() && stderr.contains("pass{name=rewrite") && stderr.contains("time.busy="), "{stderr}");
    assert_eq!(quiet.stdout, loud.stdout, "the logs go to standard error only");

    // The planner's search is a span, and its strategies are spans from -vv; no bar off a terminal.
    let compile = ["compile", "models/tiny/tiny-bert.ron", "--gpu", "a100-40gb", "--seq", "16", "--global-batch", "8"];
    let quiet = common::zeroplan(&compile);
    assert!(quiet.status.success() && quiet.stderr.is_empty(), "{}", String::from_utf8_lossy(&quiet.stderr));
    let stderr = String::from_utf8_lossy(&common::zeroplan(&[&compile[..], &["-vv"]].concat()).stderr).into_owned();
    assert!(stderr.contains("plan.search{choices=") && stderr.contains("plan.choice{choice="), "{stderr}");
}
