//! Checkpoints and batch files: the real all-MiniLM-L6-v2 checkpoint, and
//! tiny checkpoints written here in each family's Hugging Face layout.

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use zeroplan_ir::build::{BuildOptions, forward};
use zeroplan_ir::spec::{Head, ModelSpec};
use zeroplan_ir::{DType, Graph, Tensor};
use zeroplan_runtime::checkpoint::{CheckpointError, Weights, load_batch, load_weights, save_batch, save_weights};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the runtime crate sits in the workspace").to_path_buf()
}

fn spec(file: &str) -> ModelSpec {
    zeroplan_ir::spec::load(&root().join("models").join(file)).expect("the spec loads")
}

fn graph(spec: &ModelSpec, dtype: DType) -> Graph {
    forward(spec, &BuildOptions::new(dtype)).expect("the graph builds")
}

/// Every parameter of `graph` at `value`.
fn filled(graph: &Graph, value: f64) -> Weights {
    graph
        .params()
        .into_iter()
        .map(|n| {
            let node = graph.node(n);
            let ty = &node.outputs[0];
            let shape = ty.shape.0.iter().map(|d| d.as_constant().unwrap() as usize).collect();
            (node.name.to_string(), Tensor::full(shape, ty.dtype, value))
        })
        .collect()
}

/// Distinct values for every parameter, derived from its name.
fn distinct(graph: &Graph) -> Weights {
    filled(graph, 0.0)
        .into_iter()
        .map(|(name, t)| {
            let values = (0..t.numel()).map(|i| value_of(&name, i) as f64).collect();
            (name, Tensor::float(t.shape().to_vec(), t.dtype(), values).unwrap())
        })
        .collect()
}

/// A unique path under the temporary directory.
fn temp(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("zeroplan-checkpoint-test-{}-{n}-{name}", std::process::id()))
}

