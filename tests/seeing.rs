//! Seeing the plan: trace-event timelines (`inspect --trace`, `train
//! --profile`), DeepSpeed configurations, memory charts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value as Json;

mod common;

use common::{failure, zeroplan};

fn succeed(args: &[&str]) -> String {
    let out = zeroplan(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let args = ["train", "models/tiny/tiny-bert.ron", "--backend", "cpu", "--log-json", "--ranks", "2", "--zero", "2"];
    let gemms = |steps: &str| {
        let run = zeroplan(&[&args[..], &["--steps", steps, "--profile", &out]].concat());
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let threads = validate(&read_json(&out));
        let compute = &threads[&("rank 0 (measured, host runtime)".to_string(), "compute".to_string())];
        (compute.iter().filter(|s| s.cat == "gemm").count(), String::from_utf8_lossy(&run.stderr).into_owned())
    };
    // One step is profiled whole; of three, the first is a warm-up left out.
    let (one, said) = gemms("1");
    assert!(one > 0 && said.contains("over the steps run;"), "{one} GEMM slices; {said}");
    let (three, said) = gemms("3");
    assert_eq!(three, 2 * one, "the two steps after the warm-up");
    assert!(said.contains("over the steps after the first (a warm-up)"), "{said}");
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
    let err = failure(&["train", "models/tiny/tiny-bert.ron", "--profile", &out]);
    assert!(err.contains("add --backend cpu"), "{err}");
}

/// Under tensor × data parallelism each rank's collectives run on its
/// group's thread: the tensor group's on `tensor_comm`, ZeRO's on `comm`.
#[test]
fn train_profile_shows_each_group_on_its_stream() {
    let scratch = Scratch::new("profile-tp");
    let out = scratch.path("measured.json");
    let args = ["train", "models/tiny/tiny-bert.ron", "--backend", "cpu", "--steps", "1", "--log-json"];
    succeed(&[&args[..], &["--tp", "2", "--ranks", "2", "--zero", "1", "--profile", &out]].concat());
    let threads = validate(&read_json(&out));
    let tensor_ops = ["tensor_all_reduce", "sequence_all_gather", "sequence_reduce_scatter"];
    for ((process, thread), slices) in &threads {
        match thread.as_str() {
            "tensor_comm" => assert!(slices.iter().all(|s| tensor_ops.contains(&s.args["op"].as_str().unwrap()))),
            "comm" => assert!(
                slices.iter().all(|s| s.cat == "collective" && !tensor_ops.contains(&s.args["op"].as_str().unwrap()))
            ),
            "compute" => assert!(slices.iter().all(|s| s.cat != "collective")),
            other => panic!("{process}: thread {other}"),
        }
    }
    let ranks: BTreeSet<&str> = threads.keys().filter(|(_, t)| t == "tensor_comm").map(|(p, _)| p.as_str()).collect();
    assert_eq!(ranks.len(), 4, "every rank's tensor group communicates: {ranks:?}");
}

/// `compile` of tiny-bert on 2 GPUs with `extra` flags, to `plan`; its inspection.
fn compile_tiny(plan: &str, extra: &[&str]) -> Json {
    let base = ["compile", "models/tiny/tiny-bert.ron", "--gpus", "2", "--gpu", "a100-40gb", "--seq", "16", "--json"];
    serde_json::from_str(&succeed(&[&base[..], extra, &["-o", plan]].concat())).expect("JSON")
}

#[test]
fn deepspeed_config_round_trips_the_plan() {
    let scratch = Scratch::new("deepspeed");
    let cases = [
        ("3", "optimizer+params", "selective", "f16", "1"),
        ("2", "optimizer", "full", "bf16", "1"),
        ("1", "none", "none", "f32", "1"),
        // Tensor parallelism over both GPUs is DeepSpeed's AutoTP.
        ("1", "optimizer", "none", "bf16", "2"),
    ];
    for (zero, offload, recompute, precision, tp) in cases {
        let (plan, config) = (scratch.path("plan.ron"), scratch.path("ds_config.json"));
        let pins =
            ["--zero", zero, "--offload", offload, "--recompute", recompute, "--precision", precision, "--tp", tp];
        let original = compile_tiny(&plan, &[&pins[..], &["--global-batch", "8", "--micro-batch", "2"]].concat());
        let summary: Json =
            serde_json::from_str(&succeed(&["export-deepspeed", &plan, "-o", &config, "--json"])).unwrap();
        assert_eq!((summary["output"].as_str(), &summary["config"]), (Some(config.as_str()), &Json::Null), "{summary}");
        assert!(summary["notes"].is_array(), "{summary}");
        let ds = read_json(&config);
        let printed: Json = serde_json::from_str(&succeed(&["export-deepspeed", &plan, "--json"])).unwrap();
        assert_eq!(printed["config"], ds, "--json without -o carries the configuration");
        let z = &ds["zero_optimization"];
        assert_eq!(z["stage"].as_u64(), zero.parse().ok());
        assert_eq!(z["offload_optimizer"]["device"].as_str(), (offload != "none").then_some("cpu"), "{ds}");
        assert_eq!(z["offload_param"]["device"].as_str(), (offload == "optimizer+params").then_some("cpu"));
        assert!(z["reduce_bucket_size"].as_u64().unwrap() > 0 && z["overlap_comm"] == true);
        assert_eq!(
            (ds["train_batch_size"].as_u64(), ds["train_micro_batch_size_per_gpu"].as_u64()),
            (Some(8), Some(2))
        );
        // 8 sequences = 2 per micro-batch × accumulation × 2 / TP data-parallel GPUs.
        let data_parallel = 2 / tp.parse::<u64>().unwrap();
        assert_eq!(ds["gradient_accumulation_steps"].as_u64(), Some(8 / (2 * data_parallel)));
        assert_eq!(ds["tensor_parallel"]["autotp_size"].as_u64(), (tp != "1").then(|| tp.parse().unwrap()), "{ds}");
        assert_eq!(ds["bf16"]["enabled"] == true, precision == "bf16");
        assert_eq!(ds["fp16"]["enabled"] == true, precision == "f16");
        assert_eq!(ds["activation_checkpointing"].is_object(), recompute != "none");
        assert_eq!((ds["optimizer"]["type"].as_str(), ds["gradient_clipping"].as_f64()), (Some("AdamW"), Some(1.0)));

        // Imported, the configuration pins the same strategy; exported again, the same configuration.
        let replanned = scratch.path("replanned.ron");
        let report: Json = serde_json::from_str(&succeed(&[
            "compile",
            "models/tiny/tiny-bert.ron",
            "--gpus",
            "2",
            "--gpu",
            "a100-40gb",
            "--seq",
            "16",
            "--deepspeed",
            &config,
            "--json",
            "-o",
            &replanned,
        ]))
        .unwrap();
        assert_eq!(report["as_given"]["strategy"], original["strategy"], "{zero} {offload} {recompute}");
        assert_eq!(report["as_given"]["workload"], original["workload"]);
        assert!(
            report["best"]["predicted"]["tokens_per_second"].as_f64()
                >= original["predicted"]["tokens_per_second"].as_f64()
        );
        assert!(report["best_over_given"].as_f64().unwrap() >= 1.0);
        let again = scratch.path("again.json");
        succeed(&["export-deepspeed", &replanned, "-o", &again]);
        assert_eq!(read_json(&again), ds, "export → import → export is a fixed point");
    }
}

/// ZeRO-Infinity's NVMe tier through DeepSpeed: `export-deepspeed` writes
/// `device: "nvme"` with `nvme_path`, buffers and the `aio` block; `compile
/// --deepspeed` reads it back as the same strategy, offloaded to NVMe; and
/// a configuration that offloads to NVMe on a cluster without `--nvme` is
/// refused at the field.
#[test]
fn an_nvme_deepspeed_config_round_trips_the_plan() {
    let scratch = Scratch::new("deepspeed-nvme");
    let (plan, config) = (scratch.path("plan.ron"), scratch.path("ds_config.json"));
    let nvme = ["--nvme", "1TiB", "--nvme-gbps", "25,22"];
    let pins = ["--zero", "3", "--offload", "optimizer+params", "--offload-to", "nvme", "--recompute", "none"];
    let original =
        compile_tiny(&plan, &[&nvme[..], &pins[..], &["--global-batch", "8", "--micro-batch", "2"]].concat());
    assert_eq!(original["strategy"]["offload_to"], "nvme", "{original}");
    assert!(original["memory"]["nvme_bytes"].as_u64().unwrap() > 0, "{original}");
    assert_eq!(original["cluster"]["nvme"]["read_gbps"].as_f64(), Some(25.0));
    let out = zeroplan(&["export-deepspeed", &plan, "-o", &config]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nvme_path"), "the placeholder path is noted");
    let ds = read_json(&config);
    let z = &ds["zero_optimization"];
    for section in ["offload_optimizer", "offload_param"] {
        assert_eq!(z[section]["device"], "nvme", "{ds}");
        assert!(z[section]["nvme_path"].is_string(), "{ds}");
    }
    assert_eq!(
        (z["offload_optimizer"]["pipeline_read"] == true, z["offload_optimizer"]["pipeline_write"] == true),
        (true, true)
    );
    assert!(z["offload_param"]["buffer_size"].as_u64().unwrap() >= z["reduce_bucket_size"].as_u64().unwrap());
    assert!(ds["aio"]["block_size"].as_u64().is_some() && ds["aio"]["queue_depth"].as_u64().is_some(), "{ds}");

    let base = ["compile", "models/tiny/tiny-bert.ron", "--gpus", "2", "--gpu", "a100-40gb", "--seq", "16"];
    let replanned = scratch.path("replanned.ron");
    let report: Json = serde_json::from_str(&succeed(
        &[&base[..], &nvme[..], &["--deepspeed", &config, "--json", "-o", &replanned]].concat(),
    ))
    .unwrap();
    assert_eq!(report["as_given"]["strategy"], original["strategy"]);
    let again = scratch.path("again.json");
    succeed(&["export-deepspeed", &replanned, "-o", &again]);
    assert_eq!(read_json(&again), ds, "export → import → export is a fixed point");

    let err = failure(&[&base[..], &["--deepspeed", &config]].concat());
    assert!(err.starts_with(config.as_str()) && err.contains("offloads to NVMe") && err.contains("--nvme"), "{err}");
    // Optimizer and parameters on different tiers are one tier too many.
    let mixed = ds.to_string().replacen("\"device\":\"nvme\"", "\"device\":\"cpu\"", 1);
    std::fs::write(&config, mixed).unwrap();
    let err = failure(&[&base[..], &nvme[..], &["--deepspeed", &config]].concat());
    assert!(err.contains("one tier for both"), "{err}");
}

#[test]
fn a_hand_written_deepspeed_config_is_planned_as_given() {
    let scratch = Scratch::new("handwritten");
    let config = scratch.path("ds_config.json");
    std::fs::write(
        &config,
        r#"{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": "auto",
  "train_batch_size": "auto",
  "bf16": { "enabled": true },
  "fp16": { "enabled": "auto" },
  "optimizer": {
    "type": "AdamW",
    "params": { "lr": 3e-5, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": "auto" }
  },
  "scheduler": { "type": "WarmupDecayLR", "params": { "warmup_max_lr": 3e-5, "warmup_num_steps": 10, "total_num_steps": 100 } },
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": { "device": "cpu", "pin_memory": true },
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8
  },
  "gradient_clipping": 0.5,
  "steps_per_print": 100,
  "wall_clock_breakdown": false,
  "flops_profilr": {}
}"#,
    )
    .unwrap();
    let plan = scratch.path("plan.ron");
    let base = ["compile", "models/tiny/tiny-bert.ron", "--gpus", "2", "--gpu", "a100-40gb", "--seq", "16"];
    let out = zeroplan(&[&base[..], &["--deepspeed", &config, "--global-batch", "8", "-o", &plan]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("strategy   ZeRO-2 offload optimizer recompute none micro-batch 2×2"), "{stdout}");
    assert!(stdout.contains("against the best plan found") && stdout.contains("best found"), "{stdout}");
    assert!(stderr.contains("`flops_profilr` is not a DeepSpeed field zeroplan knows"), "{stderr}");
    assert!(stderr.contains("bucket and prefetch sizes are not planned"), "{stderr}");
    // The optimizer and schedule went into the plan's training spec.
    let exported = scratch.path("exported.json");
    succeed(&["export-deepspeed", &plan, "-o", &exported]);
    let ds = read_json(&exported);
    assert_eq!(ds["optimizer"]["params"]["lr"].as_f64(), Some(3e-5));
    assert_eq!(ds["optimizer"]["params"]["betas"], serde_json::json!([0.9, 0.98]));
    assert_eq!(ds["optimizer"]["params"]["weight_decay"].as_f64(), Some(0.01), "auto keeps the default");
    assert_eq!(ds["gradient_clipping"].as_f64(), Some(0.5));
    assert_eq!(ds["scheduler"]["type"], "WarmupDecayLR");
    assert_eq!(ds["scheduler"]["params"]["total_num_steps"].as_u64(), Some(100));
    assert_eq!(ds["bf16"]["enabled"], true);
}

#[test]
fn deepspeed_configs_zeroplan_cannot_plan_name_the_field_and_the_fix() {
    let scratch = Scratch::new("unsupported");
    let config = scratch.path("ds.json");
    let base = ["compile", "models/tiny/tiny-bert.ron", "--gpus", "2", "--gpu", "a100-40gb", "--seq", "16"];
    let cases = [
        (
            "{\n  \"zero_optimization\": {\n    \"stage\": 3,\n    \"offload_optimizer\": {\"device\": \"nvme\"}\n  }\n}",
            ":4:27: error: `zero_optimization.offload_optimizer.device`: NVMe offload needs the drives' mount point",
            "help: add \"nvme_path\"",
        ),
        ("{\"optimizer\": {\"type\": \"Lamb\"}}", ":1:16: error: `optimizer.type`", "use \"AdamW\""),
        (
            "{\"zero_optimization\": {\"stage\": 1, \"offload_param\": {\"device\": \"cpu\"}}}",
            "offload_param",
            "stage to 3",
        ),
        ("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128}}", "`fp16.loss_scale`: static", "set it to 0"),
        (
            "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2}",
            "`train_batch_size`: 10 is not",
            "make it 8",
        ),
        ("{\"pipeline\": {\"stages\": 2}}", "`pipeline`", "remove `pipeline`"),
        ("{\"zero_optimization\": {\"stage\": 2,}}", ":1:35: error: trailing comma", "one JSON object"),
    ];
    for (text, error, help) in cases {
        std::fs::write(&config, text).unwrap();
        let err = failure(&[&base[..], &["--deepspeed", &config, "--global-batch", "8"]].concat());
        assert!(err.starts_with(config.as_str()) && err.contains(error) && err.contains(help), "{text}\n{err}");
    }
    let err = failure(&[&base[..], &["--global-batch", "8", "--deepspeed", "/nonexistent/ds.json"]].concat());
    assert!(err.contains("/nonexistent/ds.json"), "{err}");

    // Below the located line: the configuration's line, the field underlined, the fix.
    std::fs::write(&config, cases[0].0).unwrap();
    let run = [&base[..], &["--deepspeed", &config, "--global-batch", "8"]].concat();
    let err = failure(&run);
    let snippet = [
        " 4 │     \"offload_optimizer\": {\"device\": \"nvme\"}",
        "   ·                           ────┬───",
        "   ·                               ╰── here",
        "  help: add \"nvme_path\" to zero_optimization.offload_optimizer (e.g. \"/local_nvme\"), as DeepSpeed requires",
    ];
    assert!(snippet.iter().all(|line| err.lines().any(|l| l.trim_end() == *line)), "{err}");
    // Under --json the same problem is one JSON object on standard error.
    let err: Json = serde_json::from_str(&failure(&[&run[..], &["--json"]].concat())).expect("a JSON error");
    let e = &err["error"];
    assert_eq!(
        (e["file"].as_str(), e["line"].as_u64(), e["column"].as_u64()),
        (Some(config.as_str()), Some(4), Some(27))
    );
    assert!(
        e["message"].as_str().unwrap().contains("NVMe offload") && e["help"].as_str().unwrap().contains("nvme_path")
    );
}

/// The chart rendered by resvg (shapes only: resvg is built without text),
/// as the PNG a person would look at, and its pixels.
fn rasterise(svg: &str) -> (Vec<u8>, resvg::tiny_skia::Pixmap) {
    let tree = resvg::usvg::Tree::from_str(svg, &resvg::usvg::Options::default()).expect("resvg reads the SVG");
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(&tree, resvg::tiny_skia::Transform::identity(), &mut pixmap.as_mut());
    (pixmap.encode_png().expect("PNG"), pixmap)
}

#[test]
fn memory_svg_stacks_every_category_against_the_budget_and_renders() {
    let scratch = Scratch::new("svg");
    let (plan, svg_path) = (scratch.path("plan.ron"), scratch.path("memory.svg"));
    // bert-base on 2 GPUs with 3 GiB each at ZeRO-1: the search tries offload and recomputation.
    let extra = ["--memory", "3GiB", "--global-batch", "64", "--zero", "1"];
    let base = ["compile", "models/bert-base.ron", "--gpus", "2", "--gpu", "a100-40gb", "--seq", "128", "-o", &plan];
    succeed(&[&base[..], &extra[..]].concat());
    succeed(&["inspect", &plan, "--memory-svg", &svg_path]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();

    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    let has = |label: &str| texts.iter().any(|t| t.trim() == label);
    for label in ["workspace", "parameters", "optimizer", "gradients", "activations", "backward", "optimizer"] {
        assert!(has(label), "no `{label}` in {texts:?}");
    }
    assert!(texts.iter().any(|t| t.trim() == "budget 3.00 GiB"), "{texts:?}");
    assert!(has("chosen") && texts.iter().any(|t| t.trim().starts_with("Z1 opt")), "offloading candidates are drawn");
    // One filled band per layer, in its colour, and the budget as a red line.
    let filled =
        |colour: &str| doc.descendants().any(|n| n.has_tag_name("polygon") && n.attribute("fill") == Some(colour));
    for colour in ["#A0A0A0", "#4C72B0", "#DD8452", "#55A868", "#C44E52"] {
        assert!(filled(colour), "no band filled {colour}");
    }
    assert!(doc.descendants().any(|n| n.attribute("stroke") == Some("#C80000")), "no budget line");

    let (png, pixmap) = rasterise(&svg);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let dimension = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    assert_eq!((dimension(16), dimension(20)), (1500, 620), "the PNG's width and height");
    let pixels = pixmap.pixels();
    let rgb = |p: &resvg::tiny_skia::PremultipliedColorU8| (p.red(), p.green(), p.blue());
    let drawn = pixels.iter().filter(|p| rgb(p) != (255, 255, 255)).count();
    assert!(drawn > pixels.len() / 10, "only {drawn} of {} pixels drawn", pixels.len());
    for colour in [(160, 160, 160), (76, 114, 176), (196, 78, 82), (200, 0, 0)] {
        let n = pixels.iter().filter(|p| rgb(p) == colour).count();
        assert!(n > 200, "{colour:?}: {n} pixels");
    }
    let keep = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memory.png");
    std::fs::write(&keep, &png).unwrap();
    println!("the chart as a picture: {}", keep.display());
}

/// Node ids declared in a DOT text, and the endpoints of its edges.
fn dot_ids(dot: &str) -> (BTreeSet<String>, Vec<(String, String)>) {
    let quoted = |s: &str| s.trim().trim_start_matches('"').split('"').next().unwrap_or("").to_string();
    let mut nodes = BTreeSet::new();
    let mut edges = Vec::new();
    for line in dot.lines().map(str::trim) {
        if let Some((from, rest)) = line.split_once(" -> ") {
            edges.push((quoted(from), quoted(rest)));
        } else if line.starts_with('"') && line.contains(" [") {
            nodes.insert(quoted(line));
        }
    }
    (nodes, edges)
}

#[test]
fn graph_dot_draws_fused_kernels_as_clusters_and_marks_recomputed_nodes() {
    let base = ["graph", "models/tiny/tiny-bert.ron", "--train", "--recompute", "full", "--format", "dot"];
    let dot = succeed(&base);
    assert_eq!(dot.matches('{').count(), dot.matches('}').count(), "balanced braces");
    assert!(dot.contains("subgraph \"cluster_layer1\""), "layers are clusters");
    // A kernel is a cluster holding its body: loads, expressions, stores.
    let kernel = dot.split("subgraph \"cluster_layer1.ffn.act.fused\" {").nth(1).expect("fused kernels are clusters");
    let kernel = &kernel[..kernel.find("\n    }").unwrap()];
    assert!(kernel.contains("label=\"fused layer1.ffn.act.fused") && kernel.contains("#e3ecf8"), "{kernel}");
    assert!(
        kernel.contains("= load in0\\l") && kernel.contains("gelu_erf") && kernel.contains("store out"),
        "{kernel}"
    );
    // The recomputed kernels and nodes are red, and only they.
    assert!(dot.contains("subgraph \"cluster_layer1.attn.residual.recompute.fused\" {\n      label=\"fused"));
    let red: Vec<&str> = dot.lines().filter(|l| l.contains("#f6d5d5")).collect();
    assert!(red.len() > 10 && red.iter().all(|l| l.contains(".recompute")), "{red:?}");
    // The fused attention op is cloned whole (the `attention` pass is on).
    assert!(red.iter().any(|l| l.contains("\"layer1.attn.context.recompute\" [")), "{red:?}");
    let (nodes, edges) = dot_ids(&dot);
    for (from, to) in &edges {
        assert!(nodes.contains(from) && nodes.contains(to), "{from} -> {to} leaves the declared nodes");
    }

    // After `recompute`, nothing is fused yet and the recomputed nodes are there.
    let after = succeed(&[&base[..], &["--after", "recompute"]].concat());
    assert!(!after.contains(".fused") && after.contains("\"layer1.attn.context.recompute\" ["), "--after recompute");
    let err = failure(&["graph", "models/tiny/tiny-bert.ron", "--after", "partition"]);
    assert!(err.contains("--after partition: unknown pass") && err.contains("rewrite, attention, fuse"), "{err}");

    // Graphviz lays it out, where installed (the forward graph: a training
    // step of thousands of nodes takes dot minutes).
    let forward = succeed(&["graph", "models/tiny/tiny-bert.ron", "--format", "dot"]);
    assert!(forward.contains("subgraph \"cluster_embeddings.dropout.fused\""));
    let dot_command =
        Command::new("dot").args(["-Tsvg", "-o", "/dev/null"]).stdin(std::process::Stdio::piped()).spawn();
    match dot_command {
        Err(_) => println!("SKIPPED: Graphviz `dot` is not installed"),
        Ok(mut child) => {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(forward.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success(), "dot rejects the graph");
        }
    }
}
