//! The figure of docs/benchmarks.md: rows per second (log scale) of every system in
//! each order, as grouped bars of the medians. Text is drawn with ab_glyph from a TTF
//! file (DejaVu Sans from Debian's fonts-dejavu-core unless `--font` says otherwise).

use std::path::PathBuf;

use clap::Args;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use serde::Deserialize;

#[derive(Args)]
pub struct PlotArgs {
    /// The summary written by bench/run.py.
    #[arg(long)]
    summary: PathBuf,
    #[arg(long)]
    out: PathBuf,
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
}

#[derive(Deserialize)]
struct Summary {
    title: String,
    orders: Vec<String>,
    systems: Vec<String>,
    /// rows_per_s[system][order], median; null where not run.
    rows_per_s: Vec<Vec<Option<f64>>>,
}

const COLORS: [RGBColor; 10] = [
    RGBColor(60, 60, 60),
    RGBColor(31, 119, 180),
    RGBColor(120, 180, 230),
    RGBColor(44, 160, 44),
    RGBColor(150, 220, 140),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];

pub fn run(args: PlotArgs) -> Result<(), String> {
    let font = std::fs::read(&args.font).map_err(|e| {
        format!(
            "{}: {e} (install fonts-dejavu-core or pass --font)",
            args.font.display()
        )
    })?;
    register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| "the font file is not a usable TTF".to_string())?;
    let summary: Summary =
        serde_json::from_str(&std::fs::read_to_string(&args.summary).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    draw(&summary, &args.out).map_err(|e| e.to_string())
}

fn draw(s: &Summary, out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(out, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let values: Vec<f64> = s.rows_per_s.iter().flatten().flatten().copied().collect();
    let max = values.iter().copied().fold(1.0, f64::max) * 2.0;
    let min = values.iter().copied().fold(max, f64::min).max(1.0) / 2.0;
    let groups = s.orders.len();
    let bars = s.systems.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(&s.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..groups as f64, (min..max).log_scale())?;
    let orders = s.orders.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 && i < orders.len() {
                orders[i].clone()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("order")
        .y_desc("rows per second (median, log scale)")
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 14))
        .draw()?;
    let width = 0.8 / bars as f64;
    for (b, system) in s.systems.iter().enumerate() {
        let color = COLORS[b % COLORS.len()];
        let rects: Vec<_> = (0..groups)
            .filter_map(|g| {
                let v = s.rows_per_s[b][g]?;
                let x0 = g as f64 + 0.1 + b as f64 * width;
                Some(Rectangle::new(
                    [(x0, min), (x0 + width * 0.9, v)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(system.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
