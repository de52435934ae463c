//! Tensor-parallel training steps (Megatron-LM layers, `zeroplan_ir::build`)
//! through the whole pipeline, alone and under ZeRO: what each tensor rank
//! holds and which collectives it runs. Numerical equivalence with one rank
//! is checked where the ranks execute, in the runtime's tests.

// The models/ helpers the ir tests use.
#[path = "../../ir/tests/common/mod.rs"]
mod common;

use common::{closed_form_params, load_model as model, tiny_models};
use zeroplan_ir::plan::{DataParallel, Offload};
use zeroplan_ir::spec::{ModelSpec, Precision, Sharing, TrainingSpec};
use zeroplan_ir::{Graph, Init, Op, Phase};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Resume, Target, compile};

fn step(m: &ModelSpec, t: u64, dp: Option<DataParallel>, train: &TrainingSpec) -> Result<Graph, String> {
    let options = PassOptions { tensor_parallel: Some(t), data_parallel: dp, ..PassOptions::default() };
    compile(m, &Target::Training(train), options).map(|c| c.graph).map_err(|e| e.to_string())
}

fn count(g: &Graph, phase: Phase, op: &str) -> usize {
    g.nodes().filter(|n| n.phase == phase && n.op.name() == op).count()
}

#[test]
fn every_family_splits_over_two_and_four_tensor_ranks() {
    let train = TrainingSpec::default();
    for file in tiny_models() {
        let m = model(&file);
        for t in [2, 4] {
            let g = step(&m, t, None, &train);
            if let Sharing::TemplateBank { .. } = m.sharing {
                let err = g.expect_err("template banks are not split");
                assert!(err.contains("template-bank"), "{file}: {err}");
                continue;
            }
            let g = g.unwrap_or_else(|e| panic!("{file} t={t}: {e}"));
            assert_eq!(g.tensor_parallel(), t, "{file}");
            // Every rank holds 1/t of the split weights and all of the
            // replicated ones: together the whole model, once.
            assert_eq!(g.model_parameter_count(), closed_form_params(&m), "{file} t={t}");
            let layers = m.layers as usize;
            let reduces = count(&g, Phase::Forward, "tensor_all_reduce");
            // Per layer: attention output and feed-forward down (row-parallel).
            // Once: the word embeddings; with the MLM head, the loss statistics.
            let head = usize::from(g.nodes().any(|n| n.op.name() == "cross_entropy_stats"));
            assert_eq!(reduces, 2 * layers + 1 + head, "{file} t={t}: forward tensor all-reduces");
            // The backward's are the adjoints of the column-parallel regions'
            // entries (attention and feed-forward per layer, and the MLM decoder).
            assert_eq!(count(&g, Phase::Backward, "tensor_all_reduce"), 2 * layers + head, "{file} t={t}");
            // The squared global norm is summed over the tensor ranks once.
            assert_eq!(count(&g, Phase::Optimizer, "tensor_all_reduce"), 1, "{file} t={t}");
        }
    }
}

#[test]
fn indivisible_heads_are_refused_with_the_divisors() {
    let m = model("tiny/tiny-bert.ron");
    let err = step(&m, 3, None, &TrainingSpec::default()).unwrap_err();
    assert!(err.contains("4 attention heads do not split evenly"), "{err}");
}

#[test]
fn zero_runs_over_the_data_parallel_ranks_of_each_tensor_rank() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec { precision: Precision::Bf16, ..TrainingSpec::default() };
    for (zero_stage, offload) in [(0, Offload::None), (1, Offload::Optimizer), (2, Offload::None), (3, Offload::None)] {
        let dp = DataParallel { ranks: 2, zero_stage, offload };
        let g = step(&m, 2, Some(dp), &train).unwrap_or_else(|e| panic!("ZeRO-{zero_stage}: {e}"));
        assert_eq!(g.model_parameter_count(), closed_form_params(&m), "ZeRO-{zero_stage}");
        // Tensor shards and replicated parameters never share a flat
        // buffer: they count differently in the global norm.
        for p in g.params() {
            if let Op::Param { init: Init::Flat { members, .. } } = &g.node(p).op {
                let sharded = members.iter().filter(|m| m.init.tensor_shard_ranks().is_some()).count();
                assert!(sharded == 0 || sharded == members.len(), "{} mixes shards and whole", g.node(p).name);
            }
        }
        // Data-parallel collectives span the data ranks, tensor ones the tensor ranks.
        for n in g.nodes() {
            match n.op {
                Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::AllGather { ranks } => {
                    assert_eq!(ranks, 2)
                }
                Op::TensorAllReduce { ranks } => assert_eq!(ranks, 2),
                _ => {}
            }
        }
        assert_eq!(count(&g, Phase::Optimizer, "tensor_all_reduce"), 1, "ZeRO-{zero_stage}");
    }
}

