//! The command line, as clap sees it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "zeroplan", version, about = "Compile BERT-family models into memory-planned training programs")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log to standard error as the work goes: each pass, the planner's search and each training
    /// step with its time (`-v`); each strategy tried too (`-vv`).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Subcommand)]
pub enum Command {
    /// Plan training on a cluster: the fastest strategy that fits, with its memory, traffic and time.
    Compile(Box<CompileArgs>),
    /// Show a plan file: memory per GPU by category, traffic, predicted speed, the runner-up.
    Inspect(InspectArgs),
    /// Build a model's forward graph and print it (text, Graphviz or JSON) or its summary.
    Graph(Box<GraphArgs>),
    /// Train a model for some steps and log each step.
    Train(Box<TrainArgs>),
    /// Embed texts with a sentence-transformers model (mean-pooled, unit-norm) and print their cosine similarities.
    Embed(EmbedArgs),
    /// List the devices plans can run on here: the host, and CUDA GPUs if a driver is found.
    Devices(DevicesArgs),
    /// Consolidate a training checkpoint (`train --save DIR`) into one Hugging Face safetensors file.
    Export(ExportArgs),
    /// Fine-tune a model on a GLUE task on this CPU, scoring the dev files after each epoch and keeping the best.
    Finetune(Box<FinetuneArgs>),
    /// Score a fine-tuned model on a GLUE task's dev files with the task's metrics.
    Eval(EvalArgs),
    /// Predict a GLUE task's test file with a fine-tuned model, as a GLUE submission TSV.
    Predict(PredictArgs),
    /// Write the DeepSpeed configuration (ds_config.json) that trains as a plan does.
    ExportDeepspeed(ExportDeepspeedArgs),
    /// The largest model of a family that trains on a cluster, by model states alone and with a full plan.
    Capacity(Box<CapacityArgs>),
    /// Run a command as one process per rank, with torchrun's environment: `launch --nproc N -- train SPEC …`.
    Launch(LaunchArgs),
}

impl Command {
    /// Whether the run asked for JSON (`--json`, or `--log-json`, which `--json` also spells), so its
    /// error goes to standard error as JSON too.
    pub fn json(&self) -> bool {
        match self {
            Command::Compile(a) => a.json,
            Command::Inspect(a) => a.json,
            Command::Graph(a) => a.json,
            Command::Train(a) => a.log_json,
            Command::Embed(a) => a.json,
            Command::Devices(a) => a.json,
            Command::Export(a) => a.json,
            Command::Finetune(a) => a.log_json,
            Command::Eval(a) => a.json,
            Command::Predict(a) => a.json,
            Command::ExportDeepspeed(a) => a.json,
            Command::Capacity(a) => a.json,
            Command::Launch(_) => false,
        }
    }
}

/// The task and model `finetune`, `eval` and `predict` share.
#[derive(Args)]
pub struct TaskArgs {
    /// A GLUE task preset (cola, mnli, mrpc, qnli, qqp, rte, sst2, stsb) or a task spec file (TASK.ron).
    #[arg(long, value_name = "TASK|TASK.ron")]
    pub task: String,
    /// A model directory: config.json, model.safetensors, tokenizer.json (Hugging Face's layout). For
    /// `finetune`, the model to start from; for `eval` and `predict`, one `finetune` wrote.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Sequences per batch.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_size: u64,
    /// Tokens per sequence (default: the task's, at most the model's max_position_embeddings).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seq_len: Option<u64>,
}

#[derive(Args)]
pub struct FinetuneArgs {
    #[command(flatten)]
    pub common: TaskArgs,
    /// The training file, in the task's GLUE layout.
    #[arg(long, value_name = "train.tsv")]
    pub train: PathBuf,
    /// A dev file in the task's layout, or a directory holding the task's dev files (MNLI's
    /// dev_matched.tsv and dev_mismatched.tsv); repeat for more. The best epoch is the one with
    /// the best first metric of the task on the first dev file.
    #[arg(long = "dev", value_name = "dev.tsv|DIR", required = true)]
    pub dev: Vec<PathBuf>,
    /// Where the best epoch's model goes, in Hugging Face layout: config.json (with the task's
    /// labels), model.safetensors, tokenizer.json, and eval.json with its scores
    /// (default: finetuned-TASK).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Start from this model directory's model.safetensors instead of --model's: staged fine-tuning
    /// (RTE, MRPC and STS-B from an MNLI-fine-tuned model). A classifier over another label count is replaced.
    #[arg(long, value_name = "DIR")]
    pub init_from: Option<PathBuf>,
    /// Passes over the training file (default: the task's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub epochs: Option<u64>,
    /// Peak learning rate (default: the task's); it decays linearly to 0 over the run.
    #[arg(long)]
    pub lr: Option<f64>,
    /// AdamW's decoupled weight decay (default: the task's).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Linear warm-up steps.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Dropout probability for hidden states and attention (default: the model's).
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Seed of the classifier's initialisation, the shuffling and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object per epoch (`epoch`, `steps`, `loss`, `seconds`, `dev`, `best`).
    #[arg(long, visible_alias = "json")]
    pub log_json: bool,
}

