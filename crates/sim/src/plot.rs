//! Charts for simulator runs: GPUs, pending pods and cumulative cost over time, one colour per
//! strategy, written as SVG and PNG.
//!
//! Text needs a TrueType font for layout (both formats) and rasterisation (PNG). None is embedded:
//! the first readable font of `$SIM_PLOT_FONT` and a short list of standard DejaVu, Liberation and
//! Noto paths ([`FONT_PATHS`]) is loaded once per process. On Debian/Ubuntu, `fonts-dejavu-core`
//! provides the first one.
//!
//! Long series are downsampled before drawing (per time bucket, the sample with the largest value
//! is kept), so that a line has at most [`MAX_DRAWN_SAMPLES`] samples whatever the run's length.
//! The output depends only on the input (and the font's metrics): the same runs give the same SVG.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::backend::{BitMapBackend, DrawingBackend, SVGBackend};
use plotters::coord::Shift;
use plotters::drawing::{DrawingArea, IntoDrawingArea};
use plotters::element::{DashedPathElement, PathElement, Text};
use plotters::series::{DashedLineSeries, LineSeries};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{
    register_font, Color, FontStyle, IntoFont, RGBColor, ShapeStyle, TextStyle, BLACK, WHITE,
};

/// One sample of a simulator run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesPoint {
    /// Simulated time in seconds.
    pub t_s: f64,
    pub gpus_provisioned: f64,
    pub gpus_requested: f64,
    pub pending_pods: u32,
    /// Cumulative cost in USD since the start of the run.
    pub cost_usd: f64,
}

/// The samples of one strategy's run, in time order (they are sorted if they are not).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSeries {
    pub strategy: String,
    pub points: Vec<SeriesPoint>,
}

/// Width and height in pixels of every chart (the PNG's size, and the SVG's).
pub const PLOT_SIZE: (u32, u32) = (1280, 720);

/// The most samples of one series that are drawn; longer series are downsampled.
pub const MAX_DRAWN_SAMPLES: usize = 2000;

/// Environment variable naming a TrueType/OpenType font to use before [`FONT_PATHS`].
pub const FONT_ENV: &str = "SIM_PLOT_FONT";

/// Fonts tried in order (after `$SIM_PLOT_FONT`) for chart text.
pub const FONT_PATHS: &[&str] = &[
    // Debian/Ubuntu fonts-dejavu-core; Arch; Fedora.
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    // Debian/Ubuntu fonts-liberation2 and fonts-liberation; Arch; Fedora.
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    // Debian/Ubuntu fonts-noto-core; Arch; Fedora.
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/google-noto/NotoSans-Regular.ttf",
];

/// The family name the loaded font is registered under, and that every text style uses.
const FONT_FAMILY: &str = "sans-serif";

/// Time spans longer than this are shown in hours, others in minutes.
const HOURS_THRESHOLD_S: f64 = 3.0 * 3600.0;

/// Line colours, one per strategy in the order of `runs` (cycled past ten).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

const LINE_WIDTH: u32 = 2;
const DASH: u32 = 8;
const DASH_GAP: u32 = 6;
const CAPTION_PX: u32 = 24;
const AXIS_DESC_PX: u32 = 18;
const TICK_LABEL_PX: u32 = 14;
const LEGEND_PX: u32 = 16;
const LEGEND_ROW_H: i32 = 26;
const LEGEND_SWATCH_W: i32 = 34;
const LEGEND_SWATCH_GAP: i32 = 8;
const LEGEND_ENTRY_GAP: i32 = 28;
const MARGIN: i32 = 16;

