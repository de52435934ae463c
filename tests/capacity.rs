//! `zeroplan capacity`: the largest size of a family on a cluster, the plan
//! of that size written where `-o` says, and bad pins refused.

mod common;

use common::{failure, zeroplan};

#[test]
fn capacity_names_the_largest_size_and_writes_its_plan() {
    let dir = std::env::temp_dir().join(format!("zeroplan-capacity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan_path = dir.join("largest.ron");
    // Pinned to one choice so that the debug binary plans the ladder quickly.
    let args = [
        "capacity",
        "models/tiny/tiny-bert.ron",
        "--gpus",
        "2",
        "--gpu",
        "a100-40gb",
        "--memory",
        "4GiB",
        "--seq",
        "16",
        "--tp",
        "2",
        "--zero",
        "3",
        "--offload",
        "none",
        "--json",
        "-o",
    ];
    let out = zeroplan(&[&args[..], &[plan_path.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sizes = report["sizes"].as_array().unwrap();
    let largest = report["largest_planned"].as_u64().expect("some size fits 4 GiB");
    let planned = sizes.iter().find(|s| s["params"].as_u64() == Some(largest)).unwrap();
    assert_eq!(planned["full"]["fits"], true);
    assert!(planned["full"]["plan"]["memory"]["peak_bytes"].as_u64().unwrap() <= 4 << 30);
    assert_eq!(planned["full"]["plan"]["strategy"]["tensor_parallel"], 2);
    // The next size up was planned by the bisection and did not fit.
    let next = sizes.iter().find(|s| s["params"].as_u64() > Some(largest) && !s["full"].is_null());
    assert!(next.is_some_and(|s| s["full"]["fits"] == false), "{report:#}");
    // The plan file is the largest size's.
    let text = std::fs::read_to_string(&plan_path).unwrap();
    let plan = zeroplan_ir::plan::Plan::from_ron(&text).unwrap();
    assert_eq!(plan.params, largest);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_tensor_parallel_degree_that_splits_no_size_is_refused() {
    let err = failure(&["capacity", "models/tiny/tiny-bert.ron", "--gpus", "3", "--gpu", "a100-40gb", "--tp", "2"]);
    assert!(err.contains("--tp 2") && err.contains("groups of 2"), "{err}");
}