#[derive(Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub common: TaskArgs,
    /// A dev file in the task's layout, or a directory holding the task's dev files; repeat for more.
    #[arg(long = "dev", value_name = "dev.tsv|DIR", required = true)]
    pub dev: Vec<PathBuf>,
    /// Print `{FILE: {METRIC: value}}` as JSON (an undefined correlation is null).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PredictArgs {
    #[command(flatten)]
    pub common: TaskArgs,
    /// The task's test file as GLUE distributes it: a header, the index first, no label.
    #[arg(long, value_name = "test.tsv")]
    pub test: PathBuf,
    /// Write the submission (`index<TAB>prediction`: class names, or scores) here, atomically;
    /// standard output without it.
    #[arg(short, long, value_name = "FILE.tsv")]
    pub output: Option<PathBuf>,
    /// Print `{"task", "rows", "output"}` as JSON, with `"predictions"` (`[{"index", "prediction"}]`)
    /// in place of the TSV when there is no --output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ExportDeepspeedArgs {
    /// A plan written by `zeroplan compile -o`.
    pub plan: PathBuf,
    /// The DeepSpeed configuration to write, atomically (standard output without it).
    #[arg(short, long, value_name = "ds_config.json")]
    pub output: Option<PathBuf>,
    /// Print `{"output", "notes", "config"}` as JSON (`config`: the configuration, when there is no
    /// --output) instead of the configuration and notes.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ExportArgs {
    /// A directory `train --save` wrote (its newest complete save), or one step directory in it.
    pub checkpoint: PathBuf,
    /// The safetensors file to write, atomically: the model's parameters in fp32, under
    /// Hugging Face names (`transformers` loads it).
    #[arg(short, long, value_name = "FILE.safetensors")]
    pub output: PathBuf,
    /// Print `{"output", "model", "step", "ranks", "checkpoint"}` as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CompileArgs {
    /// A `.ron` model spec (see models/) or a Hugging Face `config.json` (or its directory).
    pub spec: PathBuf,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub seq: u64,
    /// Sequences per optimizer step over all GPUs.
    #[arg(long, required_unless_present = "deepspeed")]
    pub global_batch: Option<u64>,
    #[command(flatten)]
    pub training: TrainingArgs,
    /// Pin the tensor-parallel degree (Megatron-LM layers over T consecutive GPUs; the search tries
    /// the divisors of --gpus that fit in a node).
    #[arg(long, value_name = "T")]
    pub tp: Option<u64>,
    /// Pin Megatron's sequence parallelism on (LayerNorm, dropout and residual activations split over
    /// the tensor ranks along the sequence; needs T > 1 dividing --seq). Default: the search tries
    /// both wherever T > 1.
    #[arg(long, conflicts_with = "no_sp")]
    pub sp: bool,
    /// Pin sequence parallelism off.
    #[arg(long)]
    pub no_sp: bool,
    /// Pin the ZeRO stage (0–3), over the data-parallel ranks.
    #[arg(long, value_name = "STAGE")]
    pub zero: Option<u8>,
    /// Pin the recomputation policy: none, selective, full or optimal:SIZE
    /// (the least recomputation whose stored activations fit SIZE, e.g. optimal:4GiB).
    #[arg(long, value_parser = parse_recompute)]
    pub recompute: Option<zeroplan_passes::recompute::Policy>,
    /// Pin ZeRO-Offload: none, optimizer or optimizer+params.
    #[arg(long, value_parser = parse_offload)]
    pub offload: Option<zeroplan_ir::plan::Offload>,
    /// Pin where offloaded states live: cpu (pinned CPU memory) or nvme (the node's drives, streamed
    /// through CPU memory; needs --nvme). Default: cpu, and nvme too where --nvme is given.
    #[arg(long, value_name = "TIER", value_parser = parse_offload_to)]
    pub offload_to: Option<zeroplan_ir::plan::OffloadTo>,
    /// Pin the sequences per micro-batch per GPU.
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// Pin memory-centric tiling: the largest gathered operator is computed as N tiles, each gathered,
    /// used and freed before the next (1: none). Default: the search tiles ZeRO-3 choices that do not
    /// fit untiled.
    #[arg(long, value_name = "N")]
    pub tiles: Option<u64>,
    /// How attention runs: fused (one flash-attention kernel per layer; the s × s probabilities are never
    /// stored) or unfused (scores, softmax and dropout as separate tensors, kept for the backward, as
    /// Megatron-LM before FlashAttention and Hugging Face's eager attention run it). Never searched:
    /// fused is the default and does the same FLOPs in less time and memory.
    #[arg(long, value_name = "fused|unfused", default_value = "fused", value_parser = parse_attention)]
    pub attention: zeroplan_ir::plan::Attention,
    /// Search with every candidate compiled whole, not by two short stacks (slower; for checking).
    #[arg(long)]
    pub whole_depth: bool,
    /// Compile every strategy, also those a cheaper twin beats at every micro-batch they could use
    /// (recomputing where keeping every activation fits, NVMe where CPU memory holds the states):
    /// slower; for checking, and for every candidate's figures.
    #[arg(long)]
    pub exhaustive: bool,
    /// Predict the step as `train --backend cuda --cuda-graphs` runs it: instructions replayed from
    /// CUDA graphs pay a graph node's launch cost, not an eager launch's (the plan records which).
    #[arg(long)]
    pub cuda_graphs: bool,
    /// Plan a DeepSpeed configuration as given (its ZeRO stage, offload, activation checkpointing,
    /// micro-batch, precision and optimizer pinned; flags above override it) and compare it with the best
    /// plan found. `-o` writes the configuration's plan.
    #[arg(long, value_name = "ds_config.json")]
    pub deepspeed: Option<PathBuf>,
    /// Write the plan (RON) here, atomically.
    #[arg(short, long, value_name = "PLAN.ron")]
    pub output: Option<PathBuf>,
    /// Print the inspection as JSON (every candidate, whatever --candidates says).
    #[arg(long)]
    pub json: bool,
    /// The candidates listed: the N fastest distinct plans (choices the search predicts as one plan on one
    /// line, e.g. `recompute none = selective`), or `all`: every candidate searched, one line each.
    #[arg(long, value_name = "N|all", default_value = "8", value_parser = parse_candidates)]
    pub candidates: Candidates,
}