fn sequence_parallel_step(m: &ModelSpec, t: u64, train: &TrainingSpec, options: PassOptions) -> Result<Graph, String> {
    let options = PassOptions { tensor_parallel: Some(t), sequence_parallel: true, ..options };
    compile(m, &Target::Training(train), options).map(|c| c.graph).map_err(|e| e.to_string())
}

fn count_where(g: &Graph, phase: Phase, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes().filter(|n| n.phase == phase && f(&n.op)).count()
}

/// Sequence parallelism (Korthikanti et al., 2022) turns each layer's two
/// `g` all-reduces into reduce-scatters and the two `f`s into all-gathers
/// (each the other's adjoint), the embeddings' all-reduce into a
/// reduce-scatter; the loss statistics stay an all-reduce. The
/// LayerNorm/bias parameters of the sequence-parallel regions get one
/// gradient all-reduce each.
#[test]
fn sequence_parallelism_gathers_and_scatters_where_tensor_parallelism_all_reduces() {
    let train = TrainingSpec::default();
    for file in tiny_models() {
        let m = model(&file);
        if let Sharing::TemplateBank { .. } = m.sharing {
            continue;
        }
        for t in [2, 4] {
            let g = sequence_parallel_step(&m, t, &train, PassOptions::default())
                .unwrap_or_else(|e| panic!("{file} t={t}: {e}"));
            assert_eq!(g.model_parameter_count(), closed_form_params(&m), "{file} t={t}");
            let layers = m.layers as usize;
            let mlm = usize::from(g.nodes().any(|n| n.op.name() == "cross_entropy_stats"));
            let pooler = 1 - mlm;
            let at = |what: &str| format!("{file} t={t}: {what}");
            let scatter = |op: &Op| matches!(op, Op::SequenceReduceScatter { ranks } if *ranks == t);
            let gather = |partial: bool| move |op: &Op| matches!(op, Op::SequenceAllGather { ranks, partial_grad } if *ranks == t && *partial_grad == partial);
            // Forward: g after attention output and feed-forward down, and the word embeddings.
            assert_eq!(count_where(&g, Phase::Forward, scatter), 2 * layers + 1, "{}", at("forward reduce-scatters"));
            // f before attention and feed-forward, and the MLM decoder.
            assert_eq!(count_where(&g, Phase::Forward, gather(true)), 2 * layers + mlm, "{}", at("forward gathers"));
            // The pooler reads the whole sequence, gathered once.
            assert_eq!(count_where(&g, Phase::Forward, gather(false)), pooler, "{}", at("gathers for the pooler"));
            // Its backward needs no gathered value: nothing gathers it again.
            assert_eq!(count_where(&g, Phase::Backward, gather(false)), 0, "{}", at("pooler re-gathers"));
            assert_eq!(count(&g, Phase::Forward, "tensor_all_reduce"), mlm, "{}", at("forward all-reduces"));
            // Backward: the adjoints, pairwise, and each column-parallel
            // GEMM's input gathered again for its weight gradient (`regather`).
            let regathers = 2 * layers + mlm;
            let backward_gathers = count_where(&g, Phase::Backward, gather(true));
            assert_eq!(backward_gathers, 2 * layers + 1 + regathers, "{}", at("backward gathers"));
            let regathered = g.nodes().filter(|n| n.name.ends_with(".sequence_all_gather.regather"));
            assert_eq!(regathered.count(), regathers, "{}", at("re-gathers"));
            assert_eq!(count_where(&g, Phase::Backward, scatter), 2 * layers + mlm, "{}", at("backward scatters"));
            assert_eq!(count(&g, Phase::Backward, "sequence_slice"), pooler, "{}", at("backward slices"));
            // Each sequence-parallel parameter is read through one tensor_copy
            // whose adjoint all-reduces its partial gradient.
            let copies = count(&g, Phase::Forward, "tensor_copy");
            assert_eq!(count(&g, Phase::Backward, "tensor_all_reduce"), copies, "{}", at("partial-gradient sums"));
            for n in g.node_indices() {
                let node = g.node(n);
                if node.phase == Phase::Forward && node.op.name() == "tensor_copy" {
                    let from = g.node(g.operands(n)[0].node);
                    assert!(matches!(from.op, Op::Param { .. }), "{}: {} reads {}", file, node.name, from.name);
                }
                // Every LayerNorm runs on this rank's positions (the MLM
                // head's and the pooler's inputs too).
                if node.phase == Phase::Forward && node.op.name() == "layer_norm" {
                    let x = g.value_type(g.operands(n)[0]);
                    assert_eq!(x.shape.dims()[1].to_string(), format!("seq/{t}"), "{}: {} on {x}", file, node.name);
                }
            }
            // The gradient norm is still summed over the tensor ranks once.
            assert_eq!(count(&g, Phase::Optimizer, "tensor_all_reduce"), 1, "{}", at("norm"));
        }
    }
}

