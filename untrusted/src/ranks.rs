//! Multi-rank plan mutants: one rank's plan file crafted or corrupted while
//! its peers load the plan as compiled, as when each process of a job reads
//! its own copy. Two seeds: tiny-bert on two data-parallel ranks at ZeRO-3
//! (parameter all-gathers, gradient reduce-scatters, sharded flat buffers),
//! and on two tensor-parallel ranks (Megatron-LM's all-reduces, vocabulary
//! and attention-head shards). One rank's program gets the single-rank
//! mutations of [`crate::plan`] or one aimed at what ranks share: a
//! collective's buffers, op, group, rank count or place in the schedule, a
//! shard's cut, or the whole program replaced by one compiled for another
//! rank count or grid. Which rank gets it is chosen too.
//!
//! Every rank then loads on its own thread, joined to the others by
//! in-process groups, and runs one training step. The property ([`check`]):
//! the mutant is unreadable, or some rank refuses it (at load, or before
//! the first step because the ranks' collectives differ), or every rank
//! runs its step — and every rank ends: a rank whose peer refused its plan
//! ends with an error instead of waiting, which a deadline checks. The
//! guards around every loaded rank's arenas must be intact after its load
//! and its step. A mutation that must be refused (a value moved onto bytes
//! another holds while both are live; a plan for another rank count or
//! grid; a collective over a rank count its group does not have) panics if
//! the mutant runs.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use zeroplan_ir::Op;
use zeroplan_ir::plan::{DataParallel, Offload, Program};
use zeroplan_ir::spec::TrainingSpec;
use zeroplan_passes::manager::PassOptions;
use zeroplan_runtime::HostProgram;
use zeroplan_runtime::comm::InProcess;
use zeroplan_runtime::runner::RunError;

use crate::Choices;
use crate::json::{self, Key};
use crate::plan::{self, Outcome};

/// How long the ranks may take, loads and step together, before the
/// harness calls it a hang. A step of these seeds takes milliseconds and a
/// load well under a second, even in a debug build or under
/// AddressSanitizer; a rank left waiting for a peer would wait forever.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// A multi-rank seed: its program and the grid it runs on.
pub struct Seed {
    /// What it is, for messages.
    pub name: &'static str,
    /// The program every rank loads unless mutated, and what the planner
    /// knew of it ([`plan::Seed::collides`]).
    pub plan: plan::Seed,
    /// The same, read as a plan file is (each run clones it).
    program: Program,
    /// Data-parallel ranks.
    pub data: usize,
    /// Tensor-parallel ranks of each replica.
    pub tensor: usize,
    /// A program compiled for another rank count or grid, which the mutated
    /// rank may be given instead of its own.
    foreign: Value,
}

impl Seed {
    /// Every rank of the grid.
    pub fn ranks(&self) -> usize {
        self.data * self.tensor
    }
}

/// The seeds: tiny-bert on 2 data-parallel ranks at ZeRO-3 (its foreign
/// program: ZeRO-3 for 4 ranks, shards cut for 4), and on 2 tensor-parallel
/// ranks (its foreign program: the 2-rank ZeRO-3 one, a plan for another grid).
pub fn seeds() -> Vec<Seed> {
    let model = plan::tiny_bert();
    let train = TrainingSpec { dropout: Some(0.1), ..TrainingSpec::default() };
    let zero3 = |ranks| PassOptions {
        data_parallel: Some(DataParallel { ranks, zero_stage: 3, offload: Offload::None }),
        ..PassOptions::default()
    };
    let data = plan::seed(&model, &train, zero3(2));
    let four = plan::seed(&model, &train, zero3(4)).program;
    let tensor = plan::seed(&model, &train, PassOptions { tensor_parallel: Some(2), ..PassOptions::default() });
    let read =
        |s: &plan::Seed| -> Program { serde_json::from_value(s.program.clone()).expect("a seed program reads back") };
    let (data_program, tensor_program) = (read(&data), read(&tensor));
    for (seed, program, d, t) in [(&data, &data_program, 2, 1), (&tensor, &tensor_program, 1, 2)] {
        for groups in InProcess::grid(d, t) {
            let runner = HostProgram::load_groups_with(program.clone(), 7, groups, &Default::default());
            seed.keep_warm(runner.expect("a seed program loads on every rank"));
        }
    }
    let data_value = data.program.clone();
    vec![
        Seed { name: "ZeRO-3 on 2 data ranks", program: data_program, plan: data, data: 2, tensor: 1, foreign: four },
        Seed { name: "2 tensor ranks", program: tensor_program, plan: tensor, data: 1, tensor: 2, foreign: data_value },
    ]
}

