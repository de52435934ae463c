//! The ranks of a group agree on the collectives a step will call before
//! the first step runs any of them.
//!
//! Every collective waits for every rank of its group to make the same
//! call. Each rank validates only its own program at load, and ranks may
//! load different plan files (one process per rank, each reading its own
//! copy; a crafted or corrupt one on some node). A rank whose program calls
//! one collective fewer leaves its peers waiting for it forever (in-process
//! ranks have no timeout, and a process that is still alive keeps its
//! sockets open); one that calls another collective, or gives it another
//! element count or dtype, at the same point combines mismatched buffers
//! (NCCL does not check counts). So before a rank's first step, each group
//! of more than one rank exchanges the sequence of calls its members' steps
//! will make — collective, group, dtype, elements sent and received, the
//! micro-batches that repeat them — and every member refuses to run when
//! any member's differs, naming the first difference. The exchange is
//! itself a fixed protocol (two all-gathers of lengths every rank knows),
//! so it cannot hang on a disagreement; a rank that failed before it
//! aborts its groups, and its peers' exchange ends with an error.
//!
//! With every group's members agreeing, every rank calls the same
//! sequence (the groups of a grid connect every rank), so no rank waits for
//! a call its peers never make: `Runner`'s compute only ever waits for a
//! collective it has already submitted, or a tensor collective every peer
//! reaches at the same point of one schedule.

use zeroplan_ir::{DType, Graph, NodeIndex, Op, Value};

use crate::comm::{CommError, Communicator};

/// The group a collective runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Group {
    Data,
    Tensor,
}

/// One collective call a step makes, as the peers compare it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Call {
    /// The op's name (`all_reduce`, `sequence_all_gather` …).
    op: &'static str,
    group: Group,
    /// The payload's dtype (NCCL's device collectives send it as is).
    dtype: DType,
    /// Elements this rank gives and gets back.
    sends: u64,
    receives: u64,
    /// Once per step (the optimizer's), or once per micro-batch.
    optimizer: bool,
}

/// The collective calls `steps` make (each a node of `g` and whether it
/// runs once a step, in schedule order), with the node of each for a
/// refusal's message; `len` gives a value's elements. An op over one rank
/// is a copy and calls nothing (`zeroplan_exec::select` refuses one whose
/// rank count is not its group's).
pub(super) fn calls(
    g: &Graph,
    steps: impl Iterator<Item = (NodeIndex, bool)>,
    len: impl Fn(Value) -> u64,
) -> Vec<(Call, &str)> {
    let mut calls = Vec::new();
    for (n, optimizer) in steps {
        let node = g.node(n);
        let ranks = match node.op {
            Op::AllReduce { ranks }
            | Op::ReduceScatter { ranks }
            | Op::AllGather { ranks }
            | Op::TensorAllReduce { ranks }
            | Op::SequenceAllGather { ranks, .. }
            | Op::SequenceReduceScatter { ranks } => ranks,
            _ => continue,
        };
        if ranks <= 1 {
            continue;
        }
        let group = if node.op.tensor_ranks().is_some() { Group::Tensor } else { Group::Data };
        let Some(&x) = g.operands(n).first() else { continue };
        let call = Call {
            op: node.op.name(),
            group,
            dtype: g.value_type(x).dtype,
            sends: len(x),
            receives: len(Value { node: n, output: 0 }),
            optimizer,
        };
        calls.push((call, &*node.name));
    }
    calls
}

/// Why the ranks of a group cannot run their programs together.
#[derive(Debug)]
pub(super) enum Disagreement {
    /// The exchange itself failed: a peer failed or left.
    Comm(CommError),
    /// A peer's step would call other collectives than this rank's.
    Differs(String),
}

/// The name of the group, for a message.
fn group_name(group: Group) -> &'static str {
    match group {
        Group::Data => "data-parallel",
        Group::Tensor => "tensor-parallel",
    }
}

/// The collectives' names, as [`Op::name`] gives them: a call's first word
/// holds its index here.
const OPS: [&str; 6] = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "tensor_all_reduce",
    "sequence_all_gather",
    "sequence_reduce_scatter",
];

/// The words a call is sent as.
const WORDS: usize = 5;

/// Each call as words an all-gather copies unchanged (`f32` bit patterns).
fn words(call: &Call) -> [u32; WORDS] {
    let op = OPS.iter().position(|&n| n == call.op).unwrap_or(usize::MAX);
    let dtype = DType::ALL.iter().position(|&d| d == call.dtype).unwrap_or(usize::MAX);
    let tag = (op as u32 & 0xff)
        | (u32::from(call.group == Group::Tensor) << 8)
        | (u32::from(call.optimizer) << 9)
        | ((dtype as u32 & 0xff) << 16);
    [tag, call.sends as u32, (call.sends >> 32) as u32, call.receives as u32, (call.receives >> 32) as u32]
}

fn describe(words: &[u32]) -> String {
    let op = OPS.get((words[0] & 0xff) as usize).copied().unwrap_or("?");
    let group = if words[0] & (1 << 8) != 0 { Group::Tensor } else { Group::Data };
    let dtype = DType::ALL.get(((words[0] >> 16) & 0xff) as usize).map_or("?".to_string(), |d| d.to_string());
    let per = if words[0] & (1 << 9) != 0 { "once a step" } else { "every micro-batch" };
    let sends = u64::from(words[1]) | (u64::from(words[2]) << 32);
    let receives = u64::from(words[3]) | (u64::from(words[4]) << 32);
    format!("{op} over the {} group, {sends} {dtype} elements in, {receives} out, {per}", group_name(group))
}