/// Writes `gpus`, `pending` and `cost` charts, each as `.svg` and `.png`, into `dir` (created if
/// missing) and returns the paths written, in that order.
///
/// - `gpus`: GPUs provisioned (solid) and requested (dashed) over time;
/// - `pending`: pending pods over time;
/// - `cost`: cumulative cost in USD over time.
///
/// One colour per strategy, a legend below each chart, `title` at the start of each caption. The
/// time axis is in hours when the runs span more than 3 h, else in minutes. Errors (no runs, a run
/// without points, a non-finite value, no font, a file that cannot be written) are returned as a
/// message naming the run, the fonts tried or the file.
pub fn write_plots(dir: &Path, title: &str, runs: &[RunSeries]) -> Result<Vec<PathBuf>, String> {
    let runs = prepare_runs(runs)?;
    ensure_font()?;
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("{}: cannot create the plot directory: {e}", dir.display()))?;

    let mut written = Vec::with_capacity(6);
    for chart in build_charts(title, &runs) {
        let svg = dir.join(format!("{}.svg", chart.stem));
        write_svg(&svg, &chart)?;
        written.push(svg);
        let png = dir.join(format!("{}.png", chart.stem));
        write_png(&png, &chart)?;
        written.push(png);
    }
    Ok(written)
}

// ---------------------------------------------------------------------------------------------
// Input checks
// ---------------------------------------------------------------------------------------------

/// A run's samples as plain columns, sorted by time.
struct Prepared<'a> {
    strategy: &'a str,
    t_s: Vec<f64>,
    provisioned: Vec<f64>,
    requested: Vec<f64>,
    pending: Vec<f64>,
    cost: Vec<f64>,
}

fn prepare_runs(runs: &[RunSeries]) -> Result<Vec<Prepared<'_>>, String> {
    if runs.is_empty() {
        return Err("write_plots: no runs to plot (`runs` is empty)".to_string());
    }
    runs.iter().map(prepare_run).collect()
}

fn prepare_run(run: &RunSeries) -> Result<Prepared<'_>, String> {
    if run.points.is_empty() {
        return Err(format!(
            "write_plots: run {:?} has no points to plot",
            run.strategy
        ));
    }
    for (i, p) in run.points.iter().enumerate() {
        let fields = [
            ("t_s", p.t_s),
            ("gpus_provisioned", p.gpus_provisioned),
            ("gpus_requested", p.gpus_requested),
            ("cost_usd", p.cost_usd),
        ];
        if let Some((name, v)) = fields.iter().find(|(_, v)| !v.is_finite()) {
            return Err(format!(
                "write_plots: run {:?}, point {i}: {name} is not a finite number ({v})",
                run.strategy
            ));
        }
    }
    let mut points = run.points.clone();
    if !points.windows(2).all(|w| w[0].t_s <= w[1].t_s) {
        // Stable, so samples at the same time keep their order.
        points.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    }
    Ok(Prepared {
        strategy: &run.strategy,
        t_s: points.iter().map(|p| p.t_s).collect(),
        provisioned: points.iter().map(|p| p.gpus_provisioned).collect(),
        requested: points.iter().map(|p| p.gpus_requested).collect(),
        pending: points.iter().map(|p| f64::from(p.pending_pods)).collect(),
        cost: points.iter().map(|p| p.cost_usd).collect(),
    })
}

// ---------------------------------------------------------------------------------------------
// Fonts
// ---------------------------------------------------------------------------------------------

/// Loads and registers the chart font once per process; later calls return the first outcome.
fn ensure_font() -> Result<(), String> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    LOADED
        .get_or_init(load_font)
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

fn load_font() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = Vec::with_capacity(FONT_PATHS.len() + 1);
    if let Some(p) = std::env::var_os(FONT_ENV).filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    candidates.extend(FONT_PATHS.iter().map(PathBuf::from));

    let mut tried = Vec::with_capacity(candidates.len());
    for path in candidates {
        match std::fs::read(&path) {
            Ok(bytes) => {
                // plotters keeps fonts for the life of the process; this runs at most once per
                // successfully read file, and once per process in the usual case.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font(FONT_FAMILY, FontStyle::Normal, bytes).is_ok() {
                    return Ok(path);
                }
                tried.push(format!("{} (not a TrueType/OpenType font)", path.display()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tried.push(format!("{} (not found)", path.display()));
            }
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "write_plots: no font for chart text; tried {}. Install fonts-dejavu-core \
         (Debian/Ubuntu) or set {FONT_ENV} to a .ttf file",
        tried.join(", ")
    ))
}

