//! Progress bars on a terminal (indicatif draws nothing when stderr is not one).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar counting rows towards `total` (or a spinner when the total is unknown).
pub fn rows_bar(label: &str, total: Option<u64>) -> ProgressBar {
    let bar = match total {
        Some(total) => ProgressBar::new(total).with_style(
            ProgressStyle::with_template("{msg:>12} [{bar:30}] {human_pos}/{human_len} rows {per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner()
            .with_style(ProgressStyle::with_template("{msg:>12} {spinner} {human_pos} rows {per_sec}").expect("valid template")),
    };
    bar.set_message(label.to_string());
    bar
}
