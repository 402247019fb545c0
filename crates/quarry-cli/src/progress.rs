//! Progress bars on a terminal (indicatif draws nothing when stderr is not one).

use indicatif::{HumanCount, ProgressBar, ProgressState, ProgressStyle};

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
