//! GLUE files in each task's real layout, written by the tests (nothing is
//! downloaded), a separable synthetic task to fill them with, and a tiny BERT
//! model directory to read them with. `driver/tests/glue.rs`,
//! `driver/tests/classify.rs` and the CLI's `tests/finetune.rs` (by path)
//! share this file; `tests/cli.rs` its tokenizer.
//!
//! The layouts are GLUE's as its download script writes them, written out
//! here apart from the task presets, so that the tests check the presets
//! against them: CoLA's train and dev have no header (source, label,
//! original judgement, sentence); MNLI's carry the parses and annotator
//! labels; every test file has a header and its index first.

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::spec::{self, ModelSpec};
use zeroplan_runtime::checkpoint::{self, Weights};

/// The tokenizer's vocabulary: BERT's special tokens, filler words, and one
/// key word per class of the separable task.
pub const WORDS: [&str; 19] = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "big",
    "small", "yes", "no", "maybe",
];
const FILLERS: std::ops::Range<usize> = 5..16;
const KEYS: usize = 16;

/// Which file of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Train,
    Dev,
    Test,
}

/// One row: a sentence, a second one for a pair task, and the label as the
/// task's files write it (ignored in a test file).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub a: String,
    pub b: String,
    pub label: String,
}

/// The header of `task`'s `kind` file (`None`: no header), and the columns
/// holding the first sentence, the second and the label.
fn layout(task: &str, kind: Kind) -> (Option<Vec<&'static str>>, [&'static str; 3]) {
    let mnli_parses = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
    ];
    let (labelled, test, columns): (Vec<&str>, Vec<&str>, _) = match task {
        "cola" => (vec![], vec!["index", "sentence"], ["sentence", "", "label"]),
        "sst2" => (vec!["sentence", "label"], vec!["index", "sentence"], ["sentence", "", "label"]),
        "mrpc" => (
            vec!["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            vec!["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            ["#1 String", "#2 String", "Quality"],
        ),
        "qqp" => (
            vec!["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            vec!["id", "question1", "question2"],
            ["question1", "question2", "is_duplicate"],
        ),
        "stsb" => {
            let test = vec!["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1"];
            let test = [test, vec!["sentence2"]].concat();
            ([test.clone(), vec!["score"]].concat(), test, ["sentence1", "sentence2", "score"])
        }
        "mnli" => {
            let annotators: &[&str] =
                if kind == Kind::Dev { &["label1", "label2", "label3", "label4", "label5"] } else { &["label1"] };
            let labelled = [&mnli_parses[..], annotators, &["gold_label"]].concat();
            (labelled, mnli_parses.to_vec(), ["sentence1", "sentence2", "gold_label"])
        }
        "qnli" => (
            vec!["index", "question", "sentence", "label"],
            vec!["index", "question", "sentence"],
            ["question", "sentence", "label"],
        ),
        "rte" => (
            vec!["index", "sentence1", "sentence2", "label"],
            vec!["index", "sentence1", "sentence2"],
            ["sentence1", "sentence2", "label"],
        ),
        other => panic!("no GLUE layout for `{other}`"),
    };
    match kind {
        Kind::Test => (Some(test), columns),
        _ if labelled.is_empty() => (None, columns),
        _ => (Some(labelled), columns),
    }
}

/// `rows` as `task`'s `kind` file at `path`, every other column filled as
/// GLUE's are (ids, genres, parses, annotator labels).
pub fn write(path: &Path, task: &str, kind: Kind, rows: &[Row]) {
    let (header, [first, second, label]) = layout(task, kind);
    let mut text = String::new();
    if let Some(h) = &header {
        text += &h.join("\t");
        text.push('\n');
    }
    for (i, row) in rows.iter().enumerate() {
        let fields: Vec<String> = match &header {
            // CoLA: source, label, the original judgement (`*` marks unacceptable), sentence.
            None => {
                let star = if row.label == "0" { "*" } else { "" };
                vec!["gj04".into(), row.label.clone(), star.into(), row.a.clone()]
            }
            Some(h) => h
                .iter()
                .map(|&c| match c {
                    _ if c == first => row.a.clone(),
                    _ if c == second => row.b.clone(),
                    _ if c == label || c.starts_with("label") => row.label.clone(),
                    "index" | "id" | "old_index" => i.to_string(),
                    "#1 ID" | "#2 ID" | "qid1" | "qid2" | "promptID" | "pairID" => (1000 + 7 * i).to_string(),
                    "genre" => "fiction".into(),
                    "filename" => "2016headlines.tsv".into(),
                    "year" => "2016".into(),
                    _ if c.ends_with("parse") => format!("( ( {} ) )", row.a),
                    _ => "none".into(),
                })
                .collect(),
        };
        text += &fields.join("\t");
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// `n` rows of a separable task: the first sentence holds key word `k` among
/// random fillers, its label is `labels[k]`; the second is fillers only.
pub fn separable(labels: &[&str], n: usize, seed: u64) -> Vec<Row> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut draw = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    (0..n)
        .map(|_| {
            let k = draw(labels.len());
            let len = 3 + draw(4);
            let mut a = fillers(&mut draw, len);
            a.insert(draw(a.len() + 1), WORDS[KEYS + k]);
            let b = fillers(&mut draw, 3);
            Row { a: a.join(" "), b: b.join(" "), label: labels[k].to_string() }
        })
        .collect()
}

fn fillers(draw: &mut impl FnMut(usize) -> usize, len: usize) -> Vec<&'static str> {
    (0..len).map(|_| WORDS[FILLERS.start + draw(FILLERS.len())]).collect()
}

/// A fresh directory under the temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("zeroplan-glue-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A two-layer BERT (width 32, 16 positions) in `dir` as Hugging Face lays
/// it out: `config.json` with `architectures` (`BertModel`, or
/// `BertForSequenceClassification` with `num_labels`), a WordPiece
/// `tokenizer.json` over [`WORDS`], and `model.safetensors` of seeded random
/// weights that `edit` may change first. Returns the spec.
pub fn model_dir(dir: &Path, num_labels: Option<u64>, edit: impl FnOnce(&mut Weights)) -> ModelSpec {
    let mut config = serde_json::json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 16,
        "type_vocab_size": 2,
        "vocab_size": WORDS.len(),
    });
    if let Some(n) = num_labels {
        config["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
        config["num_labels"] = n.into();
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let model = spec::load(&dir.join("config.json")).unwrap_or_else(|e| panic!("{e}"));
    let graph = forward(&model, &BuildOptions::default()).unwrap();
    let mut weights = Interpreter::new(Rounding::Native, 11).init_state(&graph).unwrap();
    edit(&mut weights);
    checkpoint::save_weights(&dir.join("model.safetensors"), &model, &graph, &weights).unwrap();

    write_tokenizer(&dir.join("tokenizer.json"), &WORDS);
    model
}

/// A BERT WordPiece `tokenizer.json` over `words` (BERT's special tokens
/// first), in the format the `tokenizers` library reads.
pub fn write_tokenizer(path: &Path, words: &[&str]) {
    let vocab: serde_json::Map<String, serde_json::Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), i.into())).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    });
    std::fs::write(path, tokenizer.to_string()).unwrap();
}
