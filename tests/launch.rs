//! `zeroplan launch`: one process per rank trains as the threaded run of
//! the same ranks does, to the bit; a failing or killed rank ends the
//! launch with an error naming it, never a hang. Two launches as two nodes
//! of one host train together on a shared token file, a node with another
//! token is refused naming the store, and a multi-node launch (or a rank
//! started by hand with a store others can reach) needs a token.

#[path = "../driver/tests/glue_files/mod.rs"]
mod glue_files;

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{failure, root};

/// Runs the binary with `args`, killing it if it has not finished in 240 s.
fn within(args: &[&str]) -> Output {
    within_env(args, &[])
}

/// As [`within`], with `env` set (`None`: removed).
fn within_env(args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_zeroplan"));
    for (name, value) in env {
        match value {
            Some(v) => command.env(name, v),
            None => command.env_remove(name),
        };
    }
    let child = command.args(args).current_dir(root()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(Duration::from_secs(240)) {
        Ok(out) => out,
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
            panic!("{args:?} hung for 240 s");
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The JSON lines of a run; under launch, rank 0's (the only rank that logs).
fn json_lines(out: &Output, args: &[&str]) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().map(|l| l.strip_prefix("[rank 0] ").unwrap_or(l)).collect();
    assert!(stdout.lines().all(|l| l.starts_with("[rank 0] ") || !stdout.starts_with('[')), "{stdout}");
    lines.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("a JSON line: {l}"))).collect()
}

/// `name` of every step, as bits.
fn field(lines: &[serde_json::Value], name: &str) -> Vec<u64> {
    lines.iter().map(|l| l[name].as_f64().expect("a number").to_bits()).collect()
}

/// `launch --nproc N -- train ARGS` against `train ARGS THREADED` in one process.
fn assert_same_steps(nproc: &str, args: &[&str], threaded: &[&str]) {
    let launch = [&["launch", "--nproc", nproc, "--", "train"][..], args].concat();
    let one = [&["train"][..], args, threaded].concat();
    let (processes, threads) = (within(&launch), within(&one));
    let (processes, threads) = (json_lines(&processes, &launch), json_lines(&threads, &one));
    assert_eq!(processes.len(), threads.len(), "{launch:?}: steps logged");
    for name in ["loss", "grad_norm", "lr"] {
        assert_eq!(field(&processes, name), field(&threads, name), "{launch:?}: {name}, bit for bit");
    }
}

#[test]
fn two_processes_train_as_two_threads_bit_for_bit() {
    // ZeRO-2 with dropout on: each rank draws its own masks, as threads do.
    let args = ["models/tiny/tiny-bert.ron", "--backend", "cpu", "--zero", "2", "--steps", "3", "--log-json"];
    let args = [&args[..], &["--lr", "1e-2"]].concat();
    assert_same_steps("2", &args, &["--ranks", "2"]);
}

#[test]
fn tensor_parallel_processes_train_as_threads_bit_for_bit() {
    let args = ["models/tiny/tiny-bert.ron", "--backend", "cpu", "--tp", "2", "--steps", "2", "--log-json"];
    let args = [&args[..], &["--lr", "1e-2", "--dropout", "0"]].concat();
    assert_same_steps("2", &args, &[]);
    // 2 data × 2 tensor ranks: four processes in two groups each.
    let grid = [&args[..], &["--zero", "3"]].concat();
    assert_same_steps("4", &grid, &["--ranks", "2"]);
}

