//! What the end-to-end tests share: running the `zeroplan` binary from the
//! repository's root, and its failures checked to be messages, not panics.

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn zeroplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeroplan")).args(args).current_dir(root()).output().expect("the binary runs")
}

/// The standard error of a run that must fail, with a message and no panic.
pub fn failure(args: &[&str]) -> String {
    let out = zeroplan(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}
