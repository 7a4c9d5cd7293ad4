//! The report's charts over time, drawn here as SVG (they have a point per count the
//! session took, every 100 or 200 ms: small at any size of profile): events over time,
//! and a heap profile's memory over time with its allocations and frees per second.
//! Each has a time axis and a value axis with round steps in the unit that fits, and
//! words that say what it shows.

use std::fmt::Write as _;

use crate::units;
use crate::{HeapPoint, Profile};

const WIDTH: f64 = 900.0;
const LEFT: f64 = 74.0;
const RIGHT: f64 = 74.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 34.0;

const BARS: &str = "#f0a06a";
const RUNNING: &str = "#2b5fb3";
const LIVE: &str = "#d9622b";
const RESIDENT: &str = "#2b5fb3";
const FREES: &str = "#3a9a5b";

/// Round steps from 0 to at least `max`: 1, 2 or 5 times a power of ten, about
/// `wanted` of them.
fn ticks(max: f64, wanted: usize) -> Vec<f64> {
    if max.is_nan() || max <= 0.0 {
        return vec![0.0, 1.0];
    }
    let raw = max / wanted as f64;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * power);
    let mut list = vec![0.0];
    while *list.last().expect("not empty") < max * (1.0 - 1e-9) {
        list.push(list.len() as f64 * step);
    }
    list
}

/// Round steps of bytes, in the binary unit of the largest.
fn byte_ticks(max: f64, wanted: usize) -> Vec<f64> {
    let mut unit = 1.0;
    while max / unit >= 1024.0 && unit < 1024f64.powi(5) {
        unit *= 1024.0;
    }
    ticks(max / unit, wanted)
        .into_iter()
        .map(|t| t * unit)
        .collect()
}

/// A figure of an axis: 3 significant digits at most, without a trailing `.0`.
fn short(value: f64) -> String {
    if value.abs() < 100.0 {
        let text = format!("{value:.1}");
        text.strip_suffix(".0").map_or(text.clone(), str::to_string)
    } else {
        format!("{value:.0}")
    }
}

/// A time axis up to `max_ms`: in milliseconds below 2 s, else in seconds.
fn time_ticks(max_ms: f64) -> (Vec<f64>, fn(f64) -> String) {
    if max_ms < 2000.0 {
        (ticks(max_ms, 6), |t| format!("{} ms", short(t)))
    } else {
        (
            ticks(max_ms / 1000.0, 6)
                .into_iter()
                .map(|t| t * 1000.0)
                .collect(),
            |t| format!("{} s", short(t / 1000.0)),
        )
    }
}

/// A chart's plot area and scales.
struct Plot {
    width: f64,
    height: f64,
    right: f64,
    x_max: f64,
    y_max: f64,
}

impl Plot {
    fn plot_width(&self) -> f64 {
        self.width - LEFT - self.right
    }
    fn plot_height(&self) -> f64 {
        self.height - TOP - BOTTOM
    }
    fn bottom(&self) -> f64 {
        TOP + self.plot_height()
    }
    fn x(&self, ms: f64) -> f64 {
        LEFT + ms / self.x_max * self.plot_width()
    }
    fn y(&self, value: f64) -> f64 {
        self.bottom() - value / self.y_max * self.plot_height()
    }
}

/// A chart over time: its element's id and a label for readers, its height, the time
/// it spans, its value axis, and whether a second axis takes its right side.
struct Chart<'a> {
    id: &'a str,
    label: &'a str,
    height: f64,
    max_ms: f64,
    y_ticks: &'a [f64],
    y_label: &'a dyn Fn(f64) -> String,
    right_axis: bool,
}

/// Opens the SVG of `chart`: its grid, axes and labels.
fn open(svg: &mut String, chart: &Chart<'_>) -> Plot {
    let Chart {
        id,
        label,
        height,
        max_ms,
        y_ticks,
        y_label,
        right_axis,
    } = *chart;
    let (x_ticks, x_label) = time_ticks(max_ms);
    let plot = Plot {
        width: WIDTH,
        height,
        right: if right_axis { RIGHT } else { 32.0 },
        x_max: x_ticks.last().copied().unwrap_or(1.0).max(1e-9),
        y_max: y_ticks.last().copied().unwrap_or(1.0).max(1e-9),
    };
    let _ = write!(
        svg,
        "<svg id=\"{id}\" class=\"chart\" role=\"img\" aria-label=\"{label}\" viewBox=\"0 0 {WIDTH} \
         {height}\" width=\"{WIDTH}\" height=\"{height}\">"
    );
    let right = LEFT + plot.plot_width();
    for &t in y_ticks {
        let y = plot.y(t);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{right:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            y + 4.0,
            y_label(t)
        );
    }
    let bottom = plot.bottom();
    for &t in &x_ticks {
        let x = plot.x(t);
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{bottom:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            bottom + 4.0,
            bottom + 16.0,
            x_label(t)
        );
    }
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" x2=\"{right:.1}\" y1=\"{bottom:.1}\" y2=\"{bottom:.1}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{bottom:.1}\" stroke=\"#888\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time since tracing started</text>",
        LEFT + plot.plot_width() / 2.0,
        height - 4.0
    );
    plot
}

