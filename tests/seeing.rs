//! Seeing the plan: trace-event timelines (`inspect --trace`, `train
//! --profile`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value as Json;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn zeroplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeroplan")).args(args).current_dir(root()).output().expect("the binary runs")
}

fn succeed(args: &[&str]) -> String {
    let out = zeroplan(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failure(args: &[&str]) -> String {
    let out = zeroplan(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// A scratch directory of this test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("zeroplan-seeing-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_json(path: &str) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the file is JSON")
}

/// tiny-bert planned on 2 GPUs at ZeRO-3 with the optimizer offloaded and
/// two micro-batches per rank: every stream has work.
fn tiny_plan(scratch: &Scratch) -> String {
    let plan = scratch.path("plan.ron");
    succeed(&[
        "compile",
        "models/tiny/tiny-bert.ron",
        "--gpus",
        "2",
        "--gpu",
        "a100-40gb",
        "--seq",
        "16",
        "--global-batch",
        "8",
        "--zero",
        "3",
        "--offload",
        "optimizer",
        "--micro-batch",
        "2",
        "-o",
        &plan,
    ]);
    plan
}

/// A slice of a trace: where it is and when.
#[derive(Debug)]
struct Slice {
    name: String,
    cat: String,
    ts: f64,
    dur: f64,
    args: Json,
}

/// Checks `trace` against the trace-event format as Perfetto reads it and
/// returns its slices by (process name, thread name): every event has its
/// required fields, every slice a category, non-negative times, bytes and
/// FLOPs, a named process and thread, and no slice overlaps the one before
/// it on its thread.
fn validate(trace: &Json) -> BTreeMap<(String, String), Vec<Slice>> {
    assert_eq!(trace["displayTimeUnit"], "ms");
    let events = trace["traceEvents"].as_array().expect("traceEvents is an array");
    let mut processes = BTreeMap::new();
    let mut threads = BTreeMap::new();
    let mut slices: BTreeMap<(u64, u64), Vec<Slice>> = BTreeMap::new();
    for e in events {
        let name = e["name"].as_str().unwrap_or_else(|| panic!("no name: {e}")).to_string();
        let (pid, tid) = (e["pid"].as_u64(), e["tid"].as_u64());
        let (Some(pid), Some(tid)) = (pid, tid) else { panic!("no pid or tid: {e}") };
        match e["ph"].as_str() {
            Some("M") => match name.as_str() {
                "process_name" => drop(processes.insert(pid, e["args"]["name"].as_str().unwrap().to_string())),
                "thread_name" => drop(threads.insert((pid, tid), e["args"]["name"].as_str().unwrap().to_string())),
                "process_sort_index" | "thread_sort_index" => assert!(e["args"]["sort_index"].is_u64(), "{e}"),
                other => panic!("unknown metadata event {other}"),
            },
            Some("X") => {
                let cat = e["cat"].as_str().filter(|c| !c.is_empty()).unwrap_or_else(|| panic!("no cat: {e}"));
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                for key in ["bytes", "flops"] {
                    assert!(e["args"][key].as_f64().is_some_and(|x| x >= 0.0), "args.{key}: {e}");
                }
                let slice = Slice { name, cat: cat.to_string(), ts, dur, args: e["args"].clone() };
                slices.entry((pid, tid)).or_default().push(slice);
            }
            other => panic!("unexpected phase {other:?}: {e}"),
        }
    }
    let mut named = BTreeMap::new();
    for ((pid, tid), mut list) in slices {
        list.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        for pair in list.windows(2) {
            let end = pair[0].ts + pair[0].dur;
            assert!(pair[1].ts >= end - 1e-6 * end.max(1.0), "{:?} overlaps {:?}", pair[1], pair[0]);
        }
        let process = processes.get(&pid).unwrap_or_else(|| panic!("process {pid} has no name")).clone();
        let thread = threads.get(&(pid, tid)).unwrap_or_else(|| panic!("thread {pid}/{tid} has no name")).clone();
        named.insert((process, thread), list);
    }
    named
}

#[test]
fn inspect_trace_is_the_predicted_step_in_trace_event_format() {
    let scratch = Scratch::new("trace");
    let plan = tiny_plan(&scratch);
    let out = scratch.path("predicted.json");
    let inspection: Json = serde_json::from_str(&succeed(&["inspect", &plan, "--json", "--trace", &out])).unwrap();
    let threads = validate(&read_json(&out));
    let by_stream: BTreeMap<&str, &Vec<Slice>> = threads.iter().map(|((_, t), s)| (t.as_str(), s)).collect();
    assert_eq!(by_stream.keys().copied().collect::<Vec<_>>(), ["comm", "compute", "copy", "host"]);
    assert!(by_stream["comm"].iter().all(|s| s.cat == "collective"));
    assert!(by_stream["comm"].iter().any(|s| s.args["op"] == "all_gather"), "ZeRO-3 gathers parameters");
    assert!(by_stream["compute"].iter().any(|s| s.cat == "gemm" && s.args["flops"].as_f64().unwrap() > 0.0));
    assert!(by_stream["host"].iter().any(|s| s.cat == "host"), "the offloaded AdamW runs on the host");
    let micro_batches: BTreeSet<u64> =
        by_stream["compute"].iter().map(|s| s.args["micro_batch"].as_u64().unwrap()).collect();
    assert_eq!(micro_batches, [0, 1].into(), "both micro-batches are drawn");
    // The step ends where the plan says it does.
    let end = threads.values().flatten().map(|s| s.ts + s.dur).fold(0.0, f64::max);
    let step = 1e6 * inspection["predicted"]["step_seconds"].as_f64().unwrap();
    assert!((end - step).abs() <= 1e-6 * step, "trace ends at {end} µs, the plan predicts {step} µs");
}

#[test]
fn train_profile_is_the_measured_step_of_every_rank() {
    let scratch = Scratch::new("profile");
    let out = scratch.path("measured.json");
    let args = ["train", "models/tiny/tiny-bert.ron", "--backend", "cpu", "--steps", "2", "--log-json"];
    succeed(&[&args[..], &["--ranks", "2", "--zero", "2", "--profile", &out]].concat());
    let threads = validate(&read_json(&out));
    let names: BTreeSet<(&str, &str)> = threads.keys().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    let want: BTreeSet<(&str, &str)> = [
        ("rank 0 (measured, host runtime)", "comm"),
        ("rank 0 (measured, host runtime)", "compute"),
        ("rank 1 (measured, host runtime)", "comm"),
        ("rank 1 (measured, host runtime)", "compute"),
    ]
    .into();
    assert_eq!(names, want);
    for ((_, thread), slices) in &threads {
        assert!(slices.iter().all(|s| (s.cat == "collective") == (thread == "comm")), "{thread}");
        assert!(slices.iter().all(|s| !s.name.is_empty()));
    }
    // Both steps of each rank: every compute instruction twice.
    let compute = &threads[&("rank 0 (measured, host runtime)".to_string(), "compute".to_string())];
    let matmuls = compute.iter().filter(|s| s.cat == "gemm").count();
    assert!(matmuls > 0 && matmuls.is_multiple_of(2), "{matmuls} GEMM slices");
    let err = failure(&["train", "models/tiny/tiny-bert.ron", "--profile", &out]);
    assert!(err.contains("add --backend cpu"), "{err}");
}