impl CompileArgs {
    /// How the predicted ranks launch their instructions.
    pub fn launches(&self) -> zeroplan_ir::plan::Launches {
        if self.cuda_graphs { zeroplan_ir::plan::Launches::Graphs } else { zeroplan_ir::plan::Launches::Eager }
    }
}

/// How many of a plan's candidates its text lists (`--candidates`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidates {
    /// The fastest distinct plans, identical ones merged into one line.
    Best(usize),
    /// Every candidate the search evaluated, one line each.
    All,
}

impl Default for Candidates {
    /// Eight lines: the plan and its closest alternatives, without the
    /// long tail of combinations a person does not read.
    fn default() -> Candidates {
        Candidates::Best(8)
    }
}

/// The training a plan is for: the optimizer and precision.
#[derive(Args)]
pub struct TrainingArgs {
    /// A RON training spec (optimizer, precision…); `--precision` overrides it.
    #[arg(long, value_name = "TRAIN.ron")]
    pub train: Option<PathBuf>,
    /// Compute precision: f32, bf16 or f16 (default: the training spec's, else bf16).
    #[arg(long, value_parser = parse_precision)]
    pub precision: Option<zeroplan_ir::spec::Precision>,
}

/// The cluster a plan is for.
#[derive(Args)]
pub struct ClusterArgs {
    /// GPUs in all: data-parallel ranks × tensor-parallel ranks.
    #[arg(long, default_value_t = 1)]
    pub gpus: u64,
    /// Nodes the GPUs are spread over, evenly.
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
    /// GPU profile: a bundled name (v100-32gb, a100-40gb, a100-80gb, h100-80gb-sxm, h200) or a RON file.
    #[arg(long)]
    pub gpu: String,
    /// Per-GPU memory budget (`40GiB`, `38000MiB`, `40GB`); the card's memory by default.
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<u64>,
    /// Host memory per node a plan may fill with offloaded optimizer states and parameters (`512GiB`);
    /// unchecked by default.
    #[arg(long, value_parser = parse_bytes)]
    pub host_memory: Option<u64>,
    /// Local NVMe per node a plan may fill with offloaded states (`28TiB`): ZeRO-Infinity's NVMe tier,
    /// searched beside CPU memory. Absent: no NVMe tier.
    #[arg(long, value_parser = parse_bytes)]
    pub nvme: Option<u64>,
    /// The node's NVMe bandwidth, all drives together, GB/s: `READ,WRITE` or one figure for both
    /// (default: the GPU profile's node, e.g. a DGX-2's for v100-32gb).
    #[arg(long, value_name = "READ[,WRITE]", value_parser = parse_nvme_gbps)]
    pub nvme_gbps: Option<(f64, f64)>,
}

