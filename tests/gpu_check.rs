//! The one-command GPU check (`scripts/gpu-check.sh`) without a GPU: its dry
//! run prints every step's commands and runs the comparisons and the report
//! on recorded outputs, going on past an injected failure; its Python unit
//! tests and the GPU benchmark's (`bench/gpu/run.sh --self-test`) pass. The
//! check itself needs a GPU: `scripts/gpu-check.sh --out DIR [--quick]`.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value as Json;

fn python() -> Option<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python).arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: no {python}: the GPU check is a Python script");
    }
    found.then_some(python)
}

fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn dry_run_reports_every_step_and_goes_on_past_a_failure() {
    if python().is_none() {
        return;
    }
    let out_dir: PathBuf = std::env::temp_dir().join(format!("zeroplan-gpu-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let out_arg = out_dir.to_str().unwrap();
    let out = run("scripts/gpu-check.sh", &["--out", out_arg, "--dry-run", "--fail", "sanitizer"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a failed step makes the check fail: {stdout}");
    for command in ["compute-sanitizer --tool racecheck", "--ignored", "bench/gpu/run.sh", "--backend cuda"] {
        assert!(stdout.contains(command), "the dry run does not show `{command}`: {stdout}");
    }
    let report: Json = serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap()).unwrap();
    let steps = report["steps"].as_object().unwrap();
    let listed = run("scripts/gpu-check.sh", &["--list"]);
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        let want = if name == "sanitizer" { "failed" } else { "passed" };
        assert_eq!(steps[name]["outcome"], want, "step {name}: {}", steps[name]);
    }
    assert_eq!(steps["tiny-bert"]["figures"]["loss_rel_err"], 0.0);
    let markdown = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(markdown.contains("| sanitizer | failed"), "{markdown}");
    assert!(markdown.contains("dry run"), "a dry run's report says so: {markdown}");
    std::fs::remove_dir_all(&out_dir).unwrap();
}

#[test]
fn the_check_and_the_benchmark_pass_their_unit_tests() {
    let Some(python) = python() else { return };
    let out = run(&python, &["-m", "unittest", "scripts/test_gpu_check.py"]);
    assert!(out.status.success(), "scripts/test_gpu_check.py failed");
    let out = run("bench/gpu/run.sh", &["--self-test"]);
    assert!(out.status.success(), "bench/gpu/run.sh --self-test failed");
}
