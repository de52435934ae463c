//! Sentence embeddings on the host runtime against the reference interpreter,
//! on a tiny BERT written to a temporary model directory as Hugging Face
//! lays one out (config.json, model.safetensors, tokenizer.json), so no
//! binary fixture is committed: within 1e-5 relative, at several shapes, and
//! again after the program cache has evicted and recompiled a shape.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use zeroplan_driver::embed::{Backend, EmbedError, Embedder, Embeddings};
use zeroplan_ir::DType;
use zeroplan_ir::Tensor;
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::interp::{Interpreter, Rounding};
use zeroplan_ir::spec::{self, Head};
use zeroplan_runtime::checkpoint;

const VOCAB: [&str; 24] = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "is", "eating", "food", "piece", "of", "bread", "the",
    "stock", "market", "fell", "sharp", "##ly", "today", ".", "dog", "runs", "##s",
];

/// Texts of different lengths (so the batch pads), and an unknown word.
const TEXTS: [&str; 4] = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market fell sharply today.",
    "Dogs run, zebras fly.",
];

/// A fresh directory under the temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("zeroplan-embed-test-{}-{n}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A two-layer BERT with random weights, large enough that attention is far
/// from uniform and every bias and LayerNorm is nonzero.
fn tiny_model(dir: &Path) {
    let config = serde_json::json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 32,
        "type_vocab_size": 2,
        "vocab_size": VOCAB.len(),
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    });
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, serde_json::to_string_pretty(&config).unwrap()).unwrap();

    let mut model = spec::load(&config_path).unwrap_or_else(|e| panic!("{e}"));
    model.head = Head::Pooler;
    let graph = forward(&model, &BuildOptions::new(DType::F32)).unwrap();
    let mut weights = Interpreter::new(Rounding::Native, 7).init_state(&graph).unwrap();
    for (k, tensor) in weights.values_mut().enumerate() {
        let values = tensor.floats().unwrap();
        let perturbed = values.iter().enumerate().map(|(i, v)| 5.0 * v + 0.1 * (1.7 * i as f64 + k as f64).sin());
        *tensor = Tensor::float(tensor.shape().to_vec(), tensor.dtype(), perturbed.collect()).unwrap();
    }
    checkpoint::save_weights(&dir.join("model.safetensors"), &model, &graph, &weights).unwrap();

    let vocab: [(String, u32); VOCAB.len()] = std::array::from_fn(|i| (VOCAB[i].to_string(), i as u32));
    let wordpiece = WordPiece::builder().vocab(vocab).unk_token("[UNK]".into()).build().unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(wordpiece);
    tokenizer
        .with_normalizer(Some(BertNormalizer::default()))
        .with_pre_tokenizer(Some(BertPreTokenizer))
        .with_post_processor(Some(BertProcessing::new(("[SEP]".into(), 3), ("[CLS]".into(), 2))));
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
}

/// `‖a − b‖ / ‖b‖` over all embeddings (unit vectors, so `‖b‖` is not small).
fn relative(a: &Embeddings, b: &Embeddings) -> f64 {
    assert_eq!((a.dim, a.embeddings.len()), (b.dim, b.embeddings.len()));
    let pairs = a.embeddings.iter().flatten().zip(b.embeddings.iter().flatten());
    let diff: f64 = pairs.map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = b.embeddings.iter().flatten().map(|y| y * y).sum::<f64>().sqrt();
    diff / norm
}

#[test]
fn host_embeddings_equal_the_reference_interpreter() {
    let dir = temp_dir("tiny");
    tiny_model(&dir);
    let mut host = Embedder::load(&dir, Backend::Cpu).unwrap();
    let mut reference = Embedder::load(&dir, Backend::Reference).unwrap();
    assert_eq!(host.backend(), Backend::Cpu);
    let tokens = host.tokenize(&TEXTS).unwrap();
    assert!(tokens[3].ids.contains(&1), "the unknown word is [UNK]: {:?}", tokens[3].ids);

    // The whole batch (padded), each text alone (more shapes than the cache
    // keeps), then the whole batch again (compiled anew after its eviction).
    let mut calls: Vec<Vec<&str>> = vec![TEXTS.to_vec()];
    calls.extend(TEXTS.iter().map(|t| vec![*t]));
    calls.push(vec![TEXTS[0], TEXTS[1]]);
    calls.push(TEXTS.to_vec());
    for texts in &calls {
        let ours = host.embed(texts).unwrap();
        let exact = reference.embed(texts).unwrap();
        let r = relative(&ours, &exact);
        assert!(r <= 1e-5, "{texts:?}: host differs from the reference by {r:.3e} relative");
        for (a, b) in ours.similarity.iter().flatten().zip(exact.similarity.iter().flatten()) {
            assert!((a - b).abs() <= 1e-5, "{texts:?}: similarity {a} against {b}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_broken_tokenizer_is_named_with_its_fix() {
    let dir = temp_dir("bad-tokenizer");
    tiny_model(&dir);
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = Embedder::load(&dir, Backend::Cpu).err().expect("an error");
    assert!(matches!(err, EmbedError::File { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("tokenizer.json") && message.contains("not a usable tokenizer.json"), "{message}");
    let _ = std::fs::remove_dir_all(&dir);
}