/// A deterministic value for element `i` of the tensor named `name`.
fn value_of(name: &str, i: usize) -> f32 {
    let h = name.bytes().fold(17u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    ((h.wrapping_add(i as u64 * 7919)) % 2001) as f32 / 1000.0 - 1.0
}

/// A tensor to write with the safetensors crate: name, shape, dtype.
struct Spec {
    name: String,
    shape: Vec<usize>,
    dtype: Dtype,
}

fn t(name: impl Into<String>, shape: &[usize]) -> Spec {
    Spec { name: name.into(), shape: shape.to_vec(), dtype: Dtype::F32 }
}

/// Writes the tensors with the safetensors crate, each element `value_of(name, i)`.
fn write_checkpoint(path: &Path, tensors: &[Spec]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|s| {
            let n: usize = s.shape.iter().product();
            let values = (0..n).map(|i| value_of(&s.name, i));
            match s.dtype {
                Dtype::F32 => values.flat_map(f32::to_le_bytes).collect(),
                Dtype::F16 => values.flat_map(|v| half::f16::from_f32(v).to_le_bytes()).collect(),
                Dtype::BF16 => values.flat_map(|v| half::bf16::from_f32(v).to_le_bytes()).collect(),
                Dtype::F64 => values.flat_map(|v| (v as f64).to_le_bytes()).collect(),
                Dtype::I64 => (0..n as i64).flat_map(i64::to_le_bytes).collect(),
                other => panic!("no test data for {other:?}"),
            }
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(s, b)| (s.name.clone(), TensorView::new(s.dtype, s.shape.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// tiny-bert's tensors as `BertForMaskedLM` saves them (hidden 32, 2 layers,
/// intermediate 64, vocab 64, 16 positions), written out by hand.
fn bert_mlm_tensors() -> Vec<Spec> {
    let (h, i, v, p) = (32, 64, 64, 16);
    let mut ts = vec![
        t("bert.embeddings.word_embeddings.weight", &[v, h]),
        t("bert.embeddings.position_embeddings.weight", &[p, h]),
        t("bert.embeddings.token_type_embeddings.weight", &[2, h]),
        t("bert.embeddings.LayerNorm.weight", &[h]),
        t("bert.embeddings.LayerNorm.bias", &[h]),
        Spec { name: "bert.embeddings.position_ids".into(), shape: vec![1, p], dtype: Dtype::I64 },
    ];
    for l in 0..2 {
        let e = format!("bert.encoder.layer.{l}");
        for m in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"] {
            ts.push(t(format!("{e}.{m}.weight"), &[h, h]));
            ts.push(t(format!("{e}.{m}.bias"), &[h]));
        }
        for m in ["attention.output.LayerNorm", "output.LayerNorm"] {
            ts.push(t(format!("{e}.{m}.weight"), &[h]));
            ts.push(t(format!("{e}.{m}.bias"), &[h]));
        }
        ts.push(t(format!("{e}.intermediate.dense.weight"), &[i, h]));
        ts.push(t(format!("{e}.intermediate.dense.bias"), &[i]));
        ts.push(t(format!("{e}.output.dense.weight"), &[h, i]));
        ts.push(t(format!("{e}.output.dense.bias"), &[h]));
    }
    ts.extend([
        t("cls.predictions.transform.dense.weight", &[h, h]),
        t("cls.predictions.transform.dense.bias", &[h]),
        t("cls.predictions.transform.LayerNorm.weight", &[h]),
        t("cls.predictions.transform.LayerNorm.bias", &[h]),
        t("cls.predictions.bias", &[v]),
        t("cls.predictions.decoder.weight", &[v, h]),
        t("cls.predictions.decoder.bias", &[v]),
    ]);
    ts
}

/// Asserts that each of our parameters holds the values written under the
/// Hugging Face name it is paired with.
fn assert_pairs(weights: &Weights, pairs: &[(&str, &str)]) {
    for (ours, hf) in pairs {
        let got = weights[*ours].floats().unwrap();
        let want: Vec<f64> = (0..got.len()).map(|i| value_of(hf, i) as f64).collect();
        assert_eq!(got, want.as_slice(), "`{ours}` should hold `{hf}`");
    }
}

fn file_names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let mut names: Vec<String> =
        SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(String::from).collect();
    names.sort();
    names
}

fn message(result: Result<impl std::fmt::Debug, CheckpointError>) -> String {
    let e = result.expect_err("loading should fail");
    e.to_string()
}

// --- the real checkpoint -------------------------------------------------

fn minilm() -> Option<PathBuf> {
    let path = root().join("fixtures/minilm-l6/model.safetensors");
    if path.exists() {
        Some(path)
    } else {
        println!("SKIPPED: {} is absent; run scripts/fetch-minilm.sh", path.display());
        None
    }
}

/// Element `index` of tensor `name`, read from the file's bytes by hand.
fn raw_f32(path: &Path, name: &str, index: usize) -> f32 {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[name]["dtype"], "F32");
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let at = 8 + n + start + 4 * index;
    f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn minilm_loads_whole_saves_and_reloads() {
    let Some(path) = minilm() else { return };
    let mut spec = spec("minilm-l6.ron");
    spec.head = Head::Pooler;
    let g = graph(&spec, DType::F32);
    let mut weights = filled(&g, 0.0);
    let report = load_weights(&path, &spec, &g, &mut weights).unwrap();
    assert_eq!(report.loaded.len(), g.params().len());
    assert!(report.initialised.is_empty(), "{:?}", report.initialised);
    assert_eq!(report.ignored, ["embeddings.position_ids"]);

    let word = &weights["embeddings.word.weight"];
    assert_eq!(word.shape(), [30522, 384]);
    let raw = raw_f32(&path, "embeddings.word_embeddings.weight", 384 + 2);
    assert_eq!(word.floats().unwrap()[384 + 2], raw as f64);
    assert_ne!(raw, 0.0);

    let saved = temp("minilm.safetensors");
    save_weights(&saved, &spec, &g, &weights).unwrap();
    let names = file_names(&saved);
    assert!(names.contains(&"encoder.layer.5.output.LayerNorm.weight".to_string()));
    assert!(names.contains(&"pooler.dense.weight".to_string()));
    assert_eq!(names.len(), g.params().len());
    let mut reloaded = filled(&g, 0.0);
    let report = load_weights(&saved, &spec, &g, &mut reloaded).unwrap();
    assert!(report.ignored.is_empty() && report.initialised.is_empty());
    assert_eq!(reloaded, weights);
    std::fs::remove_file(&saved).unwrap();

    // Into the MLM graph: the head starts from its initial values, the pooler is skipped.
    let mut spec = spec.clone();
    spec.head = Head::Mlm;
    let g = graph(&spec, DType::F32);
    let mut mlm_weights = filled(&g, 0.5);
    let report = load_weights(&path, &spec, &g, &mut mlm_weights).unwrap();
    assert_eq!(
        report.initialised,
        ["mlm.transform.weight", "mlm.transform.bias", "mlm.norm.gamma", "mlm.norm.beta", "mlm.decoder.bias"]
    );
    assert_eq!(report.ignored, ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]);
    assert_eq!(mlm_weights["mlm.decoder.bias"].floats().unwrap()[0], 0.5);
    assert_eq!(mlm_weights["layer3.ffn.up.weight"], weights["layer3.ffn.up.weight"]);
}

// --- each family's layout ------------------------------------------------

#[test]
fn bert_for_masked_lm_names_load() {
    let spec = spec("tiny/tiny-bert.ron");
    let g = graph(&spec, DType::F32);
    let path = temp("bert-mlm.safetensors");
    write_checkpoint(&path, &bert_mlm_tensors());
    let mut weights = filled(&g, 0.0);
    let report = load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(report.loaded.len(), g.params().len());
    assert!(report.initialised.is_empty());
    assert_eq!(
        report.ignored,
        ["bert.embeddings.position_ids", "cls.predictions.decoder.bias", "cls.predictions.decoder.weight"]
    );
    assert_pairs(
        &weights,
        &[
            ("embeddings.word.weight", "bert.embeddings.word_embeddings.weight"),
            ("embeddings.norm.gamma", "bert.embeddings.LayerNorm.weight"),
            ("layer1.attn.q.weight", "bert.encoder.layer.1.attention.self.query.weight"),
            ("layer1.attn.v.bias", "bert.encoder.layer.1.attention.self.value.bias"),
            ("layer0.attn.out.weight", "bert.encoder.layer.0.attention.output.dense.weight"),
            ("layer0.attn.norm.beta", "bert.encoder.layer.0.attention.output.LayerNorm.bias"),
            ("layer1.ffn.up.weight", "bert.encoder.layer.1.intermediate.dense.weight"),
            ("layer1.ffn.down.weight", "bert.encoder.layer.1.output.dense.weight"),
            ("layer1.ffn.norm.gamma", "bert.encoder.layer.1.output.LayerNorm.weight"),
            ("mlm.transform.weight", "cls.predictions.transform.dense.weight"),
            ("mlm.norm.beta", "cls.predictions.transform.LayerNorm.bias"),
            ("mlm.decoder.bias", "cls.predictions.bias"),
        ],
    );

    // Saved back: the same layout, less what loading skips.
    let saved = temp("bert-mlm-saved.safetensors");
    save_weights(&saved, &spec, &g, &weights).unwrap();
    let mut expected: Vec<String> = bert_mlm_tensors()
        .into_iter()
        .map(|s| s.name)
        .filter(|n| !n.ends_with("position_ids") && !n.starts_with("cls.predictions.decoder"))
        .collect();
    expected.sort();
    assert_eq!(file_names(&saved), expected);
    let bytes = std::fs::read(&saved).unwrap();
    let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(metadata.metadata().as_ref().unwrap()["format"], "pt");
    std::fs::remove_file(&saved).unwrap();
}

#[test]
fn old_layer_norm_names_and_bare_base_names_load() {
    let spec = spec("tiny/tiny-bert.ron");
    let g = graph(&spec, DType::F32);
    let tensors: Vec<Spec> = bert_mlm_tensors()
        .into_iter()
        .filter(|s| !s.name.starts_with("cls.predictions.decoder"))
        .map(|mut s| {
            s.name = s.name.trim_start_matches("bert.").replace("LayerNorm.weight", "LayerNorm.gamma");
            s.name = s.name.replace("LayerNorm.bias", "LayerNorm.beta");
            s
        })
        .collect();
    let path = temp("bert-old.safetensors");
    write_checkpoint(&path, &tensors);
    let mut weights = filled(&g, 0.0);
    let report = load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(report.loaded.len(), g.params().len());
    assert_eq!(report.ignored, ["embeddings.position_ids"]);
    assert_pairs(
        &weights,
        &[
            ("embeddings.norm.gamma", "embeddings.LayerNorm.gamma"),
            ("layer1.ffn.norm.beta", "encoder.layer.1.output.LayerNorm.beta"),
            ("mlm.norm.gamma", "cls.predictions.transform.LayerNorm.gamma"),
        ],
    );
}

#[test]
fn albert_names_load() {
    let spec = spec("tiny/tiny-albert.ron");
    let g = graph(&spec, DType::F32);
    let (h, e, i, v, p) = (32, 16, 64, 64, 16);
    let a = "albert.encoder.albert_layer_groups.0.albert_layers.0";
    let mut tensors = vec![
        t("albert.embeddings.word_embeddings.weight", &[v, e]),
        t("albert.embeddings.position_embeddings.weight", &[p, e]),
        t("albert.embeddings.token_type_embeddings.weight", &[2, e]),
        t("albert.embeddings.LayerNorm.weight", &[e]),
        t("albert.embeddings.LayerNorm.bias", &[e]),
        Spec { name: "albert.embeddings.position_ids".into(), shape: vec![1, p], dtype: Dtype::I64 },
        t("albert.encoder.embedding_hidden_mapping_in.weight", &[h, e]),
        t("albert.encoder.embedding_hidden_mapping_in.bias", &[h]),
        t(format!("{a}.ffn.weight"), &[i, h]),
        t(format!("{a}.ffn.bias"), &[i]),
        t(format!("{a}.ffn_output.weight"), &[h, i]),
        t(format!("{a}.ffn_output.bias"), &[h]),
        t(format!("{a}.full_layer_layer_norm.weight"), &[h]),
        t(format!("{a}.full_layer_layer_norm.bias"), &[h]),
        t(format!("{a}.attention.LayerNorm.weight"), &[h]),
        t(format!("{a}.attention.LayerNorm.bias"), &[h]),
        t("predictions.dense.weight", &[e, h]),
        t("predictions.dense.bias", &[e]),
        t("predictions.LayerNorm.weight", &[e]),
        t("predictions.LayerNorm.bias", &[e]),
        t("predictions.bias", &[v]),
        t("predictions.decoder.weight", &[v, e]),
        t("predictions.decoder.bias", &[v]),
    ];
    for m in ["query", "key", "value", "dense"] {
        tensors.push(t(format!("{a}.attention.{m}.weight"), &[h, h]));
        tensors.push(t(format!("{a}.attention.{m}.bias"), &[h]));
    }
    let path = temp("albert.safetensors");
    write_checkpoint(&path, &tensors);
    let mut weights = filled(&g, 0.0);
    let report = load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(report.loaded.len(), g.params().len());
    assert_eq!(
        report.ignored,
        ["albert.embeddings.position_ids", "predictions.decoder.bias", "predictions.decoder.weight"]
    );
    assert_pairs(
        &weights,
        &[
            ("embeddings.word.weight", "albert.embeddings.word_embeddings.weight"),
            ("embeddings.project.weight", "albert.encoder.embedding_hidden_mapping_in.weight"),
            ("group0.attn.k.weight", &format!("{a}.attention.key.weight")),
            ("group0.attn.out.bias", &format!("{a}.attention.dense.bias")),
            ("group0.attn.norm.gamma", &format!("{a}.attention.LayerNorm.weight")),
            ("group0.ffn.up.weight", &format!("{a}.ffn.weight")),
            ("group0.ffn.down.weight", &format!("{a}.ffn_output.weight")),
            ("group0.ffn.norm.beta", &format!("{a}.full_layer_layer_norm.bias")),
            ("mlm.transform.weight", "predictions.dense.weight"),
            ("mlm.norm.gamma", "predictions.LayerNorm.weight"),
            ("mlm.decoder.bias", "predictions.bias"),
        ],
    );
}

#[test]
fn megatron_names_load() {
    let spec = spec("tiny/tiny-megatron-bert.ron");
    let g = graph(&spec, DType::F32);
    let (h, i, v, p) = (32, 64, 64, 16);
    let mut tensors = vec![
        t("bert.embeddings.word_embeddings.weight", &[v, h]),
        t("bert.embeddings.position_embeddings.weight", &[p, h]),
        t("bert.embeddings.token_type_embeddings.weight", &[2, h]),
        t("bert.encoder.ln.weight", &[h]),
        t("bert.encoder.ln.bias", &[h]),
        t("cls.predictions.transform.dense.weight", &[h, h]),
        t("cls.predictions.transform.dense.bias", &[h]),
        t("cls.predictions.transform.LayerNorm.weight", &[h]),
        t("cls.predictions.transform.LayerNorm.bias", &[h]),
        t("cls.predictions.bias", &[v]),
    ];
    for l in 0..2 {
        let e = format!("bert.encoder.layer.{l}");
        for m in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"] {
            tensors.push(t(format!("{e}.{m}.weight"), &[h, h]));
            tensors.push(t(format!("{e}.{m}.bias"), &[h]));
        }
        for m in ["attention.ln", "ln"] {
            tensors.push(t(format!("{e}.{m}.weight"), &[h]));
            tensors.push(t(format!("{e}.{m}.bias"), &[h]));
        }
        tensors.push(t(format!("{e}.intermediate.dense.weight"), &[i, h]));
        tensors.push(t(format!("{e}.intermediate.dense.bias"), &[i]));
        tensors.push(t(format!("{e}.output.dense.weight"), &[h, i]));
        tensors.push(t(format!("{e}.output.dense.bias"), &[h]));
    }
    let path = temp("megatron.safetensors");
    write_checkpoint(&path, &tensors);
    let mut weights = filled(&g, 0.0);
    let report = load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(report.loaded.len(), g.params().len());
    assert!(report.ignored.is_empty() && report.initialised.is_empty());
    assert_pairs(
        &weights,
        &[
            ("layer1.attn.norm_in.gamma", "bert.encoder.layer.1.attention.ln.weight"),
            ("layer0.ffn.norm_in.beta", "bert.encoder.layer.0.ln.bias"),
            ("encoder.norm.gamma", "bert.encoder.ln.weight"),
            ("layer1.ffn.down.bias", "bert.encoder.layer.1.output.dense.bias"),
            ("mlm.decoder.bias", "cls.predictions.bias"),
        ],
    );
}

#[test]
fn models_without_a_hugging_face_layout_round_trip_under_our_names() {
    for file in ["tiny/tiny-mosaicbert.ron", "tiny/tiny-ssn-bert.ron"] {
        let spec = spec(file);
        let g = graph(&spec, DType::F32);
        let weights = distinct(&g);
        let path = temp("native.safetensors");
        save_weights(&path, &spec, &g, &weights).unwrap();
        let mut ours: Vec<String> = weights.keys().cloned().collect();
        ours.sort();
        assert_eq!(file_names(&path), ours, "{file}");
        let mut reloaded = filled(&g, 0.0);
        let report = load_weights(&path, &spec, &g, &mut reloaded).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(report.loaded.len(), g.params().len());
        assert_eq!(reloaded, weights, "{file}");
    }
}

#[test]
fn a_base_model_loads_into_a_classifier_with_its_head_initialised() {
    let spec = spec("tiny/tiny-bert-sts.ron");
    let g = graph(&spec, DType::F32);
    let path = temp("bert-into-sts.safetensors");
    write_checkpoint(&path, &bert_mlm_tensors());
    let mut weights = filled(&g, 0.25);
    let report = load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        report.initialised,
        ["pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"]
    );
    assert!(report.ignored.iter().any(|n| n == "cls.predictions.transform.dense.weight"));
    assert_eq!(weights["classifier.weight"].floats().unwrap()[0], 0.25);
    assert_pairs(&weights, &[("layer0.attn.k.bias", "bert.encoder.layer.0.attention.self.key.bias")]);
}