/// One rank's mutated program.
#[derive(Debug)]
pub struct Mutant {
    /// The program as the mutated rank's plan file would hold it.
    pub program: Value,
    /// The global rank (`data·t + tensor`) that loads it.
    pub rank: usize,
    /// What each mutation did, for a failure's message.
    pub what: Vec<String>,
    /// Loading or agreeing must refuse it: it must not run.
    pub must_refuse: bool,
}

/// Where a mutation aimed at the ranks strikes.
const TARGETS: [&str; 7] = [
    "single-rank mutation",
    "collective buffer",
    "collective op",
    "collective rank count",
    "collective order",
    "shard cut",
    "foreign program",
];

/// The collectives' op names in a plan file, which a mutation swaps for one
/// another (each takes `ranks`; the sequence gather also `partial_grad`).
const COLLECTIVES: [&str; 6] =
    ["AllReduce", "ReduceScatter", "AllGather", "TensorAllReduce", "SequenceReduceScatter", "SequenceAllGather"];

/// The op fields that say how something is cut over ranks.
const SHARD_FIELDS: [&str; 7] = ["ranks", "shards", "rows", "axis", "whole", "offset", "len"];

/// The indices of `program`'s nodes whose op is a collective.
fn collectives(program: &Value) -> Vec<usize> {
    let nodes = program["graph"]["nodes"].as_array().map_or(&[][..], Vec::as_slice);
    let is_collective = |n: &Value| n["op"].as_object().is_some_and(|o| o.keys().any(|k| COLLECTIVES.contains(&&**k)));
    nodes.iter().enumerate().filter(|(_, n)| is_collective(n)).map(|(i, _)| i).collect()
}