fn legend(items: &[(&str, String)]) -> String {
    let mut html = String::from("<p class=\"legend\">");
    for (color, text) in items {
        let _ = write!(
            html,
            "<span><span class=\"swatch\" style=\"background:{color}\"></span>{text}</span>"
        );
    }
    html.push_str("</p>\n");
    html
}

fn milliseconds(at: std::time::Duration) -> f64 {
    at.as_secs_f64() * 1e3
}

fn at(ms: f64) -> String {
    units::nanoseconds((ms * 1e6).round() as i64)
}

/// Stack walks per second between the session's counts (bars), and the walks so far
/// (a line on an axis of its own), for the whole run; the words say how often the
/// session counted, so that a run of one count (a bar over all of it) reads as what it
/// is.
pub fn events(profile: &Profile) -> String {
    let points = &profile.metadata.timeline;
    if points.is_empty() {
        return "<p class=\"empty\">No counts over time were kept for this run (the session \
                counts stack walks every 200 ms while the target runs).</p>\n"
            .to_string();
    }
    let mut intervals = Vec::new();
    let mut previous = (0.0, 0u64);
    for point in points {
        let ms = milliseconds(point.at);
        let walks = point.walks.saturating_sub(previous.1);
        let rate = walks as f64 / (ms - previous.0).max(1e-3) * 1e3;
        intervals.push((previous.0, ms, walks, rate));
        previous = (ms, point.walks);
    }
    let total = previous.1;
    let peak = intervals.iter().map(|i| i.3).fold(0.0, f64::max);
    let max_ms = milliseconds(profile.metadata.duration).max(previous.0);
    let mut spans: Vec<f64> = intervals.iter().map(|i| i.1 - i.0).collect();
    spans.sort_by(f64::total_cmp);
    let when = if points.len() <= 4 {
        let list: Vec<String> = points.iter().map(|p| at(milliseconds(p.at))).collect();
        format!("at {}", list.join(", "))
    } else {
        format!("every {} or so", at(spans[spans.len() / 2]))
    };
    let mut html = format!(
        "<p>{} stack walks in {}, counted {} time{} while the target ran ({when}); at most {} per \
         second between two counts.{}</p>\n",
        units::count(total as i64),
        at(max_ms),
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        units::count(peak.round() as i64),
        if points.len() == 1 {
            " A run this short has one count: its bar is the mean rate over the whole run, \
             the line the walks so far."
        } else {
            ""
        }
    );
    let y_ticks = ticks(peak, 4);
    let mut svg = String::new();
    let plot = open(
        &mut svg,
        &Chart {
            id: "timeline",
            label: "stack walks over time",
            height: 200.0,
            max_ms,
            y_ticks: &y_ticks,
            y_label: &|t| format!("{}/s", units::count(t.round() as i64)),
            right_axis: true,
        },
    );
    for &(from, to, walks, rate) in &intervals {
        let (x0, x1, y) = (plot.x(from), plot.x(to), plot.y(rate));
        let gap = if x1 - x0 > 6.0 { 1.0 } else { 0.0 };
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{BARS}\">\
             <title>{} – {}: {} walks, {}/s</title></rect>",
            x0 + gap,
            (x1 - x0 - 2.0 * gap).max(0.5),
            plot.bottom() - y,
            at(from),
            at(to),
            units::count(walks as i64),
            units::count(rate.round() as i64)
        );
    }
    // The walks so far, on the right axis.
    let right = ticks(total as f64, 4);
    let right_max = right.last().copied().unwrap_or(1.0).max(1e-9);
    let y_right = |walks: f64| plot.bottom() - walks / right_max * plot.plot_height();
    let line: Vec<String> = std::iter::once((0.0, 0.0))
        .chain(points.iter().map(|p| (milliseconds(p.at), p.walks as f64)))
        .map(|(ms, walks)| format!("{:.1},{:.1}", plot.x(ms), y_right(walks)))
        .collect();
    let _ = write!(
        svg,
        "<polyline fill=\"none\" stroke=\"{RUNNING}\" stroke-width=\"2\" points=\"{}\"/>",
        line.join(" ")
    );
    for point in points {
        let _ = write!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{RUNNING}\"/>",
            plot.x(milliseconds(point.at)),
            y_right(point.walks as f64)
        );
    }
    for &t in &right {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{RUNNING}\">{}</text>",
            LEFT + plot.plot_width() + 6.0,
            y_right(t) + 4.0,
            units::count(t.round() as i64)
        );
    }
    svg.push_str("</svg>\n");
    html.push_str(&svg);
    html.push_str(&legend(&[
        (
            BARS,
            "stack walks per second, between two counts (left axis)".into(),
        ),
        (RUNNING, "stack walks so far (right axis)".into()),
    ]));
    html
}

