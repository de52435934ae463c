//! Why a run stopped at a step whose loss or gradients are not finite: the
//! step is run again with every value checked, and the first value that is
//! not finite is named, with where the run stands (was the step applied,
//! what the last save holds) and what to try.

use zeroplan_ir::interp::Feeds;
use zeroplan_runtime::checkpoint::training::Checkpoint;
use zeroplan_runtime::reference::StepLog;
use zeroplan_runtime::runner::{Device, RunError, Runner};

use super::checkpoints::Saver;

/// Whether training stops after a step: its loss is not finite, or its
/// gradients were not and no loss scaling absorbs that by skipping it.
pub fn diverges(log: &StepLog) -> bool {
    !log.loss.is_finite() || (log.skipped && log.loss_scale.is_none())
}

/// Why training stops at a step whose loss or gradients are not finite
/// (without loss scaling to absorb it): the step run again with every value
/// checked names the first one that is not, and where the run stands.
pub fn diverged<D: Device<Instr: Send> + Send>(
    ranks: &mut [Runner<D>],
    first: usize,
    feeds: &[Vec<Feeds>],
    log: &StepLog,
    saver: Option<&Saver>,
) -> String {
    let what = if log.loss.is_finite() {
        "the gradients are not finite".to_string()
    } else {
        format!("the loss is {}", log.loss)
    };
    let mut message = format!("error: step {}: {what}; stopping.", log.step);
    for host in ranks.iter_mut() {
        host.set_steps_done(log.step - 1);
        host.set_finite_checks(true);
    }
    let results: Vec<_> = std::thread::scope(|s| {
        let running: Vec<_> = ranks.iter_mut().zip(feeds).map(|(h, f)| s.spawn(move || h.step(f).err())).collect();
        running.into_iter().map(|r| r.join().expect("a rank's thread panicked")).collect()
    });
    let first = results.iter().enumerate().find_map(|(rank, e)| match e {
        Some(RunError::NonFinite { node, micro_batch, what }) => Some((first + rank, node, micro_batch, what)),
        _ => None,
    });
    if let Some((rank, node, micro_batch, what)) = first {
        message += &format!(
            "\n  the first value that is not finite: `{node}` ({what}), micro-batch {micro_batch} on rank {rank}"
        );
    }
    if log.skipped {
        message += &format!("\n  the step was not applied: the weights are those after step {}", log.step - 1);
    }
    if let Some(saver) = saver {
        match Checkpoint::open(&saver.dir) {
            Ok(c) => message += &format!("\n  the last save is intact: {} (step {})", c.dir.display(), c.manifest.step),
            Err(_) => message += &format!("\n  nothing was saved in {} yet", saver.dir.display()),
        }
    }
    message + "\n  how to fix: lower --lr (or add warm-up or `max_grad_norm` in the --train spec), or check the data"
}