/// All-gathers `mine` (as many words on every rank) over `comm`.
fn gather(comm: &dyn Communicator, mine: &[u32]) -> Result<Vec<u32>, Disagreement> {
    let part: Vec<f32> = mine.iter().map(|&w| f32::from_bits(w)).collect();
    let mut all = vec![0.0f32; part.len() * comm.ranks()];
    comm.all_gather(&part, &mut all).map_err(Disagreement::Comm)?;
    Ok(all.into_iter().map(f32::to_bits).collect())
}

/// Checks with the peers of `comm` that every one's step makes the calls
/// of `calls` (this rank's, over `group`) and accumulates `micro_batches`
/// micro-batches. Every member returns the same verdict.
pub(super) fn agree(
    comm: &dyn Communicator,
    group: Group,
    calls: &[(Call, &str)],
    micro_batches: u64,
) -> Result<(), Disagreement> {
    if comm.ranks() <= 1 {
        return Ok(());
    }
    let mine: Vec<&(Call, &str)> = calls.iter().filter(|(c, _)| c.group == group).collect();
    let count = mine.len() as u64;
    let head = [count as u32, (count >> 32) as u32, micro_batches as u32, (micro_batches >> 32) as u32];
    let heads = gather(comm, &head)?;
    let (name, me) = (group_name(group), comm.rank());
    for (peer, theirs) in heads.chunks_exact(head.len()).enumerate() {
        if theirs != head {
            let count = u64::from(theirs[0]) | (u64::from(theirs[1]) << 32);
            let k = u64::from(theirs[2]) | (u64::from(theirs[3]) << 32);
            return Err(Disagreement::Differs(format!(
                "rank {peer} of the {name} group schedules {count} collectives over it and accumulates {k} \
                 micro-batches a step; rank {me} (this one) schedules {} and accumulates {micro_batches}",
                mine.len()
            )));
        }
    }
    if mine.is_empty() {
        return Ok(());
    }
    let ours: Vec<u32> = mine.iter().flat_map(|(c, _)| words(c)).collect();
    let all = gather(comm, &ours)?;
    for (peer, theirs) in all.chunks_exact(ours.len()).enumerate() {
        let differs = ours.chunks_exact(WORDS).zip(theirs.chunks_exact(WORDS)).position(|(a, b)| a != b);
        if let Some(i) = differs {
            let (call, node) = mine[i];
            return Err(Disagreement::Differs(format!(
                "collective call {i} over the {name} group: rank {me}'s (this one's) is `{node}`, {}; rank {peer}'s is {}",
                describe(&words(call)),
                describe(&theirs[i * WORDS..(i + 1) * WORDS])
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::InProcess;

    fn call(op: &'static str, sends: u64) -> Call {
        Call { op, group: Group::Data, dtype: DType::F32, sends, receives: sends * 2, optimizer: false }
    }

    /// Runs [`agree`] on two in-process ranks, rank `r` with `calls[r]` and
    /// `micro_batches[r]`.
    fn on_two(calls: [Vec<Call>; 2], micro_batches: [u64; 2]) -> Vec<Result<(), String>> {
        let group = InProcess::group(2);
        std::thread::scope(|s| {
            let runs: Vec<_> = group
                .iter()
                .zip(calls.iter().zip(micro_batches))
                .map(|(comm, (calls, k))| {
                    s.spawn(move || {
                        let named: Vec<(Call, &str)> = calls.iter().map(|c| (c.clone(), "node")).collect();
                        agree(comm, Group::Data, &named, k).map_err(|e| match e {
                            Disagreement::Differs(m) => m,
                            Disagreement::Comm(e) => format!("comm: {e}"),
                        })
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        })
    }

    #[test]
    fn ranks_agree_only_on_the_same_calls_and_every_rank_gives_the_same_verdict() {
        let same = vec![call("all_gather", 4), call("reduce_scatter", 8)];
        assert!(on_two([same.clone(), same.clone()], [1, 1]).iter().all(Result::is_ok));
        // One call fewer: both refuse, with the counts.
        let fewer = on_two([same.clone(), same[..1].to_vec()], [1, 1]);
        assert!(
            fewer.iter().all(|r| r.as_ref().is_err_and(|m| m.contains("schedules 1") || m.contains("schedules 2")))
        );
        // Another element count at the same point: both refuse, naming it.
        let other = on_two([same.clone(), vec![call("all_gather", 4), call("reduce_scatter", 6)]], [1, 1]);
        for r in &other {
            let m = r.as_ref().unwrap_err();
            assert!(m.contains("collective call 1") && m.contains("8 f32 elements in") && m.contains("6 f32"), "{m}");
        }
        // The same calls, another number of micro-batches: refused.
        assert!(on_two([same.clone(), same.clone()], [1, 2]).iter().all(Result::is_err));
        // Tensor-group calls are not the data group's business.
        let tensor = Call { group: Group::Tensor, ..call("tensor_all_reduce", 3) };
        assert!(on_two([same.clone(), [same.clone(), vec![tensor]].concat()], [1, 1]).iter().all(Result::is_ok));
    }

    #[test]
    fn a_peer_that_aborted_ends_the_exchange_with_an_error() {
        let group = InProcess::group(2);
        group[1].abort();
        let got = agree(&group[0], Group::Data, &[(call("all_reduce", 1), "node")], 1);
        assert!(matches!(got, Err(Disagreement::Comm(CommError::PeerFailed { .. }))), "{got:?}");
    }
}