#[test]
fn tensors_are_converted_to_the_parameter_dtype() {
    let spec = spec("tiny/tiny-bert.ron");
    // Half-precision and f64 tensors into an f32 graph.
    let g = graph(&spec, DType::F32);
    let tensors: Vec<Spec> = bert_mlm_tensors()
        .into_iter()
        .enumerate()
        .map(|(k, mut s)| {
            if s.dtype == Dtype::F32 {
                s.dtype = [Dtype::F16, Dtype::BF16, Dtype::F64, Dtype::F32][k % 4];
            }
            s
        })
        .collect();
    let word = tensors.iter().find(|s| s.name == "bert.embeddings.word_embeddings.weight").unwrap().dtype;
    assert_eq!(word, Dtype::F16);
    let path = temp("mixed-dtypes.safetensors");
    write_checkpoint(&path, &tensors);
    let mut weights = filled(&g, 0.0);
    load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    let got = weights["embeddings.word.weight"].floats().unwrap()[5];
    assert_eq!(got, half::f16::from_f32(value_of("bert.embeddings.word_embeddings.weight", 5)).to_f64());

    // f32 tensors into a bf16 graph: rounded, and saved as bf16.
    let g = graph(&spec, DType::BF16);
    let path = temp("into-bf16.safetensors");
    write_checkpoint(&path, &bert_mlm_tensors());
    let mut weights = filled(&g, 0.0);
    load_weights(&path, &spec, &g, &mut weights).unwrap();
    std::fs::remove_file(&path).unwrap();
    let q = &weights["layer0.attn.q.weight"];
    assert_eq!(q.dtype(), DType::BF16);
    let want = half::bf16::from_f32(value_of("bert.encoder.layer.0.attention.self.query.weight", 3)).to_f64();
    assert_eq!(q.floats().unwrap()[3], want);
    let saved = temp("bf16.safetensors");
    save_weights(&saved, &spec, &g, &weights).unwrap();
    let bytes = std::fs::read(&saved).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert!(file.iter().all(|(_, v)| v.dtype() == Dtype::BF16));
    let mut reloaded = filled(&g, 0.0);
    load_weights(&saved, &spec, &g, &mut reloaded).unwrap();
    std::fs::remove_file(&saved).unwrap();
    assert_eq!(reloaded, weights);
}