#[derive(Args)]
pub struct CapacityArgs {
    /// The family: a `.ron` model spec or a Hugging Face `config.json`, scaled in depth and width along
    /// GPT-3's sizes (125M to 175B) with its head width, feed-forward ratio and layer kind kept.
    pub spec: PathBuf,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub seq: u64,
    #[command(flatten)]
    pub training: TrainingArgs,
    /// Pin the tensor-parallel degree (default: the search's, up to a node).
    #[arg(long, value_name = "T")]
    pub tp: Option<u64>,
    /// Pin the ZeRO stage (default: the search's; stage 3 for the model-states figure).
    #[arg(long, value_name = "STAGE")]
    pub zero: Option<u8>,
    /// Pin ZeRO-Offload: none, optimizer or optimizer+params (default: the search's).
    #[arg(long, value_parser = parse_offload)]
    pub offload: Option<zeroplan_ir::plan::Offload>,
    /// Write the largest size's plan (RON) here, atomically.
    #[arg(short, long, value_name = "PLAN.ron")]
    pub output: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct EmbedArgs {
    /// A model directory holding config.json, model.safetensors and tokenizer.json.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A text to embed; repeat for more.
    #[arg(long = "text", value_name = "TEXT", required = true)]
    pub texts: Vec<String>,
    /// Where the encoder runs. `cpu`: compiled for each batch × length, on this CPU; `reference`: the exact
    /// interpreter, slow, the oracle `cpu` is checked against.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Print `{"dim", "embeddings", "similarity"}` as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct InspectArgs {
    /// A plan written by `zeroplan compile -o`.
    pub plan: PathBuf,
    /// Print JSON (`strategy.*`, `memory.*`, `comm.*`, `predicted.*`, `runner_up`, `candidates`).
    #[arg(long)]
    pub json: bool,
    /// The candidates listed: the N fastest distinct plans, or `all` (as `compile --candidates`).
    #[arg(long, value_name = "N|all", default_value = "8", value_parser = parse_candidates)]
    pub candidates: Candidates,
    /// List the schedule: one line per instruction with its stream and predicted start.
    #[arg(long)]
    pub timeline: bool,
    /// Write the predicted step (every micro-batch and the optimizer, one slice per instruction on its
    /// compute, comm, copy or host stream, with its bytes and FLOPs) as Chrome trace-event JSON for Perfetto.
    #[arg(long, value_name = "OUT.json")]
    pub trace: Option<PathBuf>,
    /// Draw one rank's memory over the step, stacked by category (workspace, parameters, optimizer,
    /// gradients, activations) against the budget, beside every strategy the search tried (peak memory
    /// against predicted throughput, the chosen one marked), as SVG.
    #[arg(long, value_name = "OUT.svg")]
    pub memory_svg: Option<PathBuf>,
}

#[derive(Args)]
pub struct TrainArgs {
    /// A `.ron` model spec (see models/), a Hugging Face `config.json` (or its directory),
    /// or (with `--backend cpu|cuda`) a plan file from `zeroplan compile` (trained at its batch
    /// and sequence length on `--data`, `--batch`, or else a seeded synthetic batch).
    pub spec: PathBuf,
    /// Where the step runs. `reference`: the exact interpreter; `cpu`: the compiled plan on this CPU.
    #[arg(long, value_enum, default_value_t = Backend::Reference)]
    pub backend: Backend,
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Training data (`--backend cpu`): a text file (MLM: one sequence per line, 15% of tokens
    /// masked 80/10/10) or a GLUE-style `.tsv` (header row; sentence or sentence pair; label).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// The `tokenizer.json` for `--data` (default: beside the spec's config.json).
    #[arg(long, value_name = "tokenizer.json")]
    pub tokenizer: Option<PathBuf>,
    /// Print one JSON object per step (`step`, `loss`, `lr`, `grad_norm`, `skipped`, `loss_scale`;
    /// with `--backend cpu|cuda` also `step_seconds`, `tokens_per_s`, `arena_high_water_bytes`,
    /// and on the first line `setup`: `compile_seconds`, `load_seconds`).
    #[arg(long, visible_alias = "json")]
    pub log_json: bool,
    /// A RON training spec; the flags below override it.
    #[arg(long, value_name = "TRAIN.ron")]
    pub train: Option<PathBuf>,
    /// Initial weights, Hugging Face tensor names (otherwise a seeded initialisation).
    #[arg(long, value_name = "FILE.safetensors")]
    pub weights: Option<PathBuf>,
    /// A fixed batch repeated every step: `input_ids`, `token_type_ids`,
    /// `attention_mask`, `labels` (-100 = ignore). Otherwise a seeded synthetic batch.
    #[arg(long, value_name = "FILE.safetensors")]
    pub batch: Option<PathBuf>,
    /// Synthetic batch: sequences per micro-batch.
    #[arg(long, default_value_t = 2)]
    pub batch_size: usize,
    /// Synthetic batch: tokens per sequence.
    #[arg(long, default_value_t = 16)]
    pub seq_len: usize,
    /// `FILE.safetensors`: the trained weights at the end (Hugging Face names), atomically.
    /// A directory (`--backend cpu`): training checkpoints — each rank's parameters, fp32
    /// masters, AdamW moments, with the step, seed and data position — at the end and every
    /// `--save-every` steps; `--resume DIR` continues one, `zeroplan export DIR` consolidates it.
    #[arg(long, value_name = "FILE.safetensors|DIR")]
    pub save: Option<PathBuf>,
    /// With `--save DIR`: also save every K steps.
    #[arg(long, value_name = "K", requires = "save")]
    pub save_every: Option<u64>,
    /// With `--save DIR`: how many complete saves to keep (older ones are removed).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: u64,
    /// Continue the newest complete save in DIR (`--backend cpu`), bit for bit on the ranks and
    /// ZeRO stage it was saved with, resharded on others; `--steps` counts from the run's start.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// `--backend cpu`: `--ranks` run as threads of this process that exchange
    /// gradients through the plan's collectives, each rank on its own batches
    /// (the global batch is ranks × micro-batches × --batch-size). Under
    /// `zeroplan launch`, one process per rank; --ranks defaults to WORLD_SIZE / --tp.
    #[command(flatten)]
    pub data_parallel: DataParallelArgs,
    /// ZeRO-Infinity (`--backend cpu`, with `--offload`): where the offloaded states live:
    /// `cpu` (host memory, the default) or `nvme` (state files under `--nvme-dir`).
    #[arg(long, value_name = "TIER", value_parser = parse_offload_to)]
    pub offload_to: Option<zeroplan_ir::plan::OffloadTo>,
    /// The directory (on the NVMe drive) of the states `--offload` puts on the host — fp32
    /// masters, AdamW moments, offloaded parameter shards — one preallocated file per rank,
    /// read and written with asynchronous direct I/O around their uses; a cache, removed at the
    /// end of the run (checkpoints copy the states out). Implies `--offload-to nvme`.
    #[arg(long, value_name = "DIR")]
    pub nvme_dir: Option<PathBuf>,
    /// `--backend cpu`: tensor-parallel ranks per model replica (Megatron-LM
    /// layers, the vocabulary split over them); the run is --ranks × T
    /// threads, a replica's T ranks sharing its batch.
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u64).range(1..))]
    pub tp: Option<u64>,
    /// `--backend cpu`, with --tp T > 1: Megatron's sequence parallelism (LayerNorm, dropout and
    /// residual regions on seq/T positions per tensor rank; T must divide --seq-len).
    #[arg(long)]
    pub sp: bool,
    /// Seed of the initialisation, the synthetic batch and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Replace the spec's head: `mlm` or `classification:N`.
    #[arg(long, value_parser = parse_head)]
    pub head: Option<zeroplan_ir::spec::Head>,
    /// Dropout probability for hidden states and attention (0 disables).
    #[arg(long)]
    pub dropout: Option<f64>,
    #[arg(long)]
    pub lr: Option<f64>,
    /// AdamW betas, as `b1,b2`.
    #[arg(long, value_parser = parse_betas)]
    pub betas: Option<(f64, f64)>,
    #[arg(long)]
    pub eps: Option<f64>,
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Linear warm-up steps.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Micro-batches accumulated per step (the batch is repeated).
    #[arg(long)]
    pub micro_batches: Option<u64>,
    /// Compute precision: f32, bf16, or f16 (with dynamic loss scaling).
    #[arg(long, value_parser = parse_precision)]
    pub precision: Option<zeroplan_ir::spec::Precision>,
    /// `--backend cpu|cuda`: write every instruction's measured run (each rank's compute and comm threads) as
    /// Chrome trace-event JSON, the format of `inspect --trace`, and print the slowest instruction kinds.
    /// With more than one step, the first is a warm-up (lazy kernel loads, cuBLASLt's heuristics) left out.
    #[arg(long, value_name = "OUT.json")]
    pub profile: Option<PathBuf>,
    /// `--backend cuda`: record runs of the step's instructions once as CUDA graphs and replay them
    /// (`on`, `off`, or `auto`: on unless --profile asks for per-instruction timings). Instructions
    /// the CPU runs or waits for (feeds, staged routines, collectives) are launched eagerly.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_graph_mode)]
    pub cuda_graphs: zeroplan_runtime::runner::GraphMode,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The reference interpreter: exact, slow, any machine.
    Reference,
    /// The host runtime: the planned program, Cranelift kernels and GEMMs, on this CPU.
    Cpu,
    /// The planned program on a GPU (`train` only): NVRTC kernels, cuBLAS GEMMs, the
    /// plan's arena in GPU memory.
    Cuda,
}

