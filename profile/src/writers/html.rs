//! One self-contained HTML report, small at any size: the profile is embedded once, as
//! compact tables (`data`: a frame table, the stacks as one prefix tree, the values as
//! number columns), and the page's own script (`html/report.js`, plain JavaScript
//! included as it is) draws the views of the stacks from it: the flamegraph of any
//! value (a switch, zoom on click), the call tree top-down and bottom-up with self and
//! total, the functions with their callers and callees, search (highlighted in the
//! flamegraph, filtering the tables), the split by process; for a heap profile, the
//! stacks that hold the most, the leaks with their ages, and the size and lifetime
//! histograms.
//!
//! Printed, the page draws the flamegraph of each main value one under another (on
//! screen there is one, and a switch), so a PDF shows them all. What needs no script
//! is written here: the headline figures, the run, the counters, and the charts over
//! time (`charts`: events, memory), whose points are few at any size. A view the
//! profile has nothing for says so in words. Nothing is fetched: no URL, no CDN.
//! Figures are in human units (`crate::units`), values by the names a person reads
//! ([`crate::ValueType::describe`]).

mod charts;
mod data;
use crate::units;

use std::fmt::Write as _;
use std::io::{self, Write};

use super::Options;
use crate::{heap, Profile};

const STYLE: &str = include_str!("html/report.css");
const SCRIPT: &str = include_str!("html/report.js");

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> io::Result<()> {
    let mut html = String::new();
    let title = escape(&options.title);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>cargo-trace: {title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <header>\n<h1>{title}</h1>\n<p id=\"headline\">{}</p>\n\
         <noscript><p class=\"bad\">The views of this report are drawn by its script: \
         allow JavaScript to see them.</p></noscript>\n</header>\n",
        headline(profile)
    );
    let heap = profile.heap.is_some();
    navigation(heap, &mut html);
    toolbar(&mut html);
    flamegraph_section(profile, &mut html);
    if let Some(totals) = &profile.heap {
        let _ = write!(
            html,
            "<section id=\"memory\">\n<h2>Memory over time</h2>\n{}\
             <div class=\"view\" id=\"memory-view\"></div>\n</section>\n",
            charts::memory(profile, &totals.timeline)
        );
        html.push_str(HEAP_SECTIONS);
    }
    let _ = write!(
        html,
        "<section id=\"events\">\n<h2>Events over time</h2>\n\
         <div class=\"view\" id=\"events-view\">\n{}</div>\n</section>\n",
        charts::events(profile)
    );
    html.push_str(COMMON_SECTIONS);
    run_section(profile, &mut html);
    counters_section(profile, &mut html);
    let _ = write!(
        html,
        "<script type=\"application/json\" id=\"profile-data\">{}</script>\n\
         <script>{SCRIPT}</script>\n</body>\n</html>\n",
        data::encode(profile, options.weighting)
    );
    out.write_all(html.as_bytes())
}

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

/// The figures a reader looks for first. A heap profile: "137 MiB allocated in
/// 2,519,608 allocations; peak 28.1 MiB live; 3.4 MiB leaked in 104 blocks; ...".
/// Otherwise each value's total, the distinct stacks, the processes and the run's length.
fn headline(profile: &Profile) -> String {
    let distinct = units::count(profile.samples.len() as i64);
    let processes = profile.processes();
    let processes = units::plural(processes as i64, "process", "processes");
    let duration = units::duration(profile.metadata.duration);
    if let (Some(heap), Some(sums)) = (&profile.heap, profile.heap_sums()) {
        let mut line = format!(
            "{} allocated in {}; peak {} live; {} leaked in {}; {} (freed within {}); \
             {distinct} distinct stacks from {processes}, traced for {duration}",
            units::bytes(sums.bytes as i64),
            units::plural(sums.allocs as i64, "allocation", "allocations"),
            units::bytes(sums.peak_bytes),
            units::bytes(sums.leaked_bytes),
            units::plural(sums.leaked_blocks, "block", "blocks"),
            units::plural(
                sums.temporaries,
                "temporary allocation",
                "temporary allocations"
            ),
            units::duration(heap.temporary_threshold),
        );
        if let Some(sampling) = &heap.sampling {
            let _ = write!(line, "; sampled: {}", escape(sampling));
        }
        return line;
    }
    let mut parts: Vec<String> = profile
        .value_types
        .iter()
        .enumerate()
        .filter(|(_, t)| !heap::is_bucket(&t.kind))
        .map(|(index, t)| {
            format!(
                "{}: {}",
                escape(&t.describe()),
                units::value(profile.total(index), &t.unit)
            )
        })
        .collect();
    parts.push(format!(
        "{distinct} distinct stacks from {processes}, traced for {duration}"
    ));
    parts.join(" · ")
}