#[test]
fn processes_draw_their_replicas_batches_from_the_data_as_threads_do() {
    // MLM text with dropout: each replica's batches and masking draws.
    let dir = std::env::temp_dir().join(format!("zeroplan-launch-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "dog", "sat", "on", "a", "mat", "ran"];
    let (tokenizer, text) = (dir.join("tokenizer.json"), dir.join("corpus.txt"));
    glue_files::write_tokenizer(&tokenizer, &words);
    std::fs::write(&text, "the cat sat on a mat\na dog ran\nthe dog sat\na cat ran on the mat\nthe mat\n").unwrap();
    let (tokenizer, text) = (tokenizer.to_str().unwrap(), text.to_str().unwrap());
    let args = ["models/tiny/tiny-bert.ron", "--backend", "cpu", "--zero", "3", "--steps", "3", "--log-json"];
    let data = ["--data", text, "--tokenizer", tokenizer, "--seq-len", "8", "--dropout", "0.1"];
    assert_same_steps("2", &[&args[..], &data].concat(), &["--ranks", "2"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--save DIR` and `--resume DIR` under launch: each process writes and
/// reads its own rank's file, rank 0 the manifest once every file is
/// written. Four processes (2 data × 2 tensor ranks, ZeRO-3) save what four
/// threads save, byte for byte; stopped at step 2 and resumed, they write
/// step 4 as the uninterrupted run does; and a one-rank save resumed on two
/// tensor-parallel processes (resharded) follows one rank's losses within
/// 1e-6 relative. `--weights` loads into each process's own rank as
/// threads load it.
#[test]
fn processes_save_and_resume_checkpoints_as_threads_do() {
    let dir = std::env::temp_dir().join(format!("zeroplan-launch-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let at = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let args = ["models/tiny/tiny-bert.ron", "--backend", "cpu", "--log-json", "--lr", "1e-2", "--dropout", "0"];
    let launched = |nproc: &str, extra: &[&str]| {
        let launch = [&["launch", "--nproc", nproc, "--", "train"][..], &args, extra].concat();
        json_lines(&within(&launch), &launch)
    };
    let threaded = |extra: &[&str]| {
        let one = [&["train"][..], &args, extra].concat();
        json_lines(&within(&one), &one)
    };
    let grid = ["--tp", "2", "--zero", "3"];
    launched("4", &[&grid[..], &["--steps", "4", "--save", &at("processes")]].concat());
    threaded(&[&grid[..], &["--ranks", "2", "--steps", "4", "--save", &at("threads")]].concat());
    launched("4", &[&grid[..], &["--steps", "2", "--save", &at("resumed")]].concat());
    let resumed =
        launched("4", &[&grid[..], &["--steps", "4", "--resume", &at("resumed"), "--save", &at("resumed")]].concat());
    assert_eq!(resumed.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [3, 4]);
    let files = [
        "manifest.json",
        "rank-00000.safetensors",
        "rank-00001.safetensors",
        "rank-00002.safetensors",
        "rank-00003.safetensors",
    ];
    for other in ["threads", "resumed"] {
        for file in files {
            let (x, y) =
                (dir.join("processes/step-00000004").join(file), dir.join(other).join("step-00000004").join(file));
            assert!(std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(), "{other}: {file} differs");
        }
    }

    let one = threaded(&["--steps", "4"]);
    threaded(&["--steps", "2", "--save", &at("one")]);
    let resharded = launched("2", &["--tp", "2", "--steps", "4", "--resume", &at("one")]);
    let losses = |lines: &[serde_json::Value]| lines.iter().map(|l| l["loss"].as_f64().unwrap()).collect::<Vec<_>>();
    for (got, want) in losses(&resharded).iter().zip(&losses(&one)[2..]) {
        assert!((got - want).abs() <= 1e-6 * want.abs(), "one rank's save on TP-2 processes: {got} vs {want}");
    }
    assert_eq!(resharded.len(), 2, "steps 3 and 4");

    // --weights is cut per process: the threaded run's steps, bit for bit.
    let weights = at("w.safetensors");
    threaded(&["--steps", "1", "--save", &weights]);
    let from_weights = ["--tp", "2", "--zero", "1", "--steps", "2", "--weights", &weights];
    let processes = launched("4", &from_weights);
    let threads = threaded(&[&from_weights[..], &["--ranks", "2"]].concat());
    assert_eq!(losses(&processes), losses(&threads), "--weights on 2 × TP-2 processes");
    // A weights file joins every rank in one process: refused, naming the way round.
    let never = at("never.safetensors");
    let launch = [&["launch", "--nproc", "2", "--", "train"][..], &args, &["--ranks", "2", "--save", &never]].concat();
    let out = within(&launch);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("then `zeroplan export DIR") && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(!dir.join("never.safetensors").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failing_rank_ends_the_launch_naming_it() {
    let out = within(&["launch", "--nproc", "2", "--", "train", "models/nope.ron", "--backend", "cpu"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The first rank to fail ends the launch, and the launcher stops the
    // other, which may not have printed its own error yet: whichever rank
    // printed, its lines carry its prefix.
    assert!(
        stderr
            .lines()
            .any(|l| (l.starts_with("[rank 0] ") || l.starts_with("[rank 1] ")) && l.contains("models/nope.ron")),
        "a rank's error, prefixed: {stderr}"
    );
    let last = stderr.lines().last().unwrap();
    assert!(last.contains("error: rank ") && last.contains("failed (exit status 1)"), "{last}");
    // Settings that cannot hold for the launch's ranks are named.
    let out = within(&[
        "launch",
        "--nproc",
        "2",
        "--",
        "train",
        "models/tiny/tiny-bert.ron",
        "--backend",
        "cpu",
        "--ranks",
        "3",
    ]);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--ranks 3 × --tp 1 = 3 ranks") && stderr.contains("WORLD_SIZE=2"),
        "{stderr}"
    );
    let e = failure(&["launch", "--nproc", "2", "--", "finetune", "--task", "rte"]);
    assert!(e.contains("launch runs `train`") && e.contains("got `finetune`"), "{e}");
    let out = within(&["launch", "--nproc", "2", "--", "train", "models/tiny/tiny-bert.ron", "--save", "/tmp/never"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && stderr.contains("the reference interpreter runs one rank"), "{stderr}");
}

#[test]
fn a_killed_rank_stops_the_others_and_the_launch_names_it() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zeroplan"))
        .args(["launch", "--nproc", "2", "--", "train", "models/tiny/tiny-bert.ron", "--backend", "cpu"])
        .args(["--ranks", "2", "--steps", "1000000", "--log-json"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, rx) = mpsc::channel();
    for (stream, out) in [
        (Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>, true),
        (Box::new(child.stderr.take().unwrap()), false),
    ] {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let _ = lines.send((out, line.unwrap_or_default()));
            }
        });
    }
    drop(lines);
    // The launch names its ranks' processes; kill rank 1 once both train.
    let start = Instant::now();
    let mut pid = None;
    let mut stderr = String::new();
    while start.elapsed() < Duration::from_secs(120) {
        let Ok((stdout, line)) = rx.recv_timeout(Duration::from_secs(120)) else { break };
        if !stdout {
            stderr += &line;
            stderr += "\n";
            if let Some(pids) = line.strip_prefix("[launch] ").and_then(|l| l.split("rank:pid ").nth(1)) {
                pid = pids.split(' ').find_map(|p| p.strip_prefix("1:")).map(str::to_string);
            }
        } else if line.starts_with("[rank 0] {") {
            break;
        }
    }
    let pid = pid.unwrap_or_else(|| panic!("the launch did not name rank 1's process: {stderr}"));
    assert!(Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let killed = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success());
            break;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the launch went on for 60 s after rank 1 was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    while let Ok((stdout, line)) = rx.recv_timeout(Duration::from_secs(10)) {
        if !stdout {
            stderr += &line;
            stderr += "\n";
        }
    }
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: rank 1 was killed by signal 9"), "{stderr}");
    assert!(last.contains("the other ranks were stopped"), "{last}");
}

#[test]
fn a_bad_launch_environment_is_named_with_the_fix() {
    let out = Command::new(env!("CARGO_BIN_EXE_zeroplan"))
        .args(["train", "models/tiny/tiny-bert.ron", "--backend", "cpu", "--steps", "1"])
        .env("WORLD_SIZE", "2")
        .env_remove("RANK")
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("RANK is not set") && stderr.contains("zeroplan launch"),
        "{stderr}"
    );
    let e = failure(&["launch", "--nproc", "2"]);
    assert!(e.contains("<ARGS>"), "the command to launch is required: {e}");
}

/// The environment without any job token.
const NO_TOKEN: [(&str, Option<&str>); 2] = [("ZEROPLAN_JOB_TOKEN", None), ("ZEROPLAN_JOB_TOKEN_FILE", None)];

/// A port free on this host now.
fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

#[test]
fn a_multi_node_launch_needs_a_token_only_its_owner_can_read() {
    let port = free_port();
    let node = |extra: &[&str], env: &[(&str, Option<&str>)]| {
        let args = ["launch", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"];
        let tail = ["--master-port", &port, "--nproc", "1", "--", "train", "models/tiny/tiny-bert.ron"];
        within_env(&[&args[..], extra, &tail].concat(), env)
    };
    let out = node(&[], &NO_TOKEN);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("[rank"), "no rank may start: {stderr}");
    assert!(stderr.contains("--nnodes 2 needs a job token") && stderr.contains("--token-file job.token"), "{stderr}");
    let dir = std::env::temp_dir().join(format!("zeroplan-launch-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("job.token");
    std::fs::write(&file, "0123456789abcdef0123456789abcdef0123456789abcdef\n").unwrap();
    let exposed = node(&["--token-file", file.to_str().unwrap()], &NO_TOKEN);
    let stderr = text(&exposed.stderr);
    assert!(!exposed.status.success() && stderr.contains("chmod 600"), "a world-readable token file: {stderr}");
    let short = node(&[], &[("ZEROPLAN_JOB_TOKEN", Some("hunter2"))]);
    let stderr = text(&short.stderr);
    assert!(!short.status.success() && stderr.contains("7 characters; it needs 32"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_nodes_on_a_shared_token_train_together_and_a_node_with_another_is_refused() {
    let dir = std::env::temp_dir().join(format!("zeroplan-launch-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("job.token");
    std::fs::write(&file, "fedcba9876543210fedcba9876543210fedcba9876543210\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let file = file.to_str().unwrap().to_string();
    let train = ["models/tiny/tiny-bert.ron", "--backend", "cpu", "--steps", "2", "--log-json", "--lr", "1e-2"];
    // Two launches of one rank each, as two nodes would run them.
    let nodes = |port: String, tokens: [Vec<(&'static str, Option<String>)>; 2]| {
        let handles: Vec<_> = tokens
            .into_iter()
            .enumerate()
            .map(|(k, env)| {
                let (port, node) = (port.clone(), k.to_string());
                let args: Vec<String> = [
                    &["launch", "--nnodes", "2", "--node-rank", &node, "--nproc", "1"][..],
                    &["--master-addr", "127.0.0.1", "--master-port", &port, "--", "train"],
                    &train,
                ]
                .concat()
                .iter()
                .map(|a| a.to_string())
                .collect();
                std::thread::spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let env: Vec<(&str, Option<&str>)> = env.iter().map(|(k, v)| (*k, v.as_deref())).collect();
                    within_env(&args, &env)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    };
    let shared = || vec![("ZEROPLAN_JOB_TOKEN", None), ("ZEROPLAN_JOB_TOKEN_FILE", Some(file.clone()))];
    let out = nodes(free_port(), [shared(), shared()]);
    assert!(out[1].status.success(), "node 1: {}", text(&out[1].stderr));
    let one = [&["train"][..], &train, &["--ranks", "2"]].concat();
    let (processes, threads) = (json_lines(&out[0], &["node 0"]), json_lines(&within(&one), &one));
    assert_eq!(field(&processes, "loss"), field(&threads, "loss"), "two nodes train as two threads");

    // Node 1 with another token: its rank is refused by the store, naming
    // it; node 0's store names the refused connection and goes on (until
    // its rank gives up waiting for rank 1).
    let port = free_port();
    let other = vec![("ZEROPLAN_JOB_TOKEN", Some("another job's token, 32 characters or more".to_string()))];
    let timeout = ("ZEROPLAN_RENDEZVOUS_TIMEOUT", Some("3".to_string()));
    let out = nodes(port.clone(), [[shared(), vec![timeout]].concat(), other]);
    let (node0, node1) = (text(&out[0].stderr), text(&out[1].stderr));
    assert!(!out[1].status.success() && !node1.contains("panicked"), "{node1}");
    // (As JSON: the run logs JSON.)
    let refused =
        format!("[rank 1] {{\"error\":{{\"message\":\"rank 1: the rendezvous store at 127.0.0.1:{port} did not admit");
    assert!(node1.contains(&refused) && node1.contains("refused this process's job token"), "{node1}");
    assert!(node0.contains("[rank 0] warning: the rendezvous store refused a connection from 127.0.0.1:"), "{node0}");
    assert!(!out[0].status.success() && node0.contains("rank(s) 1 of the group never connected"), "{node0}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_started_by_hand_needs_a_token_unless_its_store_is_on_loopback() {
    let port = free_port();
    let hand = |addr: &str| {
        let env = [
            ("WORLD_SIZE", Some("1")),
            ("RANK", Some("0")),
            ("LOCAL_RANK", Some("0")),
            ("MASTER_ADDR", Some(addr)),
            ("MASTER_PORT", Some(port.as_str())),
        ];
        within_env(
            &["train", "models/tiny/tiny-bert.ron", "--backend", "cpu", "--steps", "1"],
            &[&env[..], &NO_TOKEN].concat(),
        )
    };
    let out = hand("127.0.0.1");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: rank 0: no job token (ZEROPLAN_JOB_TOKEN)"), "{stderr}");
    // A documentation address (never contacted: refused before any connection).
    let out = hand("192.0.2.1");
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("MASTER_ADDR=192.0.2.1 can be reached from other hosts"),
        "{stderr}"
    );
}

/// `launch --nproc N -- train … --backend cuda` (one GPU per rank, NCCL)
/// against the host runtime's N threads: f32 within 1e-5 relative (NCCL's
/// sums round in their own order). N is `ZEROPLAN_TEST_GPUS` (default 1:
/// NCCL refuses two ranks on one GPU). Needs a CUDA 13 driver, NVRTC
/// (`ZEROPLAN_NVRTC_DIR`) and `libnccl.so.2`:
///
/// ```sh
/// ZEROPLAN_TEST_GPUS=2 ZEROPLAN_NVRTC_DIR=$PWD/fixtures/nvrtc cargo test --test launch -- --ignored --nocapture
/// ```
#[test]
#[ignore = "needs GPUs and NCCL"]
fn launched_cuda_ranks_train_as_the_host_runtime() {
    let gpus = std::env::var("ZEROPLAN_TEST_GPUS").unwrap_or_else(|_| "1".into());
    let args = ["train", "models/tiny/tiny-bert.ron", "--steps", "3", "--log-json", "--lr", "1e-2", "--zero", "1"];
    let args = [&args[..], &["--ranks", &gpus]].concat();
    let cuda = [&["launch", "--nproc", &gpus, "--"][..], &args, &["--backend", "cuda"]].concat();
    let cpu = [&args[..], &["--backend", "cpu"]].concat();
    let (gpu_out, cpu_out) = (within(&cuda), within(&cpu));
    let (gpu, host) = (json_lines(&gpu_out, &cuda), json_lines(&cpu_out, &cpu));
    assert_eq!(gpu.len(), host.len());
    for name in ["loss", "grad_norm"] {
        for (g, h) in gpu.iter().zip(&host) {
            let (g, h) = (g[name].as_f64().unwrap(), h[name].as_f64().unwrap());
            assert!((g - h).abs() <= 1e-5 * h.abs(), "{name}: {g} on the GPUs, {h} on the host");
        }
    }
}