#[derive(Args)]
pub struct GraphArgs {
    /// A `.ron` model spec (see models/) or a Hugging Face `config.json` (or its directory).
    pub spec: PathBuf,
    /// Output format of the graph.
    #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
    pub format: GraphFormat,
    /// Print a summary (parameters, layers, nodes…) instead of the graph.
    #[arg(long)]
    pub summary: bool,
    /// Print JSON: the summary as one object with --summary, else the graph.
    #[arg(long)]
    pub json: bool,
    /// Replace the spec's head: `mlm`, `pooler`, or `classification:N`.
    #[arg(long, value_parser = parse_head)]
    pub head: Option<zeroplan_ir::spec::Head>,
    /// Compute dtype of the forward graph (with --train, the training spec's precision decides).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: zeroplan_ir::DType,
    /// Show the whole training step (forward, backward, optimizer) under a RON
    /// training spec, or the defaults when no file is given.
    #[arg(long, value_name = "TRAIN.ron", num_args = 0..=1, require_equals = false)]
    pub train: Option<Option<PathBuf>>,
    /// Write to this file (atomically) instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Show the graph as it stands after this pass (the later passes do not run), e.g. `--after recompute`.
    #[arg(long, value_name = "PASS")]
    pub after: Option<String>,
    #[command(flatten)]
    pub passes: PassArgs,
}