/// For a fixed configuration (tiny BERT, batch 2, sequence 8, 4 tensor
/// ranks, the model's dropout) the memory plan gives every activation of
/// the LayerNorm, dropout and residual regions a quarter of its bytes under
/// sequence parallelism, and a smaller activation peak.
#[test]
fn sequence_parallel_regions_keep_a_tth_of_their_activations() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec::default();
    let t = 4;
    let bindings: zeroplan_ir::Bindings = [("batch".to_string(), 2), ("seq".to_string(), 8)].into();
    // Unfused, so that the regions' nodes keep their names.
    let options = || PassOptions {
        shape_hint: bindings.clone(),
        disabled: ["fuse".to_string()].into(),
        tensor_parallel: Some(t),
        ..PassOptions::default()
    };
    let tp = step_with(&m, &train, options()).unwrap();
    let sp = sequence_parallel_step(&m, t, &train, options()).unwrap();
    let bytes_by_name = |g: &Graph| -> std::collections::BTreeMap<String, u64> {
        let plan = zeroplan_passes::memory::plan(g, &bindings).unwrap();
        plan.intervals
            .iter()
            .filter(|i| g.node(i.value.node).phase == Phase::Forward)
            .map(|i| (g.node(i.value.node).name.to_string(), i.bytes))
            .collect()
    };
    let (whole, sliced) = (bytes_by_name(&tp), bytes_by_name(&sp));
    let region = |name: &str| {
        name.ends_with(".residual")
            || name.ends_with(".norm")
            || name.ends_with("_dropout")
            || name.ends_with("ffn.dropout")
            || name == "embeddings.dropout"
            || name.ends_with("attn.out")
            || name.ends_with("ffn.down")
    };
    let mut total = (0, 0);
    let mut regions = 0;
    for (name, &bytes) in whole.iter().filter(|(n, _)| region(n) && !n.ends_with("probs_dropout")) {
        let sp_bytes = sliced[name];
        assert_eq!(sp_bytes * t, bytes, "{name}: {sp_bytes} B per rank with sequence parallelism, {bytes} B without");
        total = (total.0 + bytes, total.1 + sp_bytes);
        regions += 1;
    }
    // Per layer: attention output, its dropout, residual and norm; the same
    // for the feed-forward block; the embeddings' norm and dropout; the MLM norm.
    assert_eq!(regions, 8 * m.layers as usize + 3, "{:?}", whole.keys().filter(|n| region(n)).collect::<Vec<_>>());
    // 2 × 8 × 32 f32 per tensor: 2048 B whole, 512 B per rank.
    assert_eq!(total, (2048 * regions as u64, 512 * regions as u64));
    let peak = |g: &Graph| {
        let plan = zeroplan_passes::memory::plan(g, &bindings).unwrap();
        plan.at_peak.get(&zeroplan_passes::memory::Category::Activations).copied().unwrap_or(0)
    };
    assert!(
        peak(&sp) < peak(&tp),
        "activation peak {} B with sequence parallelism, {} B without",
        peak(&sp),
        peak(&tp)
    );
}