/// Live bytes of the tracked blocks and resident memory over time, then allocations
/// and frees per second between two points.
pub fn memory(profile: &Profile, points: &[HeapPoint]) -> String {
    if points.is_empty() {
        return "<p class=\"empty\">No memory over time was kept for this run (the session \
                takes the heap's totals every 100 ms while the target runs).</p>\n"
            .to_string();
    }
    let last = points.last().map_or(0.0, |p| milliseconds(p.at));
    let max_ms = milliseconds(profile.metadata.duration).max(last);
    let peak_live = points.iter().map(|p| p.live_bytes).max().unwrap_or(0);
    let peak_rss = points.iter().map(|p| p.rss_bytes).max().unwrap_or(0);
    let mut html = format!(
        "<p>Live bytes of the tracked blocks (left axis) and resident memory of the traced \
         processes (right axis), taken {} time{} over {}.</p>\n",
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        at(max_ms)
    );
    // Each on an axis of its own: the heap's blocks are often a small part of what is
    // resident.
    let y_ticks = byte_ticks(peak_live.max(0) as f64, 5);
    let mut svg = String::new();
    let plot = open(
        &mut svg,
        &Chart {
            id: "heap-timeline",
            label: "memory over time",
            height: 240.0,
            max_ms,
            y_ticks: &y_ticks,
            y_label: &|t| units::bytes(t.round() as i64),
            right_axis: true,
        },
    );
    let right = byte_ticks(peak_rss as f64, 5);
    let right_max = right.last().copied().unwrap_or(1.0).max(1e-9);
    let y_right = |bytes: f64| plot.bottom() - bytes / right_max * plot.plot_height();
    let line = |y: &dyn Fn(&HeapPoint) -> f64| -> String {
        let coordinates: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", plot.x(milliseconds(p.at)), y(p)))
            .collect();
        coordinates.join(" ")
    };
    let _ = write!(
        svg,
        "<polyline fill=\"none\" stroke=\"{LIVE}\" stroke-width=\"2\" points=\"{}\"/>\
         <polyline fill=\"none\" stroke=\"{RESIDENT}\" stroke-width=\"2\" points=\"{}\"/>",
        line(&|p| plot.y(p.live_bytes.max(0) as f64)),
        line(&|p| y_right(p.rss_bytes as f64)),
    );
    for &t in &right {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{RESIDENT}\">{}</text>",
            LEFT + plot.plot_width() + 6.0,
            y_right(t) + 4.0,
            units::bytes(t.round() as i64)
        );
    }
    if let [only] = points {
        let _ = write!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{LIVE}\"/>",
            plot.x(milliseconds(only.at)),
            plot.y(only.live_bytes.max(0) as f64)
        );
    }
    svg.push_str("</svg>\n");
    html.push_str(&svg);
    html.push_str(&legend(&[
        (
            LIVE,
            format!(
                "live bytes of the tracked blocks (at most {}, left axis)",
                units::bytes(peak_live)
            ),
        ),
        (
            RESIDENT,
            format!(
                "resident memory (at most {}, right axis)",
                units::bytes(peak_rss as i64)
            ),
        ),
    ]));
    if points.len() > 1 {
        html.push_str(&rates(points, max_ms));
    }
    html
}