/// How the pass pipeline runs.
#[derive(Args)]
pub struct PassArgs {
    /// Switch passes off by name (`--disable rewrite,fuse`).
    #[arg(long, value_delimiter = ',', value_name = "PASS")]
    pub disable: Vec<String>,
    /// Print the text IR to standard error after these passes.
    #[arg(long, value_delimiter = ',', value_name = "PASS")]
    pub dump_after: Vec<String>,
    /// Write the text IR after every pass into DIR, as `NN-pass.ir`.
    #[arg(long, value_name = "DIR")]
    pub dump_all: Option<PathBuf>,
    /// Print each pass's time, node counts and statistics to standard error.
    #[arg(long)]
    pub time_passes: bool,
    /// Stop applying rewrites after N, to bisect a miscompile.
    #[arg(long, value_name = "N")]
    pub pass_limit: Option<usize>,
    /// Explain a pass's decisions (alternatives and their costs) on standard error.
    #[arg(long, value_delimiter = ',', value_name = "PASS")]
    pub explain: Vec<String>,
    /// Activation recomputation in training steps: none, full (each layer
    /// from its input), selective (attention scores and softmax) or
    /// optimal:SIZE (per layer, the least recomputation whose stored
    /// activations fit SIZE at --batch-size × --seq-len, e.g. optimal:4GiB).
    #[arg(long, default_value = "none", value_parser = parse_recompute)]
    pub recompute: zeroplan_passes::recompute::Policy,
    #[command(flatten)]
    pub data_parallel: DataParallelArgs,
    /// Build training steps for one of T tensor-parallel ranks (Megatron-LM layers).
    #[arg(long, value_name = "T")]
    pub tp: Option<u64>,
    /// With --tp T > 1: Megatron's sequence parallelism (LayerNorm, dropout and residual regions on
    /// seq/T positions per tensor rank).
    #[arg(long)]
    pub sp: bool,
    /// The per-GPU micro-batch cost models assume.
    #[arg(long, default_value_t = 32)]
    pub batch_size: u64,
    /// The sequence length cost models assume.
    #[arg(long, default_value_t = 128)]
    pub seq_len: u64,
    /// Memory-centric tiling in training steps: the largest parameter matmul as N tiles, each gathered,
    /// used and freed before the next (the `tiling` pass).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub tiles: Option<u64>,
}