/// The forward activations of `g`'s memory plan that the backward reads
/// (alive past the forward's last node), by name: the stored activations.
fn stored(g: &Graph, bindings: &zeroplan_ir::Bindings) -> std::collections::BTreeMap<String, (String, u64)> {
    let plan = zeroplan_passes::memory::plan(g, bindings).unwrap();
    let forward_end = plan.order.iter().rposition(|&n| g.node(n).phase == Phase::Forward).unwrap();
    plan.intervals
        .iter()
        .filter(|i| i.end > forward_end && i.alias_of.is_none())
        .filter(|i| i.category == zeroplan_passes::memory::Category::Activations)
        .filter(|i| g.node(i.value.node).phase == Phase::Forward)
        .map(|i| (g.node(i.value.node).name.to_string(), (g.value_type(i.value).to_string(), i.bytes)))
        .collect()
}

/// With sequence parallelism the backward gathers each column-parallel
/// GEMM's input again for its weight gradient (the `regather` pass), as
/// Megatron-LM does: the forward stores the rank's slice, never the whole
/// sequence at the whole width. Tiny BERT (2 layers, hidden 32, MLM head),
/// batch 2, sequence 8, 4 tensor ranks: 5 gathers (Q/K/V and feed-forward
/// up per layer, the MLM decoder), each 2048 B whole and 512 B sliced.
#[test]
fn sequence_parallel_steps_store_the_slices_that_gemms_gather() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec::default();
    let t = 4;
    let bindings: zeroplan_ir::Bindings = [("batch".to_string(), 2), ("seq".to_string(), 8)].into();
    let options = |disabled: &[&str]| PassOptions {
        shape_hint: bindings.clone(),
        disabled: disabled.iter().map(|d| d.to_string()).collect(),
        ..PassOptions::default()
    };
    let on = sequence_parallel_step(&m, t, &train, options(&["fuse"])).unwrap();
    let off = sequence_parallel_step(&m, t, &train, options(&["fuse", "regather"])).unwrap();
    let (stored_on, stored_off) = (stored(&on, &bindings), stored(&off, &bindings));
    let whole = |stored: &std::collections::BTreeMap<String, (String, u64)>| -> Vec<String> {
        stored.iter().filter(|(_, (ty, _))| ty == "f32[batch, seq, 32]").map(|(n, _)| n.clone()).collect()
    };
    let gathers = 2 * m.layers as usize + 1;
    // Without the pass the whole-sequence, whole-width values the backward
    // reads are exactly the gathered GEMM inputs; with it there are none.
    let whole_off = whole(&stored_off);
    assert_eq!(whole_off.len(), gathers, "{whole_off:?}");
    assert!(whole_off.iter().all(|n| n.ends_with(".sequence_all_gather")), "{whole_off:?}");
    assert_eq!(whole(&stored_on), Vec::<String>::new());
    // What each gather reads is stored instead, a t-th of the bytes.
    let mut slices = 0;
    for n in on.node_indices() {
        let node = on.node(n);
        if node.phase == Phase::Forward
            && node.name.ends_with(".sequence_all_gather")
            && &*node.name != "encoder.output.sequence_all_gather"
        {
            let slice: &str = &on.node(on.operands(n)[0].node).name;
            assert_eq!(stored_on.get(slice).map(|(_, b)| *b), Some(2048 / t), "{slice}, read by {}", node.name);
            slices += 1;
        }
    }
    assert_eq!(slices, gathers);
    // The slices not stored without the pass (the embeddings' dropout and
    // the norms read only by the next gather) replace the gathers.
    let total =
        |stored: &std::collections::BTreeMap<String, (String, u64)>| stored.values().map(|(_, b)| b).sum::<u64>();
    assert_eq!(total(&stored_off) - total(&stored_on), gathers as u64 * (2048 - 512));
    // Each re-gathered input lives from just before its weight gradient to
    // it: one at a time, never across another.
    let plan = zeroplan_passes::memory::plan(&on, &bindings).unwrap();
    let mut lives: Vec<(usize, usize)> = plan
        .intervals
        .iter()
        .filter(|i| on.node(i.value.node).name.ends_with(".regather"))
        .map(|i| (i.start, i.end))
        .collect();
    lives.sort_unstable();
    assert_eq!(lives.len(), gathers);
    assert!(lives.iter().all(|(start, end)| end - start <= 3), "{lives:?}");
    assert!(lives.windows(2).all(|w| w[0].1 < w[1].0), "{lives:?}");
    let peak = |g: &Graph| {
        let plan = zeroplan_passes::memory::plan(g, &bindings).unwrap();
        plan.at_peak.get(&zeroplan_passes::memory::Category::Activations).copied().unwrap_or(0)
    };
    assert!(peak(&on) < peak(&off), "activation peak {} B with re-gathering, {} B without", peak(&on), peak(&off));
}

