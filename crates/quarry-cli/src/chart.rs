//! `quarry bench --chart`: the per-query times as a bar chart (PNG or SVG, by the file's
//! extension), beside a peer's times and with their ratios when a peer's JSON is given.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::CliResult;

/// The labels' font, in the binary so that a chart looks the same on every machine (DejaVu Sans
/// Mono; its license is assets/LICENSE-DejaVu.txt).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
const SIZE: (u32, u32) = (1200, 600);
const OURS: RGBColor = RGBColor(31, 119, 180);
const PEER: RGBColor = RGBColor(255, 127, 14);

/// One bar's worth: a query and its time.
pub struct Timed {
    pub name: String,
    pub ms: f64,
}

/// A peer's times (`quarry bench --json` of another system or configuration), by query name.
pub fn read_peer(path: &Path) -> CliResult<HashMap<String, f64>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let queries = json["queries"].as_array().ok_or_else(|| format!("{}: no \"queries\" list (the JSON quarry bench --json writes)", path.display()))?;
    queries
        .iter()
        .map(|q| match (q["name"].as_str(), q["best_ms"].as_f64()) {
            (Some(name), Some(ms)) => Ok((name.to_string(), ms)),
            _ => Err(format!("{}: a query without \"name\" and \"best_ms\": {q}", path.display())),
        })
        .collect()
}

/// Draws `ours` (and `peer`'s times for the same queries, named `peer_name`) into `path`.
pub fn draw(path: &Path, title: &str, ours: &[Timed], peer: Option<(&str, &HashMap<String, f64>)>) -> CliResult {
    static FONT_REGISTERED: Once = Once::new();
    FONT_REGISTERED.call_once(|| {
        // The bytes are the file above: registering cannot fail but for a corrupt build.
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).unwrap_or_else(|_| panic!("the embedded font is a TrueType font"));
    });
    let extension = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let drawn = match extension.as_deref() {
        Some("svg") => draw_on(SVGBackend::new(path, SIZE).into_drawing_area(), title, ours, peer),
        Some("png") => draw_on(BitMapBackend::new(path, SIZE).into_drawing_area(), title, ours, peer),
        _ => return Err(format!("--chart {}: the file must end in .png or .svg", path.display())),
    };
    drawn.map_err(|e| format!("drawing {}: {e}", path.display()))
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    ours: &[Timed],
    peer: Option<(&str, &HashMap<String, f64>)>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(text)?;
    let peer_ms = |name: &str| peer.and_then(|(_, times)| times.get(name).copied());
    let top = ours.iter().map(|t| t.ms.max(peer_ms(&t.name).unwrap_or(0.0))).fold(1.0, f64::max) * 1.15;
    let names: Vec<&str> = ours.iter().map(|t| t.name.as_str()).collect();
    let caption = match peer {
        Some((peer_name, _)) => format!("{title}; labels: Quarry's time / {peer_name}'s"),
        None => title.to_string(),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..ours.len() as f64 - 0.5, 0.0..top).map_err(text)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(ours.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 { names.get(i as usize).map_or(String::new(), |n| n.to_string()) } else { String::new() }
        })
        .y_desc("best time, ms")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(text)?;
    let width = if peer.is_some() { 0.38 } else { 0.7 };
    let ours_x = |i: usize| if peer.is_some() { i as f64 - width / 2.0 } else { i as f64 };
    chart
        .draw_series(ours.iter().enumerate().map(|(i, t)| Rectangle::new([(ours_x(i) - width / 2.0, 0.0), (ours_x(i) + width / 2.0, t.ms)], OURS.filled()))).map_err(text)?
        .label("Quarry")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], OURS.filled()));
    if let Some((peer_name, _)) = peer {
        let bars = ours.iter().enumerate().filter_map(|(i, t)| {
            let ms = peer_ms(&t.name)?;
            Some(Rectangle::new([(i as f64, 0.0), (i as f64 + width, ms)], PEER.filled()))
        });
        chart.draw_series(bars).map_err(text)?.label(peer_name).legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], PEER.filled()));
        // Quarry's time over the peer's, above each pair (the caption says so).
        let ratios = ours.iter().enumerate().filter_map(|(i, t)| {
            let ms = peer_ms(&t.name)?;
            let at = (i as f64 - 0.3, t.ms.max(ms) + top * 0.02);
            Some(Text::new(format!("{:.2}x", t.ms / ms), at, ("sans-serif", 13)))
        });
        chart.draw_series(ratios).map_err(text)?;
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(text)?;
    root.present().map_err(text)?;
    Ok(())
}
