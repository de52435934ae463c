//! Step timelines in Chrome's trace-event format, the JSON that Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open: the cost model's
//! prediction (`inspect --trace`) and the host runtime's measurement
//! (`train --profile`) are written alike — one process per rank, one
//! thread per stream, one complete (`"ph": "X"`) slice per instruction with
//! its bytes and FLOPs — so the two read side by side.

use serde::Serialize;
use serde_json::{Value as Json, json};

use zeroplan_ir::plan::{Plan, Program};
use zeroplan_ir::{Graph, NodeIndex};
use zeroplan_passes::cost::simulate::step_timeline;
use zeroplan_passes::cost::work::{Stream, Work, work};
use zeroplan_passes::planner::evaluate::bindings;
use zeroplan_runtime::runner::{Profile, Track};

/// The streams as threads of a rank, in this order.
pub const STREAMS: [Stream; 5] = [Stream::Compute, Stream::Comm, Stream::TensorComm, Stream::Copy, Stream::Host];

/// The thread id of `stream`.
pub fn tid(stream: Stream) -> u64 {
    STREAMS.iter().position(|&s| s == stream).expect("every stream is listed") as u64
}

/// One trace event. Times are microseconds, the format's unit.
#[derive(Serialize)]
struct Event {
    name: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    cat: &'static str,
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u64,
    tid: u64,
    args: Json,
}

/// A trace being built.
#[derive(Default)]
pub struct Trace {
    events: Vec<Event>,
}

impl Trace {
    /// Names process `pid` (a rank) and sorts it by its id.
    pub fn process(&mut self, pid: u64, name: &str) {
        self.metadata("process_name", pid, 0, json!({ "name": name }));
        self.metadata("process_sort_index", pid, 0, json!({ "sort_index": pid }));
    }

    /// Names thread `tid` of `pid` (a stream) and sorts it by its id.
    pub fn thread(&mut self, pid: u64, tid: u64, name: &str) {
        self.metadata("thread_name", pid, tid, json!({ "name": name }));
        self.metadata("thread_sort_index", pid, tid, json!({ "sort_index": tid }));
    }

    fn metadata(&mut self, name: &str, pid: u64, tid: u64, args: Json) {
        self.events.push(Event { name: name.into(), cat: "", ph: "M", ts: None, dur: None, pid, tid, args });
    }

    /// A slice from `start` to `end` seconds. The duration is taken as the
    /// difference of the rounded ends, so slices that touch in seconds touch
    /// in microseconds too.
    pub fn slice(&mut self, at: (u64, u64), name: &str, cat: &'static str, (start, end): (f64, f64), args: Json) {
        let (ts, stop) = (start * 1e6, end * 1e6);
        let (pid, tid) = at;
        self.events.push(Event {
            name: name.into(),
            cat,
            ph: "X",
            ts: Some(ts),
            dur: Some((stop - ts).max(0.0)),
            pid,
            tid,
            args,
        });
    }

    pub fn to_json(&self) -> String {
        let trace = json!({ "traceEvents": self.events, "displayTimeUnit": "ms" });
        serde_json::to_string(&trace).expect("trace events serialise") + "\n"
    }
}

/// The category (engine) and arguments of node `n`'s slice doing `w`: its
/// op, the bytes it moves and the FLOPs it does by the cost model's count,
/// so a predicted and a measured slice of one instruction carry the same
/// figures.
fn labels(graph: &Graph, n: NodeIndex, w: &Work) -> (&'static str, Json) {
    (w.engine.name(), json!({ "op": graph.node(n).op.name(), "bytes": w.bytes, "flops": w.flops }))
}

/// The cost model's timeline of `plan`'s step on its GPU: every
/// micro-batch and the optimizer, one process. The program is the same on
/// every rank and the model times them alike, so one rank stands for all.
pub fn predicted(plan: &Plan) -> Result<Trace, String> {
    let machine = crate::commands::inspect::machine(plan)?;
    let graph = &plan.program.graph;
    let order = graph.topo_order();
    let bindings = bindings(plan.program.batch, plan.program.seq);
    let events = step_timeline(graph, &order, &bindings, &machine, plan.strategy.micro_batches)
        .ok_or("error: the plan's graph has unbound sizes")?;
    let mut trace = Trace::default();
    trace.process(
        0,
        &format!(
            "predicted: {} on {} × {}, {} (every rank alike)",
            plan.model, plan.strategy.ranks, plan.cluster.gpu.name, plan.strategy
        ),
    );
    for stream in STREAMS {
        trace.thread(0, tid(stream), stream.name());
    }
    for (micro_batch, e) in &events {
        let Some(stream) = e.stream else { continue };
        let (cat, mut args) = labels(graph, e.node, &e.work);
        args["micro_batch"] = (*micro_batch).into();
        trace.slice((0, tid(stream)), &graph.node(e.node).name, cat, (e.start, e.end), args);
    }
    Ok(trace)
}

/// The host runtime's timeline of `ranks`' profiles (each rank one process,
/// its compute and communication threads), from the earliest instruction.
pub fn measured(program: &Program, ranks: &[&Profile]) -> Result<Trace, String> {
    let graph = &program.graph;
    let bindings = bindings(program.batch, program.seq);
    let origin = ranks.iter().flat_map(|p| p.spans()).map(|s| s.start).min();
    let mut trace = Trace::default();
    for (rank, profile) in ranks.iter().enumerate() {
        let pid = rank as u64;
        trace.process(pid, &format!("rank {rank} (measured, host runtime)"));
        for stream in [Stream::Compute, Stream::Comm, Stream::TensorComm] {
            trace.thread(pid, tid(stream), stream.name());
        }
        for span in profile.spans() {
            let w = work(graph, span.node, &bindings)
                .ok_or_else(|| format!("error: node `{}` has unbound sizes", graph.node(span.node).name))?;
            let (cat, args) = labels(graph, span.node, &w);
            let stream = match span.track {
                Track::Compute => Stream::Compute,
                Track::Comm => Stream::Comm,
                Track::TensorComm => Stream::TensorComm,
            };
            let start = origin.map_or(0.0, |o| span.start.duration_since(o).as_secs_f64());
            trace.slice((pid, tid(stream)), &graph.node(span.node).name, cat, (start, start + span.seconds), args);
        }
    }
    Ok(trace)
}