/// `--disable regather` is the step as the passes before it leave it: the
/// weight gradients read the forward's gathered inputs.
#[test]
fn regather_disabled_leaves_the_recomputed_step_as_it_is() {
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec::default();
    let options = |disabled: &[&str]| PassOptions {
        disabled: disabled.iter().map(|d| d.to_string()).collect(),
        tensor_parallel: Some(4),
        sequence_parallel: true,
        ..PassOptions::default()
    };
    let target = Target::Training(&train);
    let through = |name| {
        zeroplan_passes::pipeline::compile_between(&m, &target, options(&[]), Resume::Build, Some(name)).unwrap().graph
    };
    let off = compile(&m, &target, options(&["regather", "fuse"])).unwrap().graph;
    assert_eq!(off.to_text(), through("recompute").to_text());
    assert_ne!(off.to_text(), through("regather").to_text());
    assert!(!off.to_text().contains(".regather"));
    let read_by_backward = off.node_indices().filter(|&n| {
        let node = off.node(n);
        node.phase == Phase::Forward
            && node.name.ends_with(".sequence_all_gather")
            && off.users(n).iter().any(|&u| off.node(u).phase == Phase::Backward)
    });
    assert_eq!(read_by_backward.count(), 2 * m.layers as usize + 1);
}

/// The `optimal` recomputation policy weighs the bytes the step stores as
/// `regather` leaves them: the gathered GEMM inputs leave (5 × 2048 B: tiny
/// BERT, batch 2, sequence 8, t = 4), the slices the feed-forward and MLM
/// decoder gathers read (the attention norms and the MLM norm, 3 × 512 B)
/// come in; the attention gathers' slices are layer inputs, counted as
/// checkpoints either way.
#[test]
fn optimal_recomputation_weighs_the_stored_slices_not_the_gathered_inputs() {
    use zeroplan_passes::recompute::{optimal, regions::Layers};
    let m = model("tiny/tiny-bert.ron");
    let train = TrainingSpec::default();
    let bindings: zeroplan_ir::Bindings = [("batch".to_string(), 2), ("seq".to_string(), 8)].into();
    let options = PassOptions { tensor_parallel: Some(4), sequence_parallel: true, ..PassOptions::default() };
    let target = Target::Training(&train);
    let before =
        zeroplan_passes::pipeline::compile_between(&m, &target, options, Resume::Build, Some("training-step")).unwrap();
    let g = before.graph;
    let layers = Layers::of(&g, &g.topo_order());
    let stored = |regathered| optimal::costs(&g, &layers, &bindings, regathered).unwrap().stored_without_recompute();
    assert_eq!(stored(false) - stored(true), 5 * 2048 - 3 * 512);
    assert_eq!(optimal::step_costs(&g, &bindings).unwrap().costs.stored_without_recompute(), stored(true));
}

fn step_with(m: &ModelSpec, train: &TrainingSpec, options: PassOptions) -> Result<Graph, String> {
    compile(m, &Target::Training(train), options).map(|c| c.graph).map_err(|e| e.to_string())
}

#[test]
fn a_sequence_the_ranks_do_not_divide_is_refused_by_name() {
    let m = model("tiny/tiny-bert.ron");
    let g = sequence_parallel_step(&m, 4, &TrainingSpec::default(), PassOptions::default()).unwrap();
    let bindings: zeroplan_ir::Bindings = [("batch".to_string(), 2), ("seq".to_string(), 6)].into();
    let err = zeroplan_passes::memory::plan(&g, &bindings).err().expect("refused").to_string();
    assert!(
        err.contains("seq/4") && err.contains("seq = 6") && err.contains("multiple of the tensor-parallel ranks"),
        "{err}"
    );
}

#[test]
fn sequence_parallelism_needs_several_tensor_ranks() {
    let m = model("tiny/tiny-bert.ron");
    let err = sequence_parallel_step(&m, 1, &TrainingSpec::default(), PassOptions::default()).unwrap_err();
    assert!(err.contains("needs more than one"), "{err}");
}