// --- checkpoints that do not fit -----------------------------------------

/// Loads `tensors` into tiny-bert, expecting an error; `weights` must be untouched.
fn tiny_bert_error(tensors: &[Spec]) -> String {
    let spec = spec("tiny/tiny-bert.ron");
    let g = graph(&spec, DType::F32);
    let path = temp("bad.safetensors");
    write_checkpoint(&path, tensors);
    let mut weights = filled(&g, 0.0);
    let error = message(load_weights(&path, &spec, &g, &mut weights));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(weights, filled(&g, 0.0), "a failed load leaves the weights alone");
    assert!(error.contains(&path.display().to_string()), "the error names the file: {error}");
    assert!(error.contains("how to fix"), "{error}");
    error
}

#[test]
fn a_missing_layer_tensor_is_named() {
    let mut tensors = bert_mlm_tensors();
    tensors.retain(|s| s.name != "bert.encoder.layer.1.intermediate.dense.weight");
    let error = tiny_bert_error(&tensors);
    assert!(error.contains("missing (1)"), "{error}");
    assert!(
        error.contains(
            "bert.encoder.layer.1.intermediate.dense.weight: expected [64, 32] (parameter `layer1.ffn.up.weight`)"
        ),
        "{error}"
    );
}

#[test]
fn an_unknown_tensor_is_named() {
    let mut tensors = bert_mlm_tensors();
    tensors.push(t("bert.encoder.layer.2.output.dense.bias", &[32]));
    tensors.push(t("something.else", &[3, 4]));
    let error = tiny_bert_error(&tensors);
    assert!(error.contains("unexpected (2)"), "{error}");
    assert!(error.contains("bert.encoder.layer.2.output.dense.bias: F32 [32]"), "{error}");
    assert!(error.contains("something.else: F32 [3, 4]"), "{error}");
}