/// One rank of `seed` mutated as the bytes choose.
pub fn mutate(seed: &Seed, c: &mut Choices) -> Mutant {
    let rank = c.below(seed.ranks());
    let target = *c.pick(&TARGETS);
    let mut program = seed.plan.program.clone();
    let mut what = Vec::new();
    let mut must_refuse = false;
    let nodes = collectives(&program);
    let node = (!nodes.is_empty()).then(|| nodes[c.below(nodes.len())]);
    match (target, node) {
        ("single-rank mutation", _) => {
            let m = plan::mutate(&seed.plan, c);
            (program, what, must_refuse) = (m.program, m.what, m.must_refuse);
        }
        // One of its operands' or its output's buffer onto another buffer's
        // offset: refused where it meets a value live at the same time.
        ("collective buffer", Some(i)) => {
            let n = &program["graph"]["nodes"][i];
            let mut values: Vec<String> =
                n["operands"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
            values.push(n["name"].as_str().unwrap_or_default().to_string());
            let value = values[c.below(values.len())].clone();
            let buffers = program["buffers"].as_array().map_or(0, Vec::len);
            let from = c.below(buffers);
            let offset = program["buffers"][from]["offset"].clone();
            let index = program["buffers"].as_array().and_then(|b| b.iter().position(|b| b["value"] == *value));
            if let (Some(to), Some(at)) = (index, offset.as_u64()) {
                must_refuse = seed.plan.collides(&value, at);
                program["buffers"][to]["offset"] = offset;
                what.push(format!("collective buffer `{value}` moved to {at}"));
            }
        }
        // Another collective of the same attributes: mostly the sum over the
        // other group (the same types), else one of another shape, which
        // the reader refuses.
        ("collective op", Some(i)) => {
            let op = &mut program["graph"]["nodes"][i]["op"];
            if let Some(map) = op.as_object_mut()
                && let Some((old, attrs)) = map.iter().next().map(|(k, v)| (k.clone(), v.clone()))
            {
                let other_group = if old == "AllReduce" { "TensorAllReduce" } else { "AllReduce" };
                let new = if c.below(4) > 0 { other_group } else { *c.pick(&COLLECTIVES) };
                let mut attrs = attrs;
                if new == "SequenceAllGather" {
                    attrs["partial_grad"] = Value::from(c.below(2) == 1);
                } else if let Some(a) = attrs.as_object_mut() {
                    a.remove("partial_grad");
                }
                *op = serde_json::json!({ new: attrs });
                what.push(format!("collective `{old}` became `{new}`"));
            }
        }
        // The rank count it runs over: none of these is its group's.
        ("collective rank count", Some(i)) => {
            let op = &mut program["graph"]["nodes"][i]["op"];
            if let Some(attrs) = op.as_object_mut().and_then(|m| m.values_mut().next()) {
                let ranks = attrs["ranks"].as_u64().unwrap_or(0);
                let to = *c.pick(&[1, 0, 3, 4, ranks.saturating_mul(2), u64::MAX]);
                attrs["ranks"] = Value::from(to);
                must_refuse = to != ranks;
                what.push(format!("a collective over {ranks} ranks now over {to}"));
            }
        }
        // Moved a few places earlier or later in the schedule (the reader
        // refuses a node before its operands).
        ("collective order", Some(i)) => {
            if let Some(list) = program["graph"]["nodes"].as_array_mut() {
                let distance = 1 + c.below(8);
                let j = if c.below(2) == 0 { i.saturating_sub(distance) } else { (i + distance).min(list.len() - 1) };
                let moved = list.remove(i);
                list.insert(j, moved);
                what.push(format!("collective at {i} of the schedule moved to {j}"));
            }
        }
        // How an op or an init cuts something over ranks.
        ("shard cut", _) => {
            let cuts: Vec<&json::Path> = seed
                .plan
                .leaves()
                .iter()
                .filter(|p| {
                    p.iter().any(|k| matches!(k, Key::Field(f) if f == "op"))
                        && SHARD_FIELDS.contains(&json::field(p))
                        && !p.iter().any(|k| matches!(k, Key::Field(f) if f == "kernel"))
                })
                .collect();
            if !cuts.is_empty() {
                let p = cuts[c.below(cuts.len())].clone();
                let n = json::at_mut(&mut program, &p).and_then(|v| v.as_u64()).unwrap_or(0);
                let to =
                    *c.pick(&[1, 0, 3, 4, n.saturating_add(1), n.saturating_sub(1), n.saturating_mul(2), u64::MAX]);
                if let Some(v) = json::at_mut(&mut program, &p) {
                    *v = Value::from(to);
                }
                what.push(format!("shard cut: {} {n} → {to}", json::field(&p)));
            }
        }
        ("foreign program", _) => {
            program = seed.foreign.clone();
            must_refuse = true;
            what.push("the program compiled for another rank count or grid".into());
        }
        _ => what.push(format!("{target}: nothing to mutate")),
    }
    Mutant { program, rank, what, must_refuse }
}

/// How one rank's run ended.
#[derive(Debug)]
enum End {
    /// Loading refused its program.
    Refused(String),
    /// It loaded and ran its step: `Ok`, or the error, and whether that was
    /// the ranks' disagreement on their collectives.
    Stepped(Result<(), String>, bool),
    /// It panicked (a guard changed, or a bug): the failure to report.
    Panicked(String),
}

/// Loads `program` as the rank of `groups` and runs one step on it,
/// checking the guards around its arenas after each.
fn run_rank(rank: usize, program: Program, groups: zeroplan_runtime::comm::Groups) -> End {
    let feeds = plan::feeds(&program);
    match HostProgram::load_groups_with(program, 7, groups, &Default::default()) {
        Err(e) => End::Refused(e.to_string()),
        Ok(mut runner) => {
            assert!(runner.device().guards_intact(), "rank {rank}: loading wrote outside an arena");
            let batches = vec![feeds; runner.micro_batches() as usize];
            let stepped = runner.step(&batches).map(drop);
            assert!(runner.device().guards_intact(), "rank {rank}: a step wrote outside an arena ({stepped:?})");
            let diverged = matches!(stepped, Err(RunError::Diverged(_)));
            End::Stepped(stepped.map_err(|e| e.to_string()), diverged)
        }
    }
}

/// The data-parallel ranks `g`'s ops and shards span, and its micro-batches
/// ([`zeroplan_runtime::reference::micro_batches`]), `None` where a rank
/// count is 0 (loading refuses that; the harness must not divide by it).
fn micro_batches(g: &zeroplan_ir::Graph) -> Option<u64> {
    let ranks = zeroplan_runtime::reference::data_parallel_ranks(g);
    let averaged = g.nodes().find_map(|n| match n.op {
        Op::GradScale { micro_batches, .. } => Some(micro_batches),
        _ => None,
    });
    Some((averaged.unwrap_or(1).checked_div(ranks)?).max(1))
}

/// Runs `mutant` on its rank and `seed`'s program on the others, each rank
/// on a thread, and checks the property. Panics on a hang (past
/// [`DEADLINE`]), on a guard changed, on a rank that ran its step although
/// a peer refused its plan, and on a mutant that must be refused but ran.
pub fn check(seed: &Seed, mutant: &Mutant) -> Outcome {
    let outcome = run(seed, mutant);
    assert!(
        !mutant.must_refuse || matches!(outcome, Outcome::Refused(_) | Outcome::Unreadable(_)),
        "{}: rank {}'s plan mutated by {:?} must be refused, yet: {outcome:?}",
        seed.name,
        mutant.rank,
        mutant.what
    );
    outcome
}

/// The outcome of `mutant` on its rank beside `seed`'s other ranks:
/// unreadable, skipped (past the single-rank harness's caps), refused (by
/// a rank's load or by the ranks' agreement), or the step run, `Err` with
/// the first rank's error.
pub fn run(seed: &Seed, mutant: &Mutant) -> Outcome {
    let mut programs = vec![None; seed.ranks()];
    programs[mutant.rank] = Some(&mutant.program);
    let what = format!("rank {}'s plan mutated by {:?}", mutant.rank, mutant.what);
    run_ranks(seed, &programs, &what, DEADLINE)
}

/// Runs every rank of `seed`'s grid, rank `r` on `programs[r]` (`None`:
/// the seed's), each on a thread, for one step; `what` says what the
/// programs are, for a failure's message. Panics as [`check`] says, a hang
/// being a rank still running after `deadline`.
pub fn run_ranks(seed: &Seed, programs: &[Option<&Value>], what: &str, deadline: Duration) -> Outcome {
    let mut loaded = Vec::with_capacity(programs.len());
    for program in programs {
        let Some(program) = program else {
            loaded.push(seed.program.clone());
            continue;
        };
        let program = match Program::deserialize(*program) {
            Ok(p) => p,
            Err(e) => return Outcome::Unreadable(e.to_string()),
        };
        if program.arena_bytes > plan::ARENA_CAP
            || program.host_arena_bytes > plan::ARENA_CAP
            || micro_batches(&program.graph).is_none_or(|k| k > plan::MICRO_BATCH_CAP)
        {
            return Outcome::Skipped;
        }
        loaded.push(program);
    }
    let (sender, ends) = mpsc::channel();
    for (rank, (groups, program)) in InProcess::grid(seed.data, seed.tensor).into_iter().zip(loaded).enumerate() {
        let sender = sender.clone();
        // Not scoped: a rank left waiting must not keep the harness from
        // reporting it.
        std::thread::spawn(move || {
            let peers = groups.clone();
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_rank(rank, program, groups)));
            let end = ran.unwrap_or_else(|panic| {
                // The peers must not wait for a rank that panicked.
                peers.abort();
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                End::Panicked(message.unwrap_or_default())
            });
            let _ = sender.send((rank, end));
        });
    }
    drop(sender);
    let start = Instant::now();
    let mut ended: Vec<Option<End>> = (0..seed.ranks()).map(|_| None).collect();
    while ended.iter().any(Option::is_none) {
        let left = deadline.saturating_sub(start.elapsed());
        match ends.recv_timeout(left) {
            Ok((rank, End::Panicked(message))) => {
                panic!("{}: rank {rank} panicked ({what}): {message}", seed.name)
            }
            Ok((rank, end)) => ended[rank] = Some(end),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let waiting: Vec<usize> = (0..ended.len()).filter(|&r| ended[r].is_none()).collect();
                panic!(
                    "{}: ranks {waiting:?} still running after {deadline:?} ({what}; the others ended {ended:?}): a \
                     rank waits for a peer that will not come",
                    seed.name
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => unreachable!("every rank sends how it ended"),
        }
    }
    let ended: Vec<End> = ended.into_iter().map(|e| e.expect("every rank ended")).collect();
    let refused = ended.iter().find_map(|e| match e {
        End::Refused(e) => Some(e.clone()),
        _ => None,
    });
    let diverged = ended.iter().find_map(|e| match e {
        End::Stepped(Err(e), true) => Some(e.clone()),
        _ => None,
    });
    // A rank that refused, or disagreed, stops every peer before its step.
    if refused.is_some() || diverged.is_some() {
        assert!(
            ended.iter().all(|e| !matches!(e, End::Stepped(Ok(()), _))),
            "{}: a rank ran its step although a peer refused ({what}): {ended:?}",
            seed.name
        );
    }
    if let Some(e) = refused.or(diverged) {
        return Outcome::Refused(e);
    }
    let failed = ended.into_iter().find_map(|e| match e {
        End::Stepped(Err(e), _) => Some(e),
        _ => None,
    });
    Outcome::Ran(failed.map_or(Ok(()), Err))
}
