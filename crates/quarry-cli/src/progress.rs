//! Progress bars on a terminal (indicatif draws nothing when stderr is not one): of loads,
//! generators, benchmarks, graph jobs and queries.

use std::io::IsTerminal;
use std::time::Duration;

use arrow::array::RecordBatch;
use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use quarry_engine::{QueryProgress, ResultSink};

/// Rows per second as a whole, grouped count (indicatif's `{per_sec}` prints four decimals).
fn rows_per_sec(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = write!(w, "{}/s", HumanCount(state.per_sec() as u64));
}

/// A bar counting rows towards `total` (or a spinner when the total is unknown).
pub fn rows_bar(label: &str, total: Option<u64>) -> ProgressBar {
    let bar = match total {
        Some(total) => ProgressBar::new(total).with_style(
            ProgressStyle::with_template("{msg:>12} [{bar:30}] {human_pos}/{human_len} rows {rows_per_sec} eta {eta}")
                .expect("valid template")
                .with_key("rows_per_sec", rows_per_sec)
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner()
            .with_style(ProgressStyle::with_template("{msg:>12} {spinner} {human_pos} rows {rows_per_sec}").expect("valid template").with_key("rows_per_sec", rows_per_sec)),
    };
    bar.set_message(label.to_string());
    bar
}

/// A bar counting steps (`unit`, e.g. "runs") towards `total`, labelled with the step at hand.
pub fn steps_bar(label: &str, total: u64, unit: &str) -> ProgressBar {
    let template = format!("{{msg:>12}} [{{bar:30}}] {{pos}}/{{len}} {unit} eta {{eta}}");
    let bar = ProgressBar::new(total).with_style(ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    bar.set_message(label.to_string());
    bar
}

/// How long a query runs before its bar appears: a quick one shows none.
const QUERY_BAR_DELAY: Duration = Duration::from_secs(1);

/// How often a query's bar is redrawn.
const QUERY_BAR_TICK: Duration = Duration::from_millis(100);

/// A query's bar on a terminal: the stored bytes its fragments have read of those it plans to
/// read, rate and ETA. It appears once the query has run for [`QUERY_BAR_DELAY`] and goes
/// before the first rows are printed ([`BarClearingSink`]) or when the bar is dropped.
pub struct QueryBar {
    bar: ProgressBar,
}

impl QueryBar {
    /// A bar for the next query, when standard error is a terminal.
    pub fn on_terminal() -> Option<QueryBar> {
        std::io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template("{msg:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> ");
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden()).with_style(style).with_message("query");
            QueryBar { bar }
        })
    }

    /// Follows `progress` until the bar is cleared (a task that then ends).
    pub fn watch(&self, progress: QueryProgress) {
        let bar = self.bar.clone();
        tokio::spawn(async move {
            tokio::time::sleep(QUERY_BAR_DELAY).await;
            if bar.is_finished() {
                return;
            }
            bar.set_length(progress.total_bytes());
            bar.set_position(progress.bytes_read());
            bar.reset_eta();
            bar.set_draw_target(ProgressDrawTarget::stderr());
            while !bar.is_finished() {
                bar.set_position(progress.bytes_read());
                tokio::time::sleep(QUERY_BAR_TICK).await;
            }
        });
    }

    /// `sink`, which clears the bar before it prints anything.
    pub fn clearing<'a>(&self, sink: Box<dyn ResultSink + 'a>) -> Box<dyn ResultSink + 'a> {
        Box::new(BarClearingSink { sink, bar: self.bar.clone() })
    }
}

impl Drop for QueryBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// A result sink that clears a query's bar before its first output.
struct BarClearingSink<'a> {
    sink: Box<dyn ResultSink + 'a>,
    bar: ProgressBar,
}

impl ResultSink for BarClearingSink<'_> {
    fn write_batch(&mut self, batch: &RecordBatch) -> datafusion::error::Result<()> {
        self.bar.finish_and_clear();
        self.sink.write_batch(batch)
    }

    fn finish(&mut self) -> datafusion::error::Result<()> {
        self.bar.finish_and_clear();
        self.sink.finish()
    }
}