#[test]
fn a_wrong_shape_is_named_with_both_shapes() {
    let mut tensors = bert_mlm_tensors();
    tensors.iter_mut().find(|s| s.name == "bert.embeddings.position_embeddings.weight").unwrap().shape = vec![512, 32];
    let error = tiny_bert_error(&tensors);
    assert!(
        error.contains(
            "bert.embeddings.position_embeddings.weight: expected [16, 32], found [512, 32] (parameter `embeddings.position.weight`)"
        ),
        "{error}"
    );
}

#[test]
fn an_integer_weight_is_refused() {
    let mut tensors = bert_mlm_tensors();
    let bias = tensors.iter_mut().find(|s| s.name == "cls.predictions.bias").unwrap();
    bias.dtype = Dtype::I64;
    let error = tiny_bert_error(&tensors);
    assert!(error.contains("cls.predictions.bias: I64 [64]"), "{error}");
}

#[test]
fn truncated_and_corrupt_files_are_errors() {
    let spec = spec("tiny/tiny-bert.ron");
    let g = graph(&spec, DType::F32);
    let good = temp("good.safetensors");
    write_checkpoint(&good, &bert_mlm_tensors());
    let bytes = std::fs::read(&good).unwrap();
    std::fs::remove_file(&good).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let cuts = [0, 3, 8, 8 + header / 2, 8 + header, bytes.len() / 2, bytes.len() - 1];
    let mut garbage = bytes.clone();
    garbage[0] = 0xff;
    garbage[7] = 0x7f;
    let mut broken_json = bytes.clone();
    broken_json[9] = b'}';
    let bad: Vec<Vec<u8>> =
        cuts.iter().map(|&n| bytes[..n].to_vec()).chain([garbage, broken_json, b"not a checkpoint".to_vec()]).collect();
    for (k, contents) in bad.iter().enumerate() {
        let path = temp("broken.safetensors");
        std::fs::write(&path, contents).unwrap();
        let mut weights = filled(&g, 0.0);
        let error = load_weights(&path, &spec, &g, &mut weights).expect_err("a broken file is refused");
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(error, CheckpointError::Corrupt { .. }), "case {k}: {error}");
        assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    }
    let absent = temp("absent.safetensors");
    let error = message(load_weights(&absent, &spec, &g, &mut filled(&g, 0.0)));
    assert!(error.contains("could not read") && error.contains(&absent.display().to_string()), "{error}");
}