fn navigation(heap: bool, html: &mut String) {
    html.push_str("<nav class=\"screen-only\">");
    let mut sections = vec![("flamegraph", "Flamegraph")];
    if heap {
        sections.extend([
            ("memory", "Memory over time"),
            ("leaks", "Leaks"),
            ("sizes", "Sizes"),
            ("lifetimes", "Lifetimes"),
        ]);
    }
    sections.extend([
        ("events", "Events over time"),
        ("processes", "Processes"),
        ("functions", "Functions"),
        ("top-down", "Top-down"),
        ("bottom-up", "Bottom-up"),
        ("run", "Run"),
        ("counters", "Counters"),
    ]);
    let links: Vec<String> = sections
        .iter()
        .map(|(id, name)| format!("<a href=\"#{id}\">{name}</a>"))
        .collect();
    html.push_str(&links.join(" · "));
    html.push_str("</nav>\n");
}

/// The controls every view follows: which value weighs the stacks, and the search.
fn toolbar(html: &mut String) {
    html.push_str(
        "<div id=\"toolbar\" class=\"screen-only\">\
         <label>Weigh by <select id=\"value\"></select></label> \
         <input id=\"search\" type=\"search\" placeholder=\"Search functions (text, or /regex/)\" \
         aria-label=\"Search functions\"> <span id=\"matches\"></span></div>\n",
    );
}

/// Whether the page offers a flamegraph of a value: not of a histogram's bucket, nor of
/// the leaked blocks' summed ages (the leaks view divides them into mean ages).
fn drawn_as_flamegraph(kind: &str) -> bool {
    !heap::is_bucket(kind) && kind != heap::LEAKED_AGE
}

/// A heap profile's main values: the others (bytes freed, leaked blocks, untracked
/// blocks) mostly repeat one of these in another unit.
const HEAP_MAIN: [&str; 6] = [
    heap::ALLOCS,
    heap::ALLOC_SPACE,
    heap::FREES,
    heap::LEAKED_BYTES,
    heap::TEMPORARIES,
    heap::PEAK_BYTES,
];

/// Whether a value is a main one, printed as a flamegraph and a column of the processes'
/// table: any value with a flamegraph, but of a heap profile only [`HEAP_MAIN`].
fn main_value(profile: &Profile, kind: &str) -> bool {
    drawn_as_flamegraph(kind) && (profile.heap.is_none() || HEAP_MAIN.contains(&kind))
}

/// On screen one flamegraph and the switch; in print, each main value's flamegraph one
/// under another (drawn when the page is printed), the values with nothing to draw, and
/// those only on screen, named.
fn flamegraph_section(profile: &Profile, html: &mut String) {
    html.push_str(
        "<section id=\"flamegraph\">\n<h2>Flamegraph</h2>\n\
         <p class=\"screen-only hint\">The root at the top, callees below their callers; a \
         box's width is its share of the value chosen above. Click a box to zoom in on \
         it (and to see its function's callers and callees below); click the top bar to \
         zoom out.</p>\n\
         <div class=\"screen-only flame-bar\"><button id=\"reset\" type=\"button\">Reset \
         zoom</button> <span id=\"details\"></span></div>\n\
         <div id=\"flame\" class=\"screen-only flame-view\"></div>\n",
    );
    let mut empty = Vec::new();
    let mut on_screen = Vec::new();
    for (index, value_type) in profile.value_types.iter().enumerate() {
        if !drawn_as_flamegraph(&value_type.kind) {
            continue;
        }
        let name = escape(&value_type.describe());
        let total = profile.total(index);
        if total == 0 {
            empty.push(name);
            continue;
        }
        if !main_value(profile, &value_type.kind) {
            on_screen.push(name);
            continue;
        }
        let _ = writeln!(
            html,
            "<div class=\"print-only printed-flamegraph\"><div class=\"flamegraph\" \
             data-value=\"{index}\"><h3>Flamegraph: {name}</h3><p>{} in all.</p>\
             <div class=\"flame-print\"></div></div></div>",
            units::value(total, &value_type.unit)
        );
    }
    if !empty.is_empty() {
        let _ = writeln!(
            html,
            "<p class=\"print-only\">Nothing to draw for {}: the profile has none.</p>",
            empty.join(", ")
        );
    }
    if !on_screen.is_empty() {
        let _ = writeln!(
            html,
            "<p class=\"print-only\">The page's switch draws the flamegraphs of {} too.</p>",
            on_screen.join(", ")
        );
    }
    html.push_str("</section>\n");
}

/// The heap's views drawn by the script.
const HEAP_SECTIONS: &str = "\
<section id=\"leaks\">\n<h2>Leaks</h2>\n<div class=\"view\" id=\"leaks-view\"></div>\n</section>\n\
<section id=\"sizes\">\n<h2>Allocation sizes</h2>\n<div class=\"view\" id=\"sizes-view\"></div>\n</section>\n\
<section id=\"lifetimes\">\n<h2>Lifetimes</h2>\n<div class=\"view\" id=\"lifetimes-view\"></div>\n</section>\n";