/// Data parallelism of a training step: `--ranks` runs the `partition` pass
/// (ZeRO flat buffers and collectives).
#[derive(Args)]
pub struct DataParallelArgs {
    /// Data-parallel ranks of a training step.
    #[arg(long, value_name = "N")]
    pub ranks: Option<u64>,
    /// ZeRO stage for `--ranks`: 0 (plain data parallel) to 3.
    #[arg(long, default_value_t = 0, value_name = "STAGE")]
    pub zero: u8,
    /// ZeRO-Offload for `--ranks`: none, optimizer, optimizer+params.
    #[arg(long, default_value = "none", value_parser = parse_offload)]
    pub offload: zeroplan_ir::plan::Offload,
}

impl DataParallelArgs {
    /// The strategy, when `--ranks` is given.
    pub fn strategy(&self) -> Option<zeroplan_ir::plan::DataParallel> {
        self.ranks.map(|ranks| zeroplan_ir::plan::DataParallel { ranks, zero_stage: self.zero, offload: self.offload })
    }
}

impl PassArgs {
    pub fn options(&self) -> zeroplan_passes::manager::PassOptions {
        zeroplan_passes::manager::PassOptions {
            disabled: self.disable.iter().cloned().collect(),
            dump_after: self.dump_after.iter().cloned().collect(),
            dump_dir: self.dump_all.clone(),
            pass_limit: self.pass_limit,
            explain: self.explain.iter().cloned().collect(),
            shape_hint: [("batch".to_string(), self.batch_size), ("seq".to_string(), self.seq_len)].into(),
            recompute: self.recompute,
            data_parallel: self.data_parallel.strategy(),
            tensor_parallel: self.tp,
            sequence_parallel: self.sp,
            tiles: self.tiles,
            // `graph` and `train` from a spec name no GPU to weigh chunks on.
            collective_chunks: Default::default(),
            skip_verify: false,
            weighed: None,
        }
    }
}

#[derive(Args)]
pub struct LaunchArgs {
    /// Ranks (processes) on this node. Each gets LOCAL_RANK 0..N, which picks its GPU under --backend cuda.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub nproc: u64,
    /// Nodes in the run: start one launch on each, with the same --master-addr and --master-port.
    #[arg(long, value_name = "M", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub nnodes: u64,
    /// This node's index (0..M): its ranks are node_rank·N + LOCAL_RANK.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub node_rank: u64,
    /// Where rank 0 (on node 0) serves the rendezvous: an address every node reaches (default 127.0.0.1).
    #[arg(long, value_name = "ADDR")]
    pub master_addr: Option<String>,
    /// The rendezvous port (default: a free one on this host; required with --nnodes > 1).
    #[arg(long, value_name = "P")]
    pub master_port: Option<u16>,
    /// A file holding the job token, the secret that admits a rank to the rendezvous and to the other
    /// ranks (readable by its owner only; the same on every node). Default: ZEROPLAN_JOB_TOKEN, else
    /// the file ZEROPLAN_JOB_TOKEN_FILE names, else (one node only) a fresh one drawn for this launch.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// What every rank runs: zeroplan's arguments after `--` (e.g. `-- train SPEC --backend cpu --zero 2`).
    #[arg(last = true, required = true, value_name = "ARGS")]
    pub command: Vec<String>,
}