/// Allocations and frees per second between two points of memory over time, as steps.
fn rates(points: &[HeapPoint], max_ms: f64) -> String {
    let mut steps = Vec::new();
    let mut previous = (0.0, 0u64, 0u64);
    for p in points {
        let ms = milliseconds(p.at);
        let span = (ms - previous.0).max(1e-3) / 1e3;
        steps.push((
            previous.0,
            ms,
            p.allocs.saturating_sub(previous.1) as f64 / span,
            p.frees.saturating_sub(previous.2) as f64 / span,
        ));
        previous = (ms, p.allocs, p.frees);
    }
    let most = steps.iter().map(|s| s.2.max(s.3)).fold(0.0, f64::max);
    let mut svg = String::new();
    let y_ticks = ticks(most, 4);
    let plot = open(
        &mut svg,
        &Chart {
            id: "heap-rates",
            label: "allocations and frees per second",
            height: 170.0,
            max_ms,
            y_ticks: &y_ticks,
            y_label: &|t| format!("{}/s", units::count(t.round() as i64)),
            right_axis: false,
        },
    );
    for (rate, color, width) in [(2, LIVE, 2.5), (3, FREES, 1.5)] {
        let coordinates: Vec<String> = steps
            .iter()
            .map(|s| {
                let value = if rate == 2 { s.2 } else { s.3 };
                format!(
                    "{:.1},{:.1} {:.1},{:.1}",
                    plot.x(s.0),
                    plot.y(value),
                    plot.x(s.1),
                    plot.y(value)
                )
            })
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" points=\"{}\"/>",
            coordinates.join(" ")
        );
    }
    svg.push_str("</svg>\n");
    svg + &legend(&[
        (LIVE, "allocations per second".into()),
        (FREES, "frees per second".into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::example;
    use std::time::Duration;

    #[test]
    fn round_steps() {
        assert_eq!(ticks(7.0, 4), [0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(ticks(240.0, 6), [0.0, 50.0, 100.0, 150.0, 200.0, 250.0]);
        assert_eq!(ticks(0.0, 4), [0.0, 1.0]);
        let mib = 1024.0 * 1024.0;
        assert_eq!(
            byte_ticks(3.5 * mib, 5),
            [0.0, 1.0 * mib, 2.0 * mib, 3.0 * mib, 4.0 * mib]
        );
        let (steps, label) = time_ticks(1500.0);
        assert_eq!(label(*steps.last().unwrap()), "1500 ms");
        let (steps, label) = time_ticks(12_000.0);
        assert_eq!(steps.len(), 7);
        assert_eq!(label(steps[1]), "2 s");
    }

    #[test]
    fn a_short_run_has_an_axis_and_says_what_it_shows() {
        let mut profile = example();
        profile.metadata.duration = Duration::from_millis(240);
        profile.metadata.timeline = vec![crate::TimelinePoint {
            at: Duration::from_millis(240),
            walks: 48,
        }];
        let html = events(&profile);
        assert!(
            html.contains(
                "48 stack walks in 240 ms, counted 1 time while the target ran (at 240 ms); \
                 at most 200 per second between two counts. A run this short has one count"
            ),
            "{html}"
        );
        // Milliseconds along the time axis, a rate axis, one bar, the running count.
        for label in ["0 ms", "50 ms", "250 ms", "200/s"] {
            assert!(
                html.contains(&format!(">{label}</text>")),
                "{label}: {html}"
            );
        }
        assert_eq!(html.matches("<rect ").count(), 1);
        assert_eq!(html.matches("<circle ").count(), 1);
    }

    #[test]
    fn memory_over_time_draws_every_point() {
        let points: Vec<HeapPoint> = (0..5)
            .map(|i| HeapPoint {
                at: Duration::from_millis(100 * i),
                live_bytes: 1000 * i as i64,
                allocs: 10 * i,
                frees: 5 * i,
                rss_bytes: 8192,
            })
            .collect();
        let html = memory(&example(), &points);
        let chart = html.split("id=\"heap-timeline\"").nth(1).unwrap();
        let first = chart.split("points=\"").nth(1).unwrap();
        assert_eq!(first[..first.find('"').unwrap()].split(' ').count(), 5);
        assert!(html.contains("live bytes of the tracked blocks (at most 3.9 KiB, left axis)"));
        assert!(html.contains("resident memory (at most 8 KiB, right axis)"));
        // Each on its axis: live bytes up to 4 KiB, resident memory up to 8 KiB.
        assert!(
            html.contains(">4 KiB</text>") && html.contains(">8 KiB</text>"),
            "{html}"
        );
        // Rates: 100 allocations and 50 frees per second.
        assert!(html.contains("id=\"heap-rates\"") && html.contains(">100/s</text>"));
    }
}