#[test]
fn a_file_in_another_layout_does_not_load_into_a_native_model() {
    let spec = spec("tiny/tiny-mosaicbert.ron");
    let g = graph(&spec, DType::F32);
    let path = temp("bert-into-mosaic.safetensors");
    write_checkpoint(&path, &bert_mlm_tensors());
    let error = message(load_weights(&path, &spec, &g, &mut filled(&g, 0.0)));
    std::fs::remove_file(&path).unwrap();
    assert!(error.contains("zeroplan's own parameter names"), "{error}");
    assert!(error.contains("layer0.ffn.gate.weight: expected [64, 32]"), "{error}");
    assert!(error.contains("bert.encoder.layer.0.attention.self.query.weight: F32 [32, 32]"), "{error}");
}

// --- saving --------------------------------------------------------------

#[test]
fn saving_into_a_missing_directory_fails_and_leaves_nothing() {
    let spec = spec("tiny/tiny-bert.ron");
    let g = graph(&spec, DType::F32);
    let dir = temp("no-such-dir");
    let path = dir.join("model.safetensors");
    let error = save_weights(&path, &spec, &g, &distinct(&g)).expect_err("the directory does not exist");
    assert!(matches!(error, CheckpointError::Io { .. }), "{error}");
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    assert!(!dir.exists() && !path.exists());
}

