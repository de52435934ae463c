//! `zeroplan train … --offload-to nvme --nvme-dir DIR` through the binary:
//! it logs the bits of the same run in host memory; a run killed mid-step
//! or mid-save resumes from its last checkpoint as the uninterrupted run
//! goes on (the state files are a cache: the checkpoint is whole without
//! them); a missing directory, a file size limit (a full disk's stand-in)
//! and contradictory flags are errors naming the flag or directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{failure, root, zeroplan};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zeroplan-cli-nvme-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `--log-json` lines' losses and gradient norms, as bits.
fn logged(args: &[&str]) -> Vec<(u64, u64)> {
    let out = zeroplan(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .map(|v| (v["loss"].as_f64().unwrap().to_bits(), v["grad_norm"].as_f64().unwrap().to_bits()))
        .collect()
}

fn train(ranks: &str, zero: &str, offload: &str, steps: &str) -> Vec<String> {
    ["train", "models/tiny/tiny-bert.ron", "--backend", "cpu", "--ranks", ranks, "--zero", zero, "--offload", offload]
        .into_iter()
        .chain(["--dropout", "0.1", "--steps", steps, "--log-json"])
        .map(String::from)
        .collect()
}

#[test]
fn nvme_runs_log_the_bits_of_host_memory_runs() {
    let dir = scratch("agree");
    for (ranks, zero, offload) in
        [("1", "3", "optimizer+params"), ("2", "3", "optimizer+params"), ("4", "2", "optimizer")]
    {
        let args = train(ranks, zero, offload, "3");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let memory = logged(&args);
        let nvme = logged(&[&args[..], &["--offload-to", "nvme", "--nvme-dir", dir.to_str().unwrap()]].concat());
        assert_eq!(nvme, memory, "{ranks} ranks, ZeRO-{zero}, {offload}: the NVMe run's losses and norms");
        assert_eq!(memory.len(), 3);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the state files are removed at the end");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A plan with its large operators tiled (`compile --tiles 2`, the rest of
/// the strategy pinned: each tile its own ZeRO-3 bucket) runs on the NVMe
/// tier as in host memory, bit for bit; and tiled or not, the losses agree
/// (f32: the tiles only regroup the sums of the gradients' norm, 1e-6
/// relative).
#[test]
fn tiled_plans_run_on_nvme_as_in_host_memory() {
    let dir = scratch("tiles");
    let nvme = dir.join("nvme");
    std::fs::create_dir_all(&nvme).unwrap();
    let mut runs = Vec::new();
    for tiles in ["1", "2"] {
        let plan = dir.join(format!("tiles{tiles}.ron"));
        let plan = plan.to_str().unwrap();
        let compile = [
            "compile",
            "models/tiny/tiny-bert.ron",
            "--gpu",
            "h100-80gb-sxm",
            "--gpus",
            "2",
            "--tp",
            "1",
            "--seq",
            "16",
            "--global-batch",
            "8",
            "--micro-batch",
            "4",
            "--zero",
            "3",
            "--offload",
            "optimizer+params",
            "--precision",
            "f32",
            "--tiles",
            tiles,
            "-o",
            plan,
        ];
        let out = zeroplan(&compile);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let train = ["train", plan, "--backend", "cpu", "--steps", "3", "--log-json"];
        let memory = logged(&train);
        let on_nvme = logged(&[&train[..], &["--nvme-dir", nvme.to_str().unwrap()]].concat());
        assert_eq!(on_nvme, memory, "--tiles {tiles}: the NVMe run's losses and norms");
        runs.push(memory);
    }
    for ((untiled, tiled), step) in runs[0].iter().zip(&runs[1]).zip(1..) {
        for (what, a, b) in [("loss", untiled.0, tiled.0), ("grad_norm", untiled.1, tiled.1)] {
            let (a, b) = (f64::from_bits(a), f64::from_bits(b));
            assert!((a - b).abs() <= 1e-6 * a.abs(), "step {step}: {what} {a} untiled, {b} tiled");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A plan the planner put on NVMe (`compile --nvme … --offload-to nvme`)
/// asks `train` for the directory rather than keeping the states in memory.
#[test]
fn a_plan_on_nvme_asks_for_the_directory() {
    let dir = scratch("plan");
    let plan = dir.join("nvme.ron");
    let compile = [
        "compile",
        "models/tiny/tiny-bert.ron",
        "--gpu",
        "v100-32gb",
        "--precision",
        "f16",
        "--gpus",
        "2",
        "--seq",
        "16",
        "--global-batch",
        "8",
        "--zero",
        "3",
        "--offload",
        "optimizer",
        "--nvme",
        "1TiB",
        "--offload-to",
        "nvme",
        "-o",
        plan.to_str().unwrap(),
    ];
    let out = zeroplan(&compile);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = failure(&["train", plan.to_str().unwrap(), "--backend", "cpu", "--steps", "1"]);
    assert!(err.contains("--nvme-dir") && err.contains("optimizer@nvme"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two ranks, ZeRO-3 with optimizer+parameter offload on NVMe, saving
/// every step: killed (SIGKILL) mid-step, and killed between a save's
/// shards and its manifest, each resumes (with new state files) and writes
/// step 4's checkpoint byte for byte as the uninterrupted run.
#[test]
fn a_run_killed_mid_step_or_mid_save_resumes_from_its_checkpoint() {
    let dir = scratch("kill");
    let nvme = dir.join("nvme");
    std::fs::create_dir_all(&nvme).unwrap();
    let run = |save: &Path, extra: &[&str]| -> Vec<String> {
        let mut args = train("2", "3", "optimizer+params", "4");
        let rest = ["--save-every", "1", "--save", save.to_str().unwrap(), "--nvme-dir", nvme.to_str().unwrap()];
        args.extend(rest.iter().chain(extra).map(|s| s.to_string()));
        args
    };
    let whole = dir.join("whole");
    let out = Command::new(env!("CARGO_BIN_EXE_zeroplan")).args(run(&whole, &[])).current_dir(root()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let kill = |save: &Path, pause: Option<&str>, until: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_zeroplan"));
        command.args(run(save, &[])).current_dir(root()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(step) = pause {
            command.env("ZEROPLAN_PAUSE_BEFORE_MANIFEST", step);
        }
        let mut child = command.spawn().unwrap();
        let (mut out, mut err) = (
            std::io::BufReader::new(child.stdout.take().unwrap()),
            std::io::BufReader::new(child.stderr.take().unwrap()),
        );
        let mut line = String::new();
        let stream: &mut dyn std::io::BufRead = if pause.is_some() { &mut err } else { &mut out };
        while !line.contains(until) {
            line.clear();
            assert!(stream.read_line(&mut line).unwrap() > 0, "the run ended before {until:?}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
    };
    // Mid-step: killed as soon as step 2 is logged, inside step 3 or its save.
    let mid_step = dir.join("mid-step");
    kill(&mid_step, None, "\"step\":2");
    // Mid-save: step 3's shards written, its manifest not.
    let mid_save = dir.join("mid-save");
    kill(&mid_save, Some("3"), "paused before the manifest of step 3");
    assert!(!mid_save.join("step-00000003/manifest.json").exists());
    assert!(std::fs::read_dir(&nvme).unwrap().count() > 0, "a killed run leaves its state files behind");

    for save in [&mid_step, &mid_save] {
        let out = Command::new(env!("CARGO_BIN_EXE_zeroplan"))
            .args(run(save, &["--resume", save.to_str().unwrap()]))
            .current_dir(root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for file in ["rank-00000.safetensors", "rank-00001.safetensors", "manifest.json"] {
            let (x, y) = (whole.join("step-00000004").join(file), save.join("step-00000004").join(file));
            assert!(std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(), "{}: {file} differs", save.display());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_directory_a_full_disk_and_contradictions_are_named() {
    let args = train("2", "3", "optimizer+params", "3");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let missing = std::env::temp_dir().join("zeroplan-cli-nvme-no-such-dir");
    let err = failure(&[&args[..], &["--nvme-dir", missing.to_str().unwrap()]].concat());
    assert!(
        err.contains("--nvme-dir") && err.contains(missing.to_str().unwrap()) && err.contains("no such directory"),
        "{err}"
    );
    let err = failure(&[&args[..], &["--offload-to", "nvme"]].concat());
    assert!(err.contains("--offload-to nvme needs --nvme-dir"), "{err}");
    let err = failure(&[&args[..], &["--offload-to", "cpu", "--nvme-dir", "/tmp"]].concat());
    assert!(err.contains("--offload-to cpu"), "{err}");
    let none = train("2", "3", "none", "3");
    let none: Vec<&str> = none.iter().map(String::as_str).collect();
    let err = failure(&[&none[..], &["--nvme-dir", "/tmp"]].concat());
    assert!(err.contains("offloads none") && err.contains("--offload optimizer"), "{err}");

    // A full disk: a file size limit of 4 KiB (SIGXFSZ ignored, as a
    // process that handles the error would) refuses the preallocation.
    let dir = scratch("full");
    let bin = env!("CARGO_BIN_EXE_zeroplan");
    let script = format!("trap '' XFSZ; ulimit -f 8; exec {bin} \"$@\"");
    let out = Command::new("sh")
        .args(["-c", &script, "sh"])
        .args(&args)
        .args(["--nvme-dir", dir.to_str().unwrap()])
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run went on: {err}");
    assert!(
        err.contains("could not allocate") && err.contains(dir.to_str().unwrap()) && err.contains("free space"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "a refused state file is removed");
    std::fs::remove_dir_all(&dir).unwrap();
}
