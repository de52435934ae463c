//! `zeroplan launch --nproc N -- ARGS…`: one process per rank, as torchrun
//! starts them.
//!
//! Spawns N copies of this binary running `ARGS` with the torchrun
//! environment (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), each child's output lines prefixed
//! with `[rank R] `. The first child to fail ends the launch: the others
//! are killed (they would otherwise wait on the dead rank's collectives or
//! fail in turn) and the launch exits non-zero naming the failed rank.
//! Across nodes, run one launch per node with `--nnodes`, `--node-rank`
//! and the same `--master-addr` and `--master-port`.
//!
//! The children also get the job token (`ZEROPLAN_JOB_TOKEN`), the secret
//! that admits a rank to the rendezvous store and to the other ranks: a
//! one-node launch draws a fresh one, and a multi-node launch, whose nodes
//! must share it, takes it from `--token-file` or the environment and will
//! not start without one.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cli::LaunchArgs;
use zeroplan_runtime::comm::{JobToken, token, world};

pub fn run(args: &LaunchArgs) -> Result<(), String> {
    let nproc = args.nproc as usize;
    let (nnodes, node_rank) = (args.nnodes as usize, args.node_rank as usize);
    if node_rank >= nnodes {
        return Err(format!("error: --node-rank {node_rank} of --nnodes {nnodes}: node ranks count from 0"));
    }
    if nnodes > 1 && (args.master_addr.is_none() || args.master_port.is_none()) {
        return Err("error: --nnodes > 1 needs --master-addr (node 0's address, reachable from every node) and \
                    --master-port (the same on every node)"
            .into());
    }
    // N copies of another command would each do the whole job.
    match args.command.iter().find(|a| !a.starts_with('-')) {
        Some(command) if command == "train" => {}
        other => {
            return Err(format!(
                "error: launch runs `train`, the only command with ranks, once per rank; got `{}`: write \
                 `zeroplan launch --nproc N -- train SPEC …`",
                other.map_or("", String::as_str)
            ));
        }
    }
    let token = job_token(args, nnodes)?;
    let addr = args.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into());
    let port = match args.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let exe = std::env::current_exe().map_err(|e| format!("error: cannot find this program to launch it: {e}"))?;
    let world_size = nnodes * nproc;
    let mut children = Vec::with_capacity(nproc);
    let mut pumps = Vec::new();
    for local in 0..nproc {
        let rank = node_rank * nproc + local;
        let spawned = Command::new(&exe)
            .args(&args.command)
            .env(world::MASTER_ADDR, &addr)
            .env(world::MASTER_PORT, port.to_string())
            .env(world::RANK, rank.to_string())
            .env(world::WORLD_SIZE, world_size.to_string())
            .env(world::LOCAL_RANK, local.to_string())
            .env(world::LOCAL_WORLD_SIZE, nproc.to_string())
            .env(token::TOKEN_VAR, token.secret())
            .env_remove(token::TOKEN_FILE_VAR)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                stop(&mut children);
                return Err(format!("error: could not start rank {rank} ({}): {e}", exe.display()));
            }
        };
        let prefix = format!("[rank {rank}] ");
        pumps.push(pump(child.stdout.take().expect("piped"), prefix.clone(), false));
        pumps.push(pump(child.stderr.take().expect("piped"), prefix, true));
        children.push((rank, child));
    }
    let pids: Vec<String> = children.iter().map(|(r, c)| format!("{r}:{}", c.id())).collect();
    eprintln!("[launch] {nproc} rank(s) at {addr}:{port}, rank:pid {}", pids.join(" "));
    let failed = watch(&mut children);
    // Each child's last words before the verdict.
    for p in pumps {
        let _ = p.join();
    }
    match failed {
        None => Ok(()),
        Some(Failure { rank, status, also }) => {
            let others = if also.is_empty() {
                String::new()
            } else {
                format!(
                    " (rank(s) {} failed too, after it)",
                    also.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
                )
            };
            Err(format!(
                "error: rank {rank} {}{others}; the other ranks were stopped. Its output above is prefixed [rank {rank}]",
                describe(status)
            ))
        }
    }
}

/// The job token for this launch's ranks: `--token-file`, else the
/// environment's, else (one node) a fresh one. The nodes of a multi-node
/// job cannot share a draw, so there it must be given.
fn job_token(args: &LaunchArgs, nnodes: usize) -> Result<JobToken, String> {
    let given = match &args.token_file {
        Some(path) => JobToken::from_file(path).map(Some),
        None => JobToken::from_vars(|name| std::env::var(name).ok()),
    };
    match given.map_err(|e| format!("error: {e}"))? {
        Some(token) => Ok(token),
        None if nnodes == 1 => JobToken::generate().map_err(|e| format!("error: {e}")),
        None => Err(format!(
            "error: --nnodes {nnodes} needs a job token, the same on every node, so that only the job's ranks can \
             join its rendezvous: make one with `openssl rand -hex 32 > job.token && chmod 600 job.token`, copy it \
             to every node, and pass `--token-file job.token` (or set {} or {})",
            token::TOKEN_VAR,
            token::TOKEN_FILE_VAR
        )),
    }
}

/// The rank that failed first, how, and the ranks found failed with it.
struct Failure {
    rank: usize,
    status: ExitStatus,
    also: Vec<usize>,
}

/// Waits until every child has exited successfully, or one has failed (the
/// others are then killed).
fn watch(children: &mut [(usize, Child)]) -> Option<Failure> {
    let mut done = vec![false; children.len()];
    loop {
        let mut failed = Vec::new();
        for (i, (rank, child)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    done[i] = true;
                    if !status.success() {
                        failed.push((*rank, status));
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    done[i] = true;
                }
            }
        }
        if !failed.is_empty() {
            stop(children);
            // Seen in one poll: a rank killed by a signal is the cause, the
            // ranks that exited with an error its consequence (a lost peer).
            failed.sort_by_key(|(rank, status)| (status.code().is_some(), *rank));
            let (rank, status) = failed[0];
            return Some(Failure { rank, status, also: failed[1..].iter().map(|f| f.0).collect() });
        }
        if done.iter().all(|d| *d) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills every child still running and reaps them all.
fn stop(children: &mut [(usize, Child)]) {
    for (_, child) in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
    }
    for (_, child) in children.iter_mut() {
        let _ = child.wait();
    }
}

/// How a child ended, in words.
fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = match signal {
                9 => " (SIGKILL: killed, e.g. out of memory)",
                11 => " (SIGSEGV)",
                6 => " (SIGABRT)",
                15 => " (SIGTERM)",
                _ => "",
            };
            return format!("was killed by signal {signal}{name}");
        }
    }
    match status.code() {
        Some(code) => format!("failed (exit status {code})"),
        None => "failed".into(),
    }
}

/// Copies a child's output to ours line by line, each line prefixed.
fn pump(from: impl Read + Send + 'static, prefix: String, stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut from = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match from.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let mut out: Box<dyn Write> =
                        if stderr { Box::new(std::io::stderr().lock()) } else { Box::new(std::io::stdout().lock()) };
                    // A closed terminal or pipe is not the child's failure.
                    let _ =
                        out.write_all(prefix.as_bytes()).and_then(|()| out.write_all(&line)).and_then(|()| out.flush());
                }
            }
        }
    })
}

/// A TCP port free on this host now (the OS picks it), for a launch on one node.
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("error: could not find a free port for the rendezvous: {e} (pass --master-port)"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| format!("error: {e}"))
}