// ---------------------------------------------------------------------------------------------
// Chart description (backend independent)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum YFormat {
    Count,
    Usd,
}

struct Line {
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

struct LegendEntry {
    label: String,
    color: RGBColor,
    dashed: bool,
}

struct Chart {
    stem: &'static str,
    caption: String,
    x_desc: &'static str,
    y_desc: &'static str,
    y_format: YFormat,
    x_range: (f64, f64),
    y_range: (f64, f64),
    lines: Vec<Line>,
    legend: Vec<LegendEntry>,
}

/// The time unit for a span of `span_s` seconds: seconds per unit and axis title.
fn time_unit(span_s: f64) -> (f64, &'static str) {
    if span_s > HOURS_THRESHOLD_S {
        (3600.0, "Time (h)")
    } else {
        (60.0, "Time (min)")
    }
}

fn build_charts(title: &str, runs: &[Prepared<'_>]) -> Vec<Chart> {
    let t_min = runs.iter().map(|r| r.t_s[0]).fold(f64::INFINITY, f64::min);
    let t_max = runs
        .iter()
        .map(|r| r.t_s[r.t_s.len() - 1])
        .fold(f64::NEG_INFINITY, f64::max);
    let (unit_s, x_desc) = time_unit(t_max - t_min);
    let x_range = padded_x_range(t_min / unit_s, t_max / unit_s);
    let color = |i: usize| PALETTE[i % PALETTE.len()];
    let caption = |what: &str| {
        let title = title.trim();
        if title.is_empty() {
            what.to_string()
        } else {
            format!("{title} — {what}")
        }
    };
    // Downsampled (x in the axis unit), drawn as steps when `step`.
    let series = |t: &[f64], v: &[f64], step: bool| {
        let pts: Vec<(f64, f64)> = t
            .iter()
            .map(|t| t / unit_s)
            .zip(v.iter().copied())
            .collect();
        let pts = downsample_max(&pts, MAX_DRAWN_SAMPLES);
        if step {
            step_after(&pts)
        } else {
            pts
        }
    };
    let strategy_legend = || -> Vec<LegendEntry> {
        runs.iter()
            .enumerate()
            .map(|(i, r)| LegendEntry {
                label: r.strategy.to_string(),
                color: color(i),
                dashed: false,
            })
            .collect()
    };

    let mut gpu_lines = Vec::with_capacity(runs.len() * 2);
    for (i, r) in runs.iter().enumerate() {
        gpu_lines.push(Line {
            color: color(i),
            dashed: true,
            points: series(&r.t_s, &r.requested, true),
        });
        gpu_lines.push(Line {
            color: color(i),
            dashed: false,
            points: series(&r.t_s, &r.provisioned, true),
        });
    }
    let mut gpu_legend = strategy_legend();
    gpu_legend.push(LegendEntry {
        label: "provisioned".to_string(),
        color: BLACK,
        dashed: false,
    });
    gpu_legend.push(LegendEntry {
        label: "requested".to_string(),
        color: BLACK,
        dashed: true,
    });

    let pending_lines: Vec<Line> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Line {
            color: color(i),
            dashed: false,
            points: series(&r.t_s, &r.pending, true),
        })
        .collect();
    let cost_lines: Vec<Line> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Line {
            color: color(i),
            dashed: false,
            points: series(&r.t_s, &r.cost, false),
        })
        .collect();

    vec![
        Chart {
            stem: "gpus",
            caption: caption("GPUs provisioned (solid) and requested (dashed)"),
            x_desc,
            y_desc: "GPUs",
            y_format: YFormat::Count,
            x_range,
            y_range: y_range_of(&gpu_lines),
            lines: gpu_lines,
            legend: gpu_legend,
        },
        Chart {
            stem: "pending",
            caption: caption("Pending pods"),
            x_desc,
            y_desc: "Pending pods",
            y_format: YFormat::Count,
            x_range,
            y_range: y_range_of(&pending_lines),
            lines: pending_lines,
            legend: strategy_legend(),
        },
        Chart {
            stem: "cost",
            caption: caption("Cumulative cost"),
            x_desc,
            y_desc: "Cumulative cost (USD)",
            y_format: YFormat::Usd,
            x_range,
            y_range: y_range_of(&cost_lines),
            lines: cost_lines,
            legend: strategy_legend(),
        },
    ]
}