#[test]
fn saving_replaces_a_file_whole_and_leaves_no_temporary() {
    let spec = spec("tiny/tiny-bert.ron");
    let g = graph(&spec, DType::F32);
    let dir = temp("save-dir");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("model.safetensors");
    std::fs::write(&path, b"an older file").unwrap();
    let weights = distinct(&g);
    save_weights(&path, &spec, &g, &weights).unwrap();
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, ["model.safetensors"]);
    let mut reloaded = filled(&g, 0.0);
    load_weights(&path, &spec, &g, &mut reloaded).unwrap();
    assert_eq!(reloaded, weights);

    // Weights that do not fit the graph are refused before anything is written.
    let mut short = weights.clone();
    short.remove("layer0.attn.q.bias");
    short.insert("layer1.ffn.up.bias".into(), Tensor::full(vec![3], DType::F32, 0.0));
    let error = save_weights(&path, &spec, &g, &short).unwrap_err().to_string();
    assert!(error.contains("`layer0.attn.q.bias` has no value"), "{error}");
    assert!(error.contains("`layer1.ffn.up.bias` has shape [3], the graph's is [64]"), "{error}");
    let mut reloaded = filled(&g, 0.0);
    load_weights(&path, &spec, &g, &mut reloaded).unwrap();
    assert_eq!(reloaded, weights);
    std::fs::remove_dir_all(&dir).unwrap();
}

