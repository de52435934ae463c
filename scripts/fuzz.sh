#!/usr/bin/env bash
# Fuzzes everything zeroplan reads from disk, for a fixed budget per target:
# model specs (RON), Hugging Face config.json, plan files (parsed and loaded
# on the host runtime), safetensors weights and batches, and training
# checkpoint manifests; and the structured targets, which mutate a compiled
# plan (`plan_mutation`), one rank's plan of a two-rank one run with its peer
# (`plan_mutation_ranks`) and a real checkpoint directory
# (`checkpoint_mutation`) and check that the runtime refuses each mutant or
# runs it inside its arenas. Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). Seeds come from the repo's own files and a
# few zeroplan runs (the structured targets make their own); results are
# appended to fuzz/RESULTS.md, crashes kept in fuzz/artifacts/TARGET/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   scripts/fuzz.sh 60 plan_mutation plan_mutation_ranks checkpoint_mutation   # a minute each
#
# Every target's body is a function of zeroplan_untrusted::targets. Their
# corpora are kept in the repo (fuzz/corpus/TARGET), minimised after each
# run (`cargo fuzz cmin`). CI has no nightly: it runs the same functions for
# a minute each on stable, from these corpora (untrusted/tests/timed.rs),
# and replays fixed mutants (untrusted/tests/replay.rs). Builds go to
# $CARGO_TARGET_DIR/fuzz when that is set, else fuzz/target.
#
# Leak detection is off (-detect_leaks=0): a leak is no memory-safety bug in
# Rust, and libFuzzer re-runs every input whose allocations outnumber its
# frees (caches filled, thread pools started) to look for one, which made
# plan_mutation half again as slow (72 fixed inputs: 32 s against 21 s).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(spec hf_config plan safetensors checkpoint plan_mutation plan_mutation_ranks checkpoint_mutation)
target_dir=()
[ -z "${CARGO_TARGET_DIR:-}" ] || target_dir=(--target-dir "$CARGO_TARGET_DIR/fuzz")

results=fuzz/RESULTS.md
[ -f "$results" ] || printf '# Fuzzing results\n\n| date | target | seconds | runs | corpus | crashes |\n|---|---|---|---|---|---|\n' > "$results"
# Runs target $1 for $seconds on its corpus and appends a row to the results.
run() {
  local t=$1 log="fuzz/work/$1.log" status=0
  mkdir -p fuzz/work "fuzz/corpus/$t"
  (cd fuzz && cargo +nightly fuzz run "${target_dir[@]}" "$t" "../fuzz/corpus/$t" -- -max_total_time="$seconds" \
     -rss_limit_mb=4096 -detect_leaks=0 -print_final_stats=1) > "$log" 2>&1 || status=$?
  local runs crashes inputs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  crashes=$(ls "fuzz/artifacts/$t" 2>/dev/null | wc -l)
  inputs=$(ls "fuzz/corpus/$t" | wc -l)
  echo "$t: ${runs:-?} runs, $inputs corpus inputs, $crashes crash files, exit $status"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$(date -u +%F)" "$t" "$seconds" "${runs:-?}" "$inputs" "$crashes" >> "$results"
  (cd fuzz && cargo +nightly fuzz cmin "${target_dir[@]}" "$t" "../fuzz/corpus/$t" -- -detect_leaks=0) \
    > "fuzz/work/$t.cmin.log" 2>&1
  trim "$t"
}

# Keeps the largest input of target $1's minimised corpus up to 256 KB (a
# whole plan, save or manifest, for edits to start from) and then its
# smallest, up to 512 KB in all, so the repo holds no whole plans or
# checkpoints by the hundred: small inputs are the ones random edits (the
# timed run in CI) reach most from.
trim() {
  local total=0 size f whole
  whole=$(find "fuzz/corpus/$1" -type f -size -262145c -printf '%s %p\n' | sort -n | tail -1)
  [ -z "$whole" ] || total=${whole%% *}
  while read -r size f; do
    [ "$size $f" != "$whole" ] || continue
    total=$((total + size))
    [ "$total" -le 524288 ] || rm "$f"
  done < <(find "fuzz/corpus/$1" -type f -printf '%s %p\n' | sort -n -k1,1 -k2,2)
}

# The structured targets need no seeds from zeroplan runs.
classic=()
for t in "${targets[@]}"; do
  case "$t" in
    plan_mutation|plan_mutation_ranks|checkpoint_mutation)
      run "$t" ;;
    *) classic+=("$t") ;;
  esac
done
[ ${#classic[@]} -gt 0 ] || exit 0
targets=("${classic[@]}")

cargo build --release --quiet
bin="${CARGO_TARGET_DIR:-target}/release/zeroplan"
work=fuzz/work
mkdir -p "$work"
corpus() { mkdir -p "fuzz/corpus/$1" && echo "fuzz/corpus/$1"; }

cp models/*.ron models/tiny/*.ron "$(corpus spec)/"
cat > "$(corpus hf_config)/bert.json" <<'JSON'
{"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 64, "hidden_size": 16,
 "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 32, "max_position_embeddings": 32,
 "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12}
JSON
[ -f fixtures/minilm-l6/config.json ] && cp fixtures/minilm-l6/config.json "$(corpus hf_config)/minilm.json"
"$bin" compile models/tiny/tiny-bert.ron --gpu h100-80gb-sxm --seq 16 --global-batch 4 \
  -o "$(corpus plan)/tiny-bert.ron" > /dev/null
"$bin" train models/tiny/tiny-bert.ron --steps 0 --save "$(corpus safetensors)/tiny-bert.safetensors" > /dev/null
# The checkpoint target's seed is kept in its corpus: the manifest of the
# save its shards come from (zeroplan_untrusted::targets::checkpoint_manifest).

for t in "${targets[@]}"; do
  run "$t"
done
