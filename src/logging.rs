//! What the work says as it goes, on standard error: `-v` logs (the
//! `tracing` spans the passes, the planner's search and training steps
//! open, each with its time when it closes) and the planner's progress bar,
//! which counts the search's `plan.choice` spans. Neither is installed for
//! `--json` runs' bar or off a terminal, so tests and pipes see nothing new.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use tracing::span::{Attributes, Id};
use tracing::{Subscriber, field::Field, level_filters::LevelFilter};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the `-v` log (info; debug from `-vv`) and, on a terminal
/// without `--json` or `-v`, the search's progress bar.
pub fn init(verbose: u8, json: bool) {
    let log = (verbose > 0).then(|| {
        let level = if verbose == 1 { LevelFilter::INFO } else { LevelFilter::DEBUG };
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_target(false)
            .with_span_events(FmtSpan::CLOSE)
            .with_filter(level)
    });
    let bar = (verbose == 0 && !json && std::io::stderr().is_terminal()).then(SearchProgress::default);
    if log.is_some() || bar.is_some() {
        tracing_subscriber::registry().with(log).with(bar).init();
    }
}

/// A bar over the strategies of each `plan.search` span (its `choices`
/// field), advanced as each `plan.choice` span closes.
#[derive(Default)]
struct SearchProgress {
    bar: Mutex<Option<ProgressBar>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SearchProgress {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() != "plan.search" {
            return;
        }
        let mut choices = Choices(0);
        attrs.record(&mut choices);
        let bar = ProgressBar::new(choices.0);
        let style = ProgressStyle::with_template("planning {bar:30} {pos}/{len} strategies  [{elapsed}]");
        bar.set_style(style.expect("a valid template"));
        *self.bar.lock().expect("the bar's lock") = Some(bar);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let mut bar = self.bar.lock().expect("the bar's lock");
        match (span.name(), bar.as_ref()) {
            ("plan.choice", Some(b)) => b.inc(1),
            ("plan.search", Some(b)) => {
                b.finish_and_clear();
                *bar = None;
            }
            _ => {}
        }
    }
}

/// Reads a span's `choices` field.
struct Choices(u64);

impl tracing::field::Visit for Choices {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "choices" {
            self.0 = value;
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}