#[derive(Args)]
pub struct DevicesArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// One line per node, in topological order.
    Text,
    /// Graphviz DOT: a cluster per layer, per fused kernel (its body); recomputed nodes in red.
    Dot,
    /// The graph file's layout, in JSON.
    Json,
}

fn parse_head(s: &str) -> Result<zeroplan_ir::spec::Head, String> {
    use zeroplan_ir::spec::Head;
    match s {
        "mlm" => Ok(Head::Mlm),
        "pooler" => Ok(Head::Pooler),
        _ => s
            .strip_prefix("classification:")
            .and_then(|n| n.parse().ok())
            .map(|num_labels| Head::Classification { num_labels })
            .ok_or_else(|| format!("`{s}` is not a head: use mlm, pooler or classification:N (N = 1 for regression)")),
    }
}

fn parse_recompute(s: &str) -> Result<zeroplan_passes::recompute::Policy, String> {
    zeroplan_passes::recompute::Policy::from_name(s).ok_or_else(|| {
        format!("`{s}` is not a recomputation policy: use none, full, selective or optimal:SIZE (e.g. optimal:4GiB)")
    })
}

fn parse_offload(s: &str) -> Result<zeroplan_ir::plan::Offload, String> {
    zeroplan_ir::plan::Offload::from_name(s)
        .ok_or_else(|| format!("`{s}` is not an offload: use none, optimizer or optimizer+params"))
}

fn parse_offload_to(s: &str) -> Result<zeroplan_ir::plan::OffloadTo, String> {
    zeroplan_ir::plan::OffloadTo::from_name(s).ok_or_else(|| format!("`{s}` is not an offload tier: use cpu or nvme"))
}

fn parse_attention(s: &str) -> Result<zeroplan_ir::plan::Attention, String> {
    zeroplan_ir::plan::Attention::from_name(s)
        .ok_or_else(|| format!("`{s}` is not a way to run attention: use fused or unfused"))
}

fn parse_candidates(s: &str) -> Result<Candidates, String> {
    match s {
        "all" => Ok(Candidates::All),
        _ => s
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .map(Candidates::Best)
            .ok_or_else(|| format!("`{s}` is not a number of candidates: write a count such as 8, or all")),
    }
}

/// `25,22.7` (read, write GB/s) or `25` for both.
fn parse_nvme_gbps(s: &str) -> Result<(f64, f64), String> {
    let figure = |t: &str| t.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0);
    let parsed = match s.split_once(',') {
        Some((r, w)) => figure(r).zip(figure(w)),
        None => figure(s).map(|x| (x, x)),
    };
    parsed.ok_or_else(|| format!("`{s}` is not an NVMe bandwidth: write READ,WRITE in GB/s, e.g. 25,22.7"))
}

/// `40GiB`, `512MiB`, `40GB`, `1.5TiB` or plain bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("`{s}`: unknown unit `{unit}`; write e.g. 40GiB, 38000MiB or 40GB")),
    };
    match number.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok((x * scale) as u64),
        _ => Err(format!("`{s}` is not a memory size: write e.g. 40GiB, 38000MiB or 40GB")),
    }
}

fn parse_betas(s: &str) -> Result<(f64, f64), String> {
    let parsed = s.split_once(',').and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    parsed.ok_or_else(|| format!("`{s}` is not a pair of betas: write e.g. 0.9,0.98"))
}

fn parse_precision(s: &str) -> Result<zeroplan_ir::spec::Precision, String> {
    use zeroplan_ir::spec::{LossScaling, Precision};
    match s {
        "f32" => Ok(Precision::F32),
        "bf16" => Ok(Precision::Bf16),
        "f16" => Ok(Precision::F16(LossScaling::default())),
        _ => Err(format!("`{s}` is not a precision: use f32, bf16 or f16")),
    }
}

fn parse_dtype(s: &str) -> Result<zeroplan_ir::DType, String> {
    zeroplan_ir::DType::from_name(s).ok_or_else(|| format!("`{s}` is not a dtype: use f32, bf16 or f16"))
}

fn parse_graph_mode(s: &str) -> Result<zeroplan_runtime::runner::GraphMode, String> {
    s.parse()
}