// --- batches -------------------------------------------------------------

#[test]
fn batches_round_trip() {
    let ids: Vec<i64> = (0..12).collect();
    let mut batch = BTreeMap::new();
    batch.insert("input_ids".to_string(), Tensor::int(vec![3, 4], DType::I64, ids.clone()).unwrap());
    batch.insert("token_type_ids".to_string(), Tensor::int(vec![3, 4], DType::I64, vec![0; 12]).unwrap());
    batch.insert("attention_mask".to_string(), Tensor::int(vec![3, 4], DType::I32, vec![1; 12]).unwrap());
    batch.insert("labels".to_string(), Tensor::int(vec![3, 4], DType::I64, vec![-100; 12]).unwrap());
    let path = temp("batch.safetensors");
    save_batch(&path, &batch).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(SafeTensors::deserialize(&bytes).unwrap().tensor("attention_mask").unwrap().dtype(), Dtype::I32);
    let loaded = load_batch(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.len(), 4);
    assert_eq!(loaded["input_ids"], batch["input_ids"]);
    assert_eq!(loaded["labels"], batch["labels"]);
    // I32 is read as i64.
    assert_eq!(loaded["attention_mask"], Tensor::int(vec![3, 4], DType::I64, vec![1; 12]).unwrap());

    // Regression targets are floats.
    let mut sts = BTreeMap::new();
    sts.insert("input_ids".to_string(), Tensor::int(vec![2, 3], DType::I32, vec![1, 2, 3, 4, 5, 6]).unwrap());
    sts.insert("labels".to_string(), Tensor::float(vec![2], DType::F32, vec![0.5, 4.25]).unwrap());
    let path = temp("sts-batch.safetensors");
    save_batch(&path, &sts).unwrap();
    let loaded = load_batch(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded["labels"], sts["labels"]);
    assert_eq!(loaded["input_ids"].dtype(), DType::I64);
    assert_eq!(loaded["input_ids"].ints().unwrap(), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn bad_batches_are_errors() {
    let absent = temp("absent-batch.safetensors");
    let error = message(load_batch(&absent));
    assert!(error.contains("could not read") && error.contains(&absent.display().to_string()), "{error}");

    let corrupt = temp("corrupt-batch.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"input_ids\":").unwrap();
    let error = load_batch(&corrupt).unwrap_err();
    std::fs::remove_file(&corrupt).unwrap();
    assert!(matches!(error, CheckpointError::Corrupt { .. }), "{error}");

    // Written with the safetensors crate: an unknown name, float ids, a mask of the wrong shape.
    let path = temp("odd-batch.safetensors");
    write_checkpoint(
        &path,
        &[
            t("input_ids", &[2, 3]),
            Spec { name: "attention_mask".into(), shape: vec![2, 4], dtype: Dtype::I64 },
            t("pixels", &[1]),
        ],
    );
    let error = message(load_batch(&path));
    std::fs::remove_file(&path).unwrap();
    assert!(error.contains("`pixels` is not a batch tensor"), "{error}");
    assert!(error.contains("`input_ids` is f32; it must be an integer tensor"), "{error}");
    assert!(error.contains("`attention_mask` has shape [2, 4]; `input_ids` has [2, 3]"), "{error}");

    let mut no_ids = BTreeMap::new();
    no_ids.insert("labels".to_string(), Tensor::int(vec![2], DType::I64, vec![0, 1]).unwrap());
    let path = temp("no-ids.safetensors");
    let error = message(save_batch(&path, &no_ids));
    assert!(error.contains("`input_ids` is missing") && !path.exists(), "{error}");
}
