use super::*;

fn rec(optimizer: bool) -> PlanStep {
    PlanStep { optimizer, capture: Some(Capture::Recordable { draws_masks: false }), split_before: None }
}

fn drawing(optimizer: bool) -> PlanStep {
    PlanStep { optimizer, capture: Some(Capture::Recordable { draws_masks: true }), split_before: None }
}

fn breaks(why: &str) -> PlanStep {
    PlanStep { optimizer: false, capture: Some(Capture::Breaks(why.into())), split_before: None }
}

fn empty() -> PlanStep {
    PlanStep { optimizer: false, capture: None, split_before: None }
}

/// Each segment's steps as `(start, end)`.
fn ranges(p: &PassPlan) -> Vec<(usize, usize)> {
    p.segments.iter().map(|s| (s.steps.start, s.steps.end)).collect()
}

#[test]
fn a_schedule_of_device_work_is_one_graph_and_empty_steps_break_nothing() {
    let steps = [rec(false), empty(), rec(false), rec(false), rec(true), empty()];
    let p = plan(&steps, 1);
    assert_eq!(ranges(&p.last), [(0, 5)]);
    assert_eq!(p.last.segments[0].launches, 4);
    assert!(p.last.eager.is_empty());
    assert_eq!(p.micro_batch, PassPlan::default(), "one micro-batch: every pass is the last");
    assert_eq!(p.last.starting_at(0).map(|s| s.key), Some(0));
    assert_eq!(p.last.starting_at(1), None);
}

#[test]
fn an_instruction_the_device_cannot_record_splits_the_graph_and_runs_eagerly() {
    let steps = [rec(false), rec(false), breaks("a feed from the host"), rec(false), rec(false)];
    let p = plan(&steps, 1);
    assert_eq!(ranges(&p.last), [(0, 2), (3, 5)]);
    assert_eq!(p.last.eager, [(2, "a feed from the host".to_string())]);
    assert_ne!(p.last.segments[0].key, p.last.segments[1].key);
}

#[test]
fn host_work_between_steps_splits_without_making_either_eager() {
    let mut steps = vec![rec(false), rec(false), rec(false), rec(false)];
    steps[2].split_before = Some("the micro-batch's deferred updates".into());
    let p = plan(&steps, 1);
    assert_eq!(ranges(&p.last), [(0, 2), (2, 4)]);
    assert!(p.last.eager.is_empty());
}

#[test]
fn a_split_before_a_skipped_optimizer_step_still_splits_the_earlier_micro_batches() {
    let mut steps = vec![rec(false), rec(false), rec(true), rec(false), rec(false)];
    steps[2].split_before = Some("a value read back".into());
    let p = plan(&steps, 2);
    assert_eq!(ranges(&p.micro_batch), [(0, 2), (3, 5)]);
    assert_eq!(ranges(&p.last), [(0, 2), (2, 5)]);
}

#[test]
fn a_lone_instruction_is_launched_eagerly_with_what_isolated_it() {
    let steps = [breaks("staged"), rec(false), breaks("staged"), rec(false), rec(false)];
    let p = plan(&steps, 1);
    assert_eq!(ranges(&p.last), [(3, 5)]);
    let (at, why) = &p.last.eager[1];
    assert_eq!(*at, 1);
    assert!(why.contains("alone") && why.contains("staged"), "{why}");
    assert_eq!(p.last.eager.iter().map(|(at, _)| *at).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn earlier_micro_batches_skip_the_optimizer_steps_and_share_graphs_without_them() {
    // Backward, an interleaved update, more backward; then a split and a
    // run of the micro-batch's own steps.
    let mut steps = vec![rec(false), rec(true), rec(false), rec(false), rec(false)];
    steps[3].split_before = Some("a value read back".into());
    let p = plan(&steps, 4);
    assert_eq!(ranges(&p.micro_batch), [(0, 3), (3, 5)]);
    assert_eq!(p.micro_batch.segments[0].launches, 2, "the update is not run before the last micro-batch");
    assert_eq!(ranges(&p.last), [(0, 3), (3, 5)]);
    assert_eq!(p.last.segments[0].launches, 3);
    // The first run differs between passes (the update), the second does not.
    assert_ne!(p.micro_batch.segments[0].key, p.last.segments[0].key);
    assert_eq!(p.micro_batch.segments[1].key, p.last.segments[1].key);
    // Per optimizer step: 3 earlier micro-batches of 4 recorded, the last's 5.
    assert_eq!(p.launches(4), (3 * 4 + 5, 0));
}

#[test]
fn masks_at_two_counter_words_split_a_graph_only_when_the_words_differ() {
    let steps = [drawing(false), rec(false), drawing(true), rec(true)];
    // Several micro-batches: the last one's steps draw at its word, the
    // optimizer's at the step's.
    let p = plan(&steps, 2);
    assert_eq!(ranges(&p.last), [(0, 2), (2, 4)]);
    assert_eq!(p.last.segments[0].masks, Masks::MicroBatch);
    assert_eq!(p.last.segments[1].masks, Masks::Optimizer);
    assert_eq!(ranges(&p.micro_batch), [(0, 2)]);
    // One micro-batch: one word, one graph.
    let p = plan(&steps, 1);
    assert_eq!(ranges(&p.last), [(0, 4)]);
    assert_eq!(p.last.segments[0].masks, Masks::MicroBatch);
    // Steps that draw nothing never split.
    let p = plan(&[rec(false), drawing(true), rec(false)], 2);
    assert_eq!(ranges(&p.last), [(0, 3)]);
    assert_eq!(p.last.segments[0].masks, Masks::Optimizer);
}

#[test]
fn launches_count_eager_instructions_per_micro_batch() {
    let steps = [breaks("staged"), rec(false), rec(false), breaks("collective")];
    let p = plan(&steps, 3);
    assert_eq!(p.launches(3), (2 * 3, 2 * 3));
    let p = plan(&[], 1);
    assert_eq!(p.launches(1), (0, 0));
}

#[test]
fn graph_modes_parse_and_default_to_auto() {
    assert_eq!("on".parse::<GraphMode>(), Ok(GraphMode::On));
    assert_eq!("off".parse::<GraphMode>(), Ok(GraphMode::Off));
    assert_eq!("auto".parse::<GraphMode>(), Ok(GraphMode::Auto));
    assert!("yes".parse::<GraphMode>().unwrap_err().contains("on, off or auto"));
    assert_eq!(GraphMode::default(), GraphMode::Auto);
}
