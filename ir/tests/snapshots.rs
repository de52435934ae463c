//! Snapshots of the text IR of a tiny spec of each family.

mod common;

use common::load_model;
use zeroplan_ir::build::{BuildOptions, forward};

fn text_of(file: &str) -> String {
    forward(&load_model(file), &BuildOptions::default()).unwrap_or_else(|e| panic!("{e}")).to_text()
}

#[test]
fn tiny_bert() {
    insta::assert_snapshot!(text_of("tiny/tiny-bert.ron"));
}

#[test]
fn tiny_mosaicbert() {
    insta::assert_snapshot!(text_of("tiny/tiny-mosaicbert.ron"));
}

#[test]
fn tiny_albert() {
    insta::assert_snapshot!(text_of("tiny/tiny-albert.ron"));
}

#[test]
fn tiny_megatron_bert() {
    insta::assert_snapshot!(text_of("tiny/tiny-megatron-bert.ron"));
}

#[test]
fn tiny_ssn_bert() {
    insta::assert_snapshot!(text_of("tiny/tiny-ssn-bert.ron"));
}

#[test]
fn tiny_bert_sts_regression() {
    insta::assert_snapshot!(text_of("tiny/tiny-bert-sts.ron"));
}
