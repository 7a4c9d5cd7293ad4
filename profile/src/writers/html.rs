//! One self-contained HTML report: the run (command, probes, duration), every summary
//! counter, the events over time, an interactive flamegraph per value type, and the
//! functions by self and total weight with a search box. Everything is inline (the
//! flamegraphs as data: URIs, which keep inferno's own zoom and search); the page asks
//! nothing of the network.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};

use base64::Engine;

use super::{svg, Options, Weighting};
use crate::Profile;

/// Rows of the functions table: enough to find anything that matters, few enough to
/// keep the page quick with 100k stacks.
const FUNCTION_ROWS: usize = 500;

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> io::Result<()> {
    let mut html = String::new();
    let title = escape(&options.title);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>cargo-trace: {title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>{title}</h1>\n"
    );
    run_section(profile, &mut html);
    summary_section(profile, &mut html);
    timeline_section(profile, &mut html);
    heap_section(profile, &mut html);
    flamegraph_sections(profile, options, &mut html)?;
    functions_section(profile, options.weighting, &mut html);
    let _ = write!(html, "<script>{SCRIPT}</script>\n</body>\n</html>\n");
    out.write_all(html.as_bytes())
}

const STYLE: &str = "
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; word-break: break-all; }
h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; }
td, th { padding: 0.2em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #176b17; } .bad { color: #a51d1d; }
object.flamegraph { width: 100%; min-height: 300px; border: 1px solid #ddd; }
#search { width: 30em; padding: 0.3em; margin: 0.5em 0; }
code { background: #f4f4f4; padding: 0 0.2em; }
";

const SCRIPT: &str = "
const search = document.getElementById('search');
if (search) {
  search.addEventListener('input', () => {
    const needle = search.value.toLowerCase();
    let shown = 0;
    for (const row of document.querySelectorAll('#functions tbody tr')) {
      const match = row.dataset.name.toLowerCase().includes(needle);
      row.hidden = !match;
      if (match) shown++;
    }
    document.getElementById('matches').textContent = needle ? shown + ' matching' : '';
  });
}
";

fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '&' => escaped.push_str("&amp;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

fn run_section(profile: &Profile, html: &mut String) {
    let metadata = &profile.metadata;
    html.push_str("<h2>Run</h2>\n<table id=\"run\">\n");
    let mut row = |name: &str, value: String| {
        let _ = writeln!(html, "<tr><th>{name}</th><td>{value}</td></tr>");
    };
    row(
        "target",
        match &metadata.command {
            Some(command) => format!("<code>{}</code>", escape(&command.join(" "))),
            None => format!("process {}", metadata.pid),
        },
    );
    row(
        "probes",
        profile
            .probes
            .iter()
            .map(|p| format!("<code>{}</code>", escape(p)))
            .collect::<Vec<_>>()
            .join(" "),
    );
    row(
        "duration",
        format!("{:.2} s", metadata.duration.as_secs_f64()),
    );
    if let Some(started) = metadata.started {
        if let Ok(since) = started.duration_since(std::time::UNIX_EPOCH) {
            row("started", utc(since.as_secs()));
        }
    }
    html.push_str("</table>\n");
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time (the civil calendar from days, as in
/// Howard Hinnant's `civil_from_days`).
fn utc(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let time = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        time / 3_600,
        time / 60 % 60,
        time % 60
    )
}

fn summary_section(profile: &Profile, html: &mut String) {
    let summary = &profile.summary;
    html.push_str("<h2>Summary</h2>\n<table id=\"summary\">\n");
    let mut row = |name: &str, value: String| {
        let _ = writeln!(html, "<tr><th>{name}</th><td class=\"n\">{value}</td></tr>");
    };
    for (index, value_type) in profile.value_types.iter().enumerate() {
        // A heap histogram's buckets are in the CSV output, not here.
        if crate::heap::is_bucket(&value_type.kind) {
            continue;
        }
        row(
            &escape(&format!("{} ({})", value_type.kind, value_type.unit)),
            profile.total(index).to_string(),
        );
    }
    row("distinct stacks", profile.samples.len().to_string());
    row("processes", profile.processes().to_string());
    if summary.failures.is_empty() {
        row(
            "stack walks",
            "<span class=\"ok\">every walk reached the end of the stack</span>".to_string(),
        );
    }
    let failures = summary
        .failures
        .iter()
        .map(|(reason, count)| (reason.as_str(), count.to_string()));
    let losses = summary
        .losses
        .iter()
        .map(|lost| (lost.what.as_str(), lost.count_and_options()));
    for (what, count) in failures.chain(losses) {
        row(
            &format!("<span class=\"bad\">{}</span>", escape(what)),
            escape(&count),
        );
    }
    if summary.in_exec > 0 {
        row("in execve, kernel stack only", summary.in_exec.to_string());
    }
    for (what, count) in &summary.no_user_stack {
        row(
            &format!("no user stack: {}", escape(what)),
            count.to_string(),
        );
    }
    if summary.not_the_targets > 0 {
        row(
            "cargo-trace's own (not counted)",
            summary.not_the_targets.to_string(),
        );
    }
    if summary.merged_processes > 0 {
        row(
            "exited processes counted together as pid 0",
            summary.merged_processes.to_string(),
        );
    }
    for (object, reason) in &summary.without_table {
        row(
            &format!("no unwind table: {}", escape(object)),
            escape(reason),
        );
    }
    html.push_str("</table>\n");
}

/// Stack walks per interval, as an inline SVG bar chart.
fn timeline_section(profile: &Profile, html: &mut String) {
    let points = &profile.metadata.timeline;
    if points.is_empty() {
        return;
    }
    const WIDTH: f64 = 900.0;
    const HEIGHT: f64 = 160.0;
    let end = points.last().map_or(0.0, |p| p.at.as_secs_f64()).max(1e-3);
    let mut previous = (0.0, 0u64);
    let mut bars = Vec::new();
    for point in points {
        let at = point.at.as_secs_f64();
        let span = (at - previous.0).max(1e-3);
        let rate = point.walks.saturating_sub(previous.1) as f64 / span;
        bars.push((previous.0, at, rate, point.walks.saturating_sub(previous.1)));
        previous = (at, point.walks);
    }
    let peak = bars.iter().map(|b| b.2).fold(0.0, f64::max).max(1.0);
    let _ = writeln!(
        html,
        "<h2>Events over time</h2>\n<p>Stack walks per second; the peak was {peak:.0}/s.</p>\n\
         <svg id=\"timeline\" width=\"{WIDTH}\" height=\"{}\" role=\"img\">",
        HEIGHT + 20.0
    );
    for (from, to, rate, walks) in bars {
        let x = from / end * WIDTH;
        let w = ((to - from) / end * WIDTH - 1.0).max(1.0);
        let h = rate / peak * HEIGHT;
        let _ = writeln!(
            html,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"#d9622b\">\
             <title>{from:.2}–{to:.2} s: {walks} walks</title></rect>",
            HEIGHT - h
        );
    }
    let _ = writeln!(
        html,
        "<line x1=\"0\" y1=\"{HEIGHT}\" x2=\"{WIDTH}\" y2=\"{HEIGHT}\" stroke=\"#888\"/>\
         <text x=\"0\" y=\"{}\" font-size=\"12\">0 s</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"end\">{end:.2} s</text></svg>",
        HEIGHT + 15.0,
        WIDTH,
        HEIGHT + 15.0
    );
}

/// A heap profile's memory over time: live bytes of the tracked blocks and resident
/// memory, as lines, from the timeline the session kept (every 100 ms).
fn heap_section(profile: &Profile, html: &mut String) {
    let Some(heap) = &profile.heap else {
        return;
    };
    let points = &heap.timeline;
    let _ = writeln!(html, "<h2>Memory over time</h2>");
    if points.is_empty() {
        let _ = writeln!(html, "<p>No timeline was kept.</p>");
        return;
    }
    const WIDTH: f64 = 900.0;
    const HEIGHT: f64 = 160.0;
    let end = points.last().map_or(0.0, |p| p.at.as_secs_f64()).max(1e-3);
    let top = points
        .iter()
        .map(|p| p.live_bytes.max(0) as u64)
        .chain(points.iter().map(|p| p.rss_bytes))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let line = |value: &dyn Fn(&crate::HeapPoint) -> f64| -> String {
        points
            .iter()
            .map(|p| {
                let x = p.at.as_secs_f64() / end * WIDTH;
                let y = HEIGHT - value(p) / top * HEIGHT;
                format!("{x:.1},{y:.1}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let peak_live = points.iter().map(|p| p.live_bytes).max().unwrap_or(0);
    let peak_rss = points.iter().map(|p| p.rss_bytes).max().unwrap_or(0);
    let _ = writeln!(
        html,
        "<p>Live bytes of the tracked blocks (<span style=\"color:#d9622b\">orange</span>, at \
         most {peak_live}) and resident memory (<span style=\"color:#2b6cd9\">blue</span>, at \
         most {peak_rss} bytes), every 100 ms.</p>\n\
         <svg id=\"heap-timeline\" width=\"{WIDTH}\" height=\"{}\" role=\"img\">\n\
         <polyline fill=\"none\" stroke=\"#2b6cd9\" points=\"{}\"/>\n\
         <polyline fill=\"none\" stroke=\"#d9622b\" points=\"{}\"/>\n\
         <line x1=\"0\" y1=\"{HEIGHT}\" x2=\"{WIDTH}\" y2=\"{HEIGHT}\" stroke=\"#888\"/>\
         <text x=\"0\" y=\"{}\" font-size=\"12\">0 s</text>\
         <text x=\"{WIDTH}\" y=\"{}\" font-size=\"12\" text-anchor=\"end\">{end:.2} s</text></svg>",
        HEIGHT + 20.0,
        line(&|p| p.rss_bytes as f64),
        line(&|p| p.live_bytes.max(0) as f64),
        HEIGHT + 15.0,
        HEIGHT + 15.0,
    );
}

fn flamegraph_sections(profile: &Profile, options: &Options, html: &mut String) -> io::Result<()> {
    for (index, value_type) in profile.value_types.iter().enumerate() {
        if crate::heap::is_bucket(&value_type.kind) {
            continue;
        }
        let weighting = Weighting {
            value: index,
            ..options.weighting
        };
        let mut bytes = Vec::new();
        svg::write(profile, weighting, &options.title, &mut bytes)?;
        let _ = writeln!(
            html,
            "<h2>Flamegraph by {kind}</h2>\n<p>Click to zoom, Ctrl-F or \"Search\" to find a \
             function.</p>\n<object class=\"flamegraph\" type=\"image/svg+xml\" \
             data=\"data:image/svg+xml;base64,{}\"></object>",
            base64::engine::general_purpose::STANDARD.encode(&bytes),
            kind = escape(&value_type.kind)
        );
    }
    Ok(())
}

/// Functions by self weight (their own frames at the top of a stack) and total weight
/// (stacks they appear in), by the weighing value.
fn functions_section(profile: &Profile, weighting: Weighting, html: &mut String) {
    let mut functions: HashMap<&str, (i64, i64)> = HashMap::new();
    for sample in &profile.samples {
        let weight = sample.values[weighting.value];
        let mut seen: Vec<&str> = Vec::new();
        for (position, &id) in sample.stack.iter().enumerate() {
            for (depth, frame) in profile.locations[id].frames.iter().enumerate() {
                let name = frame.function.as_str();
                let entry = functions.entry(name).or_default();
                if position == 0 && depth == 0 {
                    entry.0 += weight;
                }
                if !seen.contains(&name) {
                    seen.push(name);
                    entry.1 += weight;
                }
            }
        }
    }
    let mut rows: Vec<(&str, (i64, i64))> = functions.into_iter().collect();
    rows.sort_by(|a, b| {
        b.1 .0
            .cmp(&a.1 .0)
            .then(b.1 .1.cmp(&a.1 .1))
            .then(a.0.cmp(b.0))
    });
    let kind = profile
        .value_types
        .get(weighting.value)
        .map_or("events", |t| t.kind.as_str());
    let _ = writeln!(
        html,
        "<h2>Functions by {kind}</h2>\n<input id=\"search\" type=\"search\" \
         placeholder=\"Search functions\" aria-label=\"Search functions\"> \
         <span id=\"matches\"></span>\n<table id=\"functions\">\n<thead><tr><th>function</th>\
         <th>self</th><th>total</th></tr></thead>\n<tbody>",
        kind = escape(kind)
    );
    for (name, (own, total)) in rows.iter().take(FUNCTION_ROWS) {
        let name = escape(name);
        let _ = writeln!(
            html,
            "<tr data-name=\"{name}\"><td>{name}</td><td class=\"n\">{own}</td>\
             <td class=\"n\">{total}</td></tr>"
        );
    }
    html.push_str("</tbody>\n</table>\n");
    if rows.len() > FUNCTION_ROWS {
        let _ = writeln!(
            html,
            "<p>{} more functions, each lighter than these (the JSON output has them all).</p>",
            rows.len() - FUNCTION_ROWS
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden};

    #[test]
    fn dates_in_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn a_heap_profile_draws_memory_over_time() {
        use crate::{HeapPoint, HeapTotals};
        let mut profile = example();
        profile.heap = Some(HeapTotals {
            timeline: (0..5)
                .map(|i| HeapPoint {
                    at: std::time::Duration::from_millis(100 * i),
                    live_bytes: 1000 * i as i64,
                    allocs: 10 * i,
                    frees: 5 * i,
                    rss_bytes: 8192,
                })
                .collect(),
            ..HeapTotals::default()
        });
        let mut out = Vec::new();
        write(&profile, &Options::default(), &mut out).unwrap();
        let html = String::from_utf8(out).unwrap();
        let chart = html
            .split("id=\"heap-timeline\"")
            .nth(1)
            .expect("the chart");
        // Two lines: resident memory, the larger, along the top; live bytes ending
        // at 4000 of 8192 on the scale.
        assert_eq!(chart.matches("<polyline").count(), 2);
        assert!(chart.contains("0.0,0.0 225.0,0.0"), "{chart}");
        assert!(chart.contains("900.0,81.9\"/>"), "{chart}");
        assert!(html.contains("at most 4000)"));
    }

    #[test]
    fn the_example_as_a_report() {
        let profile = example();
        let options = Options {
            weighting: Weighting::default(),
            title: "example <run>".into(),
            ..Options::default()
        };
        let mut out = Vec::new();
        write(&profile, &options, &mut out).unwrap();
        golden("example.html", &out);
        let html = String::from_utf8(out).unwrap();
        assert!(html.contains("<title>cargo-trace: example &lt;run&gt;</title>"));
        // A flamegraph per value type, the counters, the timeline's three intervals.
        assert_eq!(html.matches("data:image/svg+xml;base64,").count(), 2);
        assert!(html.contains("read fault</span></th><td class=\"n\">2</td>"));
        assert_eq!(html.matches("<rect ").count(), 3);
        // Nothing from the network: no URL anywhere outside the embedded images.
        assert!(
            !html.contains("http:") && !html.contains("https:"),
            "{html}"
        );
        // Functions by self weight: the inlined helper is the heaviest leaf.
        let first_row = html.split("<tbody>").nth(1).unwrap();
        assert!(
            first_row
                .trim_start()
                .starts_with("<tr data-name=\"demo::inlined_helper\">"),
            "{first_row}"
        );
        assert!(html.contains("&lt;[u8; 4] as demo::Fill&gt;::fill"));
    }
}