/// Every profile's views drawn by the script.
const COMMON_SECTIONS: &str = "\
<section id=\"processes\">\n<h2>Processes</h2>\n<div class=\"view\" id=\"processes-view\"></div>\n</section>\n\
<section id=\"functions\">\n<h2>Functions</h2>\n<div class=\"view\" id=\"functions-view\"></div>\n\
<div class=\"view\" id=\"neighbours-view\"></div>\n</section>\n\
<section id=\"top-down\">\n<h2>Top-down: the call tree</h2>\n<div class=\"view\" id=\"top-down-view\"></div>\n</section>\n\
<section id=\"bottom-up\">\n<h2>Bottom-up: who calls the heaviest functions</h2>\n\
<div class=\"view\" id=\"bottom-up-view\"></div>\n</section>\n";

fn run_section(profile: &Profile, html: &mut String) {
    let metadata = &profile.metadata;
    html.push_str("<section id=\"run\">\n<h2>Run</h2>\n<table class=\"facts\">\n");
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
    if let Some(executable) = &metadata.executable {
        row("executable", format!("<code>{}</code>", escape(executable)));
    }
    row(
        "probes",
        profile
            .probes
            .iter()
            .map(|p| format!("<code>{}</code>", escape(p)))
            .collect::<Vec<_>>()
            .join(" "),
    );
    row("duration", units::duration(metadata.duration));
    if let Some(started) = metadata.started {
        if let Ok(since) = started.duration_since(std::time::UNIX_EPOCH) {
            row("started", utc(since.as_secs()));
        }
    }
    if let Some((value_type, amount)) = &metadata.period {
        row(
            "one sample stands for",
            format!(
                "{} of {}",
                units::value(*amount, &value_type.unit),
                escape(&value_type.describe())
            ),
        );
    }
    if let Some(heap) = &profile.heap {
        if let Some(sampling) = &heap.sampling {
            row("sampled", escape(sampling));
        }
        if let Some(filter) = &heap.size_filter {
            row("counted", format!("{} only", escape(filter)));
        }
        row(
            "temporary",
            format!(
                "freed within {} of its allocation",
                units::duration(heap.temporary_threshold)
            ),
        );
    }
    html.push_str("</table>\n</section>\n");
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

/// Why an object has no unwind table, as a reader needs it: the uprobes' page is no
/// code of the program (the kernel's page for uprobes' out-of-line single steps), not
/// JIT code.
fn without_table_reason(object: &str, reason: &str) -> String {
    if object == "[uprobes]" {
        "the kernel's page for uprobes' out-of-line steps: instructions copied there \
         while a probed one is stepped, no code of the program's own"
            .to_string()
    } else {
        reason.to_string()
    }
}

/// Every counter of the run, by name: each value's total, the stack walks that ended
/// early, the events and limits that lost something, the heap's processes.
fn counters_section(profile: &Profile, html: &mut String) {
    let summary = &profile.summary;
    html.push_str("<section id=\"counters\">\n<h2>Counters</h2>\n<table class=\"facts\">\n");
    let mut row = |name: &str, value: String| {
        let _ = writeln!(html, "<tr><th>{name}</th><td class=\"n\">{value}</td></tr>");
    };
    for (index, value_type) in profile.value_types.iter().enumerate() {
        // A heap histogram's buckets are drawn as histograms, not listed.
        if heap::is_bucket(&value_type.kind) {
            continue;
        }
        row(
            &escape(&value_type.describe()),
            units::value(profile.total(index), &value_type.unit),
        );
    }
    row(
        "distinct stacks",
        units::count(profile.samples.len() as i64),
    );
    row("processes", units::count(profile.processes() as i64));
    if summary.failures.is_empty() {
        row(
            "stack walks",
            "<span class=\"ok\">every walk reached the end of the stack</span>".to_string(),
        );
    }
    let failures = summary.failures.iter().map(|(reason, count)| {
        (
            format!("walks ended early: {reason}"),
            units::count(*count as i64),
        )
    });
    let losses = summary.losses.iter().map(|lost| {
        let mut count = units::count(lost.count as i64);
        if !lost.raised_by.is_empty() {
            let _ = write!(count, " (raise with {})", lost.raised_by.join(" or "));
        }
        (lost.what.clone(), count)
    });
    for (what, count) in failures.chain(losses) {
        row(
            &format!("<span class=\"bad\">{}</span>", escape(&what)),
            escape(&count),
        );
    }
    if let Some(heap) = &profile.heap {
        if let Some(sums) = profile.heap_sums() {
            row(
                "unknown frees (never subtracted)",
                units::count(sums.unknown_frees as i64),
            );
            row("bytes freed", units::bytes(sums.freed_bytes as i64));
        }
        for lost in &heap.lost {
            let mut count = units::count(lost.count as i64);
            if !lost.raised_by.is_empty() {
                let _ = write!(count, " (raise with {})", lost.raised_by.join(" or "));
            }
            row(
                &format!("<span class=\"bad\">{}</span>", escape(&lost.what)),
                escape(&count),
            );
        }
    }
    if summary.in_exec > 0 {
        row(
            "in execve, kernel stack only",
            units::count(summary.in_exec as i64),
        );
    }
    for (what, count) in &summary.no_user_stack {
        row(
            &format!("no user stack: {}", escape(what)),
            units::count(*count as i64),
        );
    }
    if summary.not_the_targets > 0 {
        row(
            "cargo-trace's own (not counted)",
            units::count(summary.not_the_targets as i64),
        );
    }
    if summary.merged_processes > 0 {
        row(
            "exited processes counted together as pid 0",
            units::count(summary.merged_processes as i64),
        );
    }
    for (object, reason) in &summary.without_table {
        row(
            &format!("no unwind table: <code>{}</code>", escape(object)),
            escape(&without_table_reason(object, reason)),
        );
    }
    html.push_str("</table>\n</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{example, golden};
    use crate::writers::Weighting;

    fn report(profile: &Profile, title: &str) -> String {
        let options = Options {
            weighting: Weighting::default(),
            title: title.into(),
            ..Options::default()
        };
        let mut out = Vec::new();
        write(profile, &options, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn dates_in_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn the_example_as_a_report() {
        let html = report(&example(), "example <run>");
        golden("example.html", html.as_bytes());
        assert!(html.contains("<title>cargo-trace: example &lt;run&gt;</title>"));
        assert!(html.contains(
            "<p id=\"headline\">events: 11 · bytes: 571 B · 5 distinct stacks from 1 process, \
             traced for 1.50 s</p>"
        ));
        // Printed, a flamegraph per value; the profile embedded once, no image in it.
        assert_eq!(html.matches("class=\"flamegraph\"").count(), 2);
        assert_eq!(html.matches("id=\"profile-data\"").count(), 1);
        assert!(!html.contains("data:"));
        assert!(html.contains("walks ended early: read fault</span></th><td class=\"n\">2</td>"));
        assert!(html.contains(
            "known stacks full</span></th><td class=\"n\">3 (raise with --max-stacks)</td>"
        ));
        // Nothing from the network.
        assert!(
            !html.contains("http:") && !html.contains("https:"),
            "{html}"
        );
        assert!(!html.contains("<script src") && !html.contains("<link"));
    }

    #[test]
    fn the_heap_example_as_a_report() {
        let profile = crate::writers::examples::heap();
        let html = report(&profile, "heap example");
        golden("example-heap.html", html.as_bytes());
        assert!(
            html.contains(
                "<p id=\"headline\">7.4 MiB allocated in 1,850 allocations; peak 3.7 MiB \
                 live; 3.4 MiB leaked in 104 blocks; 980 temporary allocations (freed within \
                 1 ms); 5 distinct stacks from 2 processes, traced for 1.50 s</p>"
            ),
            "{html}"
        );
        for id in ["memory-view", "leaks-view", "sizes-view", "lifetimes-view"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "{id}");
        }
        // The printed flamegraphs are of the values a person reads, by their names.
        let printed: Vec<&str> = html
            .split("<h3>Flamegraph: ")
            .skip(1)
            .filter_map(|h| h.split('<').next())
            .collect();
        assert_eq!(
            printed,
            [
                "allocations",
                "bytes allocated",
                "frees",
                "leaked bytes",
                "temporary allocations",
                "bytes live at the peak"
            ]
        );
        assert!(html.contains(
            "The page's switch draws the flamegraphs of bytes freed, leaked blocks too."
        ));
        // Nor the raw names of the values, nor the histograms' buckets.
        let page = html.split("<script").next().unwrap();
        assert!(!page.contains("Flamegraph: ages") && !page.contains("bucket"));
        assert!(!page.contains("alloc_space") && !page.contains("leaked_age"));
        assert!(page.contains("Nothing to draw for untracked blocks"));
    }

    #[test]
    fn the_uprobes_page_is_not_called_jit_code() {
        let mut profile = example();
        profile.summary.without_table = vec![(
            "[uprobes]".into(),
            "anonymous memory (JIT code has no .eh_frame)".into(),
        )];
        let html = report(&profile, "t");
        assert!(!html.contains("JIT"), "{html}");
        assert!(html.contains("the kernel&#39;s page for uprobes&#39; out-of-line steps"));
    }
}