fn padded_x_range(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        (lo, lo + 1.0)
    }
}

/// From zero (or below, for negative values) to a little above the largest value.
fn y_range_of(lines: &[Line]) -> (f64, f64) {
    let values = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
    let (lo, hi) = values.fold((0.0_f64, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let span = hi - lo;
    if span > 0.0 {
        (
            if lo < 0.0 { lo - span * 0.05 } else { lo },
            hi + span * 0.08,
        )
    } else {
        (lo, lo + 1.0)
    }
}

/// Keeps at most `max_points` samples of `points` (sorted by x): the x span is cut into
/// `max_points` equal buckets and, in each non-empty one, the first sample with the largest y
/// is kept. Peaks survive, which suits step-like series (GPUs, pending pods) and monotonic ones
/// (cumulative cost, where it is the bucket's last sample). Shorter input is returned as is.
fn downsample_max(points: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let max_points = max_points.max(1);
    if points.len() <= max_points {
        return points.to_vec();
    }
    let x0 = points[0].0;
    let span = points[points.len() - 1].0 - x0;
    let bucket_of = |x: f64| -> usize {
        if span > 0.0 {
            // `as` saturates, and the clamp keeps the last sample in the last bucket.
            (((x - x0) / span * max_points as f64) as usize).min(max_points - 1)
        } else {
            0
        }
    };
    let mut out = Vec::with_capacity(max_points);
    let mut current = bucket_of(points[0].0);
    let mut best = points[0];
    for &p in &points[1..] {
        let b = bucket_of(p.0);
        if b != current {
            out.push(best);
            current = b;
            best = p;
        } else if p.1 > best.1 {
            best = p;
        }
    }
    out.push(best);
    out
}

/// A value holds until the next sample: (x0,y0),(x1,y0),(x1,y1),(x2,y1),...
fn step_after(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &p) in points.iter().enumerate() {
        if i > 0 {
            out.push((p.0, points[i - 1].1));
        }
        out.push(p);
    }
    out
}

/// A tick label: integers without decimals and with thousands separators, others with up to two
/// decimals.
fn format_tick(v: f64, format: YFormat) -> String {
    let v = if v == 0.0 { 0.0 } else { v }; // no "-0"
    let rounded = (v * 100.0).round() / 100.0;
    let body = if rounded.fract() == 0.0 && rounded.abs() < 1e15 {
        group_thousands(rounded.abs() as u64)
    } else {
        let s = format!("{:.2}", rounded.abs());
        let s = s.trim_end_matches('0').trim_end_matches('.');
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        let int = group_thousands(int.parse().unwrap_or(0));
        if frac.is_empty() {
            int
        } else {
            format!("{int}.{frac}")
        }
    };
    let sign = if rounded < 0.0 { "-" } else { "" };
    match format {
        YFormat::Count => format!("{sign}{body}"),
        YFormat::Usd => format!("{sign}${body}"),
    }
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Drawing
// ---------------------------------------------------------------------------------------------

fn write_svg(path: &Path, chart: &Chart) -> Result<(), String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT_SIZE).into_drawing_area();
        draw_chart(&root, chart).map_err(|e| format!("{}: {e}", path.display()))?;
        root.present()
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::write(path, svg).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

fn write_png(path: &Path, chart: &Chart) -> Result<(), String> {
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw_chart(&root, chart).map_err(|e| format!("{}: {e}", path.display()))?;
    root.present()
        .map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

fn text_style(px: u32) -> TextStyle<'static> {
    (FONT_FAMILY, px).into_font().color(&BLACK)
}

fn draw_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<(), String> {
    let err = |e: plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;

    let legend_style = text_style(LEGEND_PX);
    let (width, height) = root.dim_in_pixel();
    let layout = layout_legend(
        root,
        &chart.legend,
        &legend_style,
        width as i32 - 2 * MARGIN,
    )
    .map_err(err)?;
    let rows = layout.iter().map(|l| l.row).max().map_or(0, |r| r + 1);
    let legend_h = rows * LEGEND_ROW_H + MARGIN;
    let (plot_area, legend_area) = root.split_vertically(height as i32 - legend_h);

    let mut ctx = plotters::chart::ChartBuilder::on(&plot_area)
        .caption(&chart.caption, text_style(CAPTION_PX))
        .margin(MARGIN as u32)
        .x_label_area_size(56)
        .y_label_area_size(96)
        .build_cartesian_2d(
            chart.x_range.0..chart.x_range.1,
            chart.y_range.0..chart.y_range.1,
        )
        .map_err(err)?;

    let y_format = chart.y_format;
    let x_fmt = |v: &f64| format_tick(*v, YFormat::Count);
    let y_fmt = move |v: &f64| format_tick(*v, y_format);
    ctx.configure_mesh()
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .axis_desc_style(text_style(AXIS_DESC_PX))
        .label_style(text_style(TICK_LABEL_PX))
        .x_labels(12)
        .y_labels(10)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
        .bold_line_style(RGBColor(0xd8, 0xd8, 0xd8))
        .draw()
        .map_err(err)?;

    for line in &chart.lines {
        let style = ShapeStyle {
            color: line.color.to_rgba(),
            filled: false,
            stroke_width: LINE_WIDTH,
        };
        if line.dashed {
            ctx.draw_series(DashedLineSeries::new(
                line.points.iter().copied(),
                DASH,
                DASH_GAP,
                style,
            ))
            .map_err(err)?;
        } else {
            ctx.draw_series(LineSeries::new(line.points.iter().copied(), style))
                .map_err(err)?;
        }
    }

    draw_legend(&legend_area, &chart.legend, &layout, &legend_style).map_err(err)?;
    Ok(())
}

/// Where a legend entry goes: row, and x of its swatch within the legend area.
struct Placed {
    row: i32,
    x: i32,
}

/// Flows the entries left to right, wrapping within `max_w` pixels; rows are centred later.
fn layout_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
    style: &TextStyle<'_>,
    max_w: i32,
) -> Result<Vec<Placed>, plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>> {
    let mut placed = Vec::with_capacity(entries.len());
    let (mut row, mut x) = (0, 0);
    for e in entries {
        let (text_w, _) = area.estimate_text_size(&e.label, style)?;
        let w = LEGEND_SWATCH_W + LEGEND_SWATCH_GAP + text_w as i32;
        if x > 0 && x + w > max_w {
            row += 1;
            x = 0;
        }
        placed.push(Placed { row, x });
        x += w + LEGEND_ENTRY_GAP;
    }
    Ok(placed)
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
    layout: &[Placed],
    style: &TextStyle<'_>,
) -> Result<(), plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>> {
    let (width, _) = area.dim_in_pixel();
    let label_style = style.pos(Pos::new(HPos::Left, VPos::Center));
    // Centre each row: its width is the end of its last entry.
    let mut row_w: Vec<i32> = Vec::new();
    for (e, p) in entries.iter().zip(layout) {
        let (text_w, _) = area.estimate_text_size(&e.label, style)?;
        let end = p.x + LEGEND_SWATCH_W + LEGEND_SWATCH_GAP + text_w as i32;
        let r = p.row as usize;
        if row_w.len() <= r {
            row_w.resize(r + 1, 0);
        }
        row_w[r] = row_w[r].max(end);
    }
    for (e, p) in entries.iter().zip(layout) {
        let x0 = (width as i32 - row_w[p.row as usize]).max(0) / 2 + p.x;
        let y = p.row * LEGEND_ROW_H + LEGEND_ROW_H / 2;
        let swatch = vec![(x0, y), (x0 + LEGEND_SWATCH_W, y)];
        let line_style = ShapeStyle {
            color: e.color.to_rgba(),
            filled: false,
            stroke_width: LINE_WIDTH + 1,
        };
        if e.dashed {
            area.draw(&DashedPathElement::new(swatch, DASH, DASH_GAP, line_style))?;
        } else {
            area.draw(&PathElement::new(swatch, line_style))?;
        }
        area.draw(&Text::new(
            e.label.clone(),
            (x0 + LEGEND_SWATCH_W + LEGEND_SWATCH_GAP, y),
            label_style.clone(),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("sim_plot_test_{}_{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            TempDir(dir)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A run of `n` samples every `step_s` seconds, with a load that rises and falls.
    fn run(strategy: &str, n: usize, step_s: f64, scale: f64) -> RunSeries {
        let mut cost = 0.0;
        let points = (0..n)
            .map(|i| {
                let t_s = i as f64 * step_s;
                let phase = i as f64 / n as f64 * std::f64::consts::TAU;
                let requested = (8.0 + 6.0 * phase.sin()).round() * scale;
                let provisioned = (requested + 2.0 * scale).round();
                cost += provisioned * 2.5 * step_s / 3600.0;
                SeriesPoint {
                    t_s,
                    gpus_provisioned: provisioned,
                    gpus_requested: requested,
                    pending_pods: ((i * 7) % 11) as u32,
                    cost_usd: cost,
                }
            })
            .collect();
        RunSeries {
            strategy: strategy.to_string(),
            points,
        }
    }

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

    /// Width and height from the IHDR chunk, which must come first.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert!(bytes.len() > 24, "PNG too short");
        assert_eq!(&bytes[..8], &PNG_SIGNATURE, "not a PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    #[test]
    fn sim_plot_writes_six_files_with_names_and_axis_titles() {
        let tmp = TempDir::new("six");
        let dir = tmp.0.join("nested/plots"); // created by write_plots
        let runs = [
            run("reactive", 300, 10.0, 1.0),
            run("predictive-ewma", 300, 10.0, 1.5),
        ];
        let files = write_plots(&dir, "Diurnal load", &runs).expect("write_plots");

        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "gpus.svg",
                "gpus.png",
                "pending.svg",
                "pending.png",
                "cost.svg",
                "cost.png"
            ]
        );
        for f in &files {
            assert!(
                f.starts_with(&dir),
                "{} not in {}",
                f.display(),
                dir.display()
            );
            assert!(f.is_file(), "{} missing", f.display());
        }

        for stem in ["gpus", "pending", "cost"] {
            let png = std::fs::read(dir.join(format!("{stem}.png"))).unwrap();
            assert_eq!(&png[..8], &PNG_SIGNATURE, "{stem}.png signature");
            assert_eq!(png_size(&png), PLOT_SIZE, "{stem}.png size");
        }

        let svg = |stem: &str| std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
        // 300 samples * 10 s = 50 min: minutes.
        for (stem, y_desc) in [
            ("gpus", "GPUs"),
            ("pending", "Pending pods"),
            ("cost", "Cumulative cost (USD)"),
        ] {
            let s = svg(stem);
            assert!(
                s.starts_with("<svg"),
                "{stem}.svg: {}",
                &s[..40.min(s.len())]
            );
            for needle in [
                "reactive",
                "predictive-ewma",
                "Time (min)",
                y_desc,
                "Diurnal load",
            ] {
                assert!(s.contains(needle), "{stem}.svg lacks {needle:?}");
            }
            assert!(!s.contains("Time (h)"), "{stem}.svg");
        }
        let gpus = svg("gpus");
        assert!(gpus.contains("provisioned") && gpus.contains("requested"));
    }

    #[test]
    fn sim_plot_uses_hours_beyond_three_hours() {
        assert_eq!(time_unit(3.0 * 3600.0), (60.0, "Time (min)"));
        assert_eq!(time_unit(3.0 * 3600.0 + 1.0), (3600.0, "Time (h)"));
        assert_eq!(time_unit(0.0), (60.0, "Time (min)"));

        let tmp = TempDir::new("hours");
        // 500 samples * 60 s = 8.3 h.
        write_plots(&tmp.0, "", &[run("reactive", 500, 60.0, 1.0)]).expect("write_plots");
        let s = std::fs::read_to_string(tmp.0.join("pending.svg")).unwrap();
        assert!(s.contains("Time (h)"));
        assert!(!s.contains("Time (min)"));
    }

    #[test]
    fn sim_plot_svg_is_deterministic() {
        let (a, b) = (TempDir::new("det_a"), TempDir::new("det_b"));
        let runs = [
            run("reactive", 400, 15.0, 1.0),
            run("bin-pack", 250, 20.0, 2.0),
        ];
        write_plots(&a.0, "Same", &runs).unwrap();
        write_plots(&b.0, "Same", &runs).unwrap();
        for stem in ["gpus", "pending", "cost"] {
            let read = |d: &Path| std::fs::read(d.join(format!("{stem}.svg"))).unwrap();
            assert!(read(&a.0) == read(&b.0), "{stem}.svg differs between runs");
        }
    }

    #[test]
    fn sim_plot_long_series_are_downsampled() {
        let tmp = TempDir::new("long");
        let runs = [
            run("reactive", 100_000, 1.0, 1.0),
            run("predictive", 100_000, 1.0, 2.0),
        ];
        let started = std::time::Instant::now();
        write_plots(&tmp.0, "Long", &runs).expect("write_plots");
        let elapsed = started.elapsed();
        // Without downsampling each SVG would hold several MB of coordinates.
        for stem in ["gpus", "pending", "cost"] {
            let len = std::fs::metadata(tmp.0.join(format!("{stem}.svg")))
                .unwrap()
                .len();
            assert!(len < 1_500_000, "{stem}.svg is {len} bytes");
        }
        assert!(elapsed.as_secs() < 60, "took {elapsed:?}");
    }

    #[test]
    fn sim_plot_escapes_strategy_names_in_svg() {
        let tmp = TempDir::new("escape");
        write_plots(&tmp.0, "A & B", &[run("x<y & z", 50, 10.0, 1.0)]).unwrap();
        let s = std::fs::read_to_string(tmp.0.join("cost.svg")).unwrap();
        assert!(s.contains("x&lt;y &amp; z"), "strategy name not escaped");
        assert!(!s.contains("x<y"));
    }

    #[test]
    fn sim_plot_unsorted_points_are_sorted() {
        let mut r = run("reactive", 100, 10.0, 1.0);
        r.points.reverse();
        let prepared = prepare_run(&r).unwrap();
        assert!(prepared.t_s.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(prepared.t_s.len(), 100);
    }

    #[test]
    fn sim_plot_rejects_empty_input() {
        let tmp = TempDir::new("empty");
        let err = write_plots(&tmp.0, "t", &[]).unwrap_err();
        assert!(err.contains("no runs"), "{err}");

        let runs = [
            run("reactive", 10, 10.0, 1.0),
            RunSeries {
                strategy: "idle".to_string(),
                points: vec![],
            },
        ];
        let err = write_plots(&tmp.0, "t", &runs).unwrap_err();
        assert!(
            err.contains("\"idle\"") && err.contains("no points"),
            "{err}"
        );
        assert!(!tmp.0.exists(), "nothing is written on bad input");
    }

    #[test]
    fn sim_plot_rejects_non_finite_values() {
        let mut r = run("reactive", 10, 10.0, 1.0);
        r.points[3].gpus_requested = f64::NAN;
        let tmp = TempDir::new("nan");
        let err = write_plots(&tmp.0, "t", &[r]).unwrap_err();
        assert!(
            err.contains("\"reactive\"")
                && err.contains("point 3")
                && err.contains("gpus_requested"),
            "{err}"
        );
    }

    #[test]
    fn sim_plot_reports_unwritable_file() {
        let tmp = TempDir::new("unwritable");
        std::fs::create_dir_all(&tmp.0).unwrap();
        // A directory where gpus.svg should go makes the write fail.
        std::fs::create_dir(tmp.0.join("gpus.svg")).unwrap();
        let err = write_plots(&tmp.0, "t", &[run("reactive", 10, 10.0, 1.0)]).unwrap_err();
        assert!(err.contains("gpus.svg"), "{err}");
    }

    #[test]
    fn sim_plot_downsample_keeps_each_bucket_max() {
        // 10,000 samples over x in [0, 9999], 100 buckets of 100 samples (bucket b holds
        // x = 100b ..= 100b + 99 as the span is 9999 and x * 100 / 9999 rounds down).
        let points: Vec<(f64, f64)> = (0..10_000)
            .map(|i| {
                let x = i as f64;
                // A spike at a bucket-dependent offset; everything else is small.
                let y = if i % 100 == (i / 100 * 37) % 100 {
                    1000.0 + (i / 100) as f64
                } else {
                    (i % 13) as f64
                };
                (x, y)
            })
            .collect();
        let out = downsample_max(&points, 100);
        assert_eq!(out.len(), 100);
        for (b, &(x, y)) in out.iter().enumerate() {
            let bucket = &points[b * 100..(b + 1) * 100];
            let max = bucket.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(y, max, "bucket {b}");
            assert_eq!(y, 1000.0 + b as f64, "bucket {b}");
            assert_eq!(
                x,
                (b * 100 + (b * 37) % 100) as f64,
                "bucket {b}: x of its max"
            );
        }
        // Sorted by x.
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn sim_plot_downsample_bounds_and_edges() {
        let short = vec![(0.0, 1.0), (1.0, 5.0), (2.0, 3.0)];
        assert_eq!(downsample_max(&short, 3), short);
        assert_eq!(downsample_max(&short, 10), short);
        assert_eq!(downsample_max(&[], 10), vec![]);
        assert_eq!(downsample_max(&short, 1), vec![(1.0, 5.0)]);
        assert_eq!(downsample_max(&short, 0), vec![(1.0, 5.0)]);

        // Uneven sampling: never more than max_points, global max always kept.
        let uneven: Vec<(f64, f64)> = (0..50_000)
            .map(|i| {
                let i = i as f64;
                (
                    i * i / 1000.0,
                    (i * 0.37).sin() * 10.0 + if i == 31_337.0 { 99.0 } else { 0.0 },
                )
            })
            .collect();
        let out = downsample_max(&uneven, MAX_DRAWN_SAMPLES);
        assert!(out.len() <= MAX_DRAWN_SAMPLES);
        assert!(out.iter().any(|p| p.1 > 90.0));

        // All samples at the same time: one bucket.
        let same: Vec<(f64, f64)> = (0..10).map(|i| (5.0, i as f64)).collect();
        assert_eq!(downsample_max(&same, 4), vec![(5.0, 9.0)]);
    }

    #[test]
    fn sim_plot_step_after_and_tick_format() {
        assert_eq!(
            step_after(&[(0.0, 1.0), (2.0, 3.0), (5.0, 0.0)]),
            vec![(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0), (5.0, 0.0)]
        );
        assert_eq!(step_after(&[]), vec![]);
        assert_eq!(format_tick(0.0, YFormat::Count), "0");
        assert_eq!(format_tick(-0.0, YFormat::Count), "0");
        assert_eq!(format_tick(12.0, YFormat::Count), "12");
        assert_eq!(format_tick(2.5, YFormat::Count), "2.5");
        assert_eq!(format_tick(1234567.0, YFormat::Usd), "$1,234,567");
        assert_eq!(format_tick(1234.25, YFormat::Usd), "$1,234.25");
        assert_eq!(format_tick(0.1 + 0.2, YFormat::Usd), "$0.3");
        assert_eq!(format_tick(-1500.0, YFormat::Usd), "-$1,500");
    }
}
