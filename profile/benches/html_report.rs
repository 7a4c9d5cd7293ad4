//! The HTML report at sizes (issue 25): generated interpreter profiles, from the
//! issue's CPython run (1,504 stacks of 300 frames, the baseline) to 100 k stacks of
//! 500 frames, CPU and heap. For each: the writer's time and the report's size; then
//! headless Chromium's time to load it and run its script (`--dump-dom`, and the
//! script's own figure), to print it to PDF (and the pages), and Firefox's to load,
//! use and read it where Firefox is installed.
//!
//! Prints figures only; asserts nothing about time.
//! `cargo bench -p profile --bench html_report [-- STACKS DEPTH]` adds a size.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::browser::{pdf_text, Chromium, Firefox};
use common::{interpreter, Kind};
use profile::writers::{html, Options};

fn main() {
    let mut sizes = vec![
        (1_504, 300, Kind::Heap),
        (10_000, 500, Kind::Heap),
        (100_000, 500, Kind::Cpu),
        (100_000, 500, Kind::Heap),
    ];
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    if let [stacks, depth, ..] = numbers[..] {
        sizes.push((stacks, depth, Kind::Heap));
    }
    let chromium = Chromium::find();
    let firefox = Firefox::find();
    let scratch = tempfile::tempdir().expect("a scratch directory");
    println!("HTML report: writer, size, and headless browsers (the first row is the baseline)");
    let mut baseline = None;
    for (stacks, depth, kind) in sizes {
        let profile = interpreter(stacks, depth, kind);
        let started = Instant::now();
        let mut out = Vec::new();
        let options = Options {
            title: format!("{stacks} stacks of {depth} frames"),
            ..Options::default()
        };
        html::write(&profile, &options, &mut out).expect("write the report");
        let written = started.elapsed();
        let page = scratch
            .path()
            .join(format!("{kind:?}-{stacks}-{depth}.html"));
        std::fs::write(&page, &out).expect("save the report");
        let base = *baseline.get_or_insert(written.as_secs_f64());
        println!(
            "  {kind:?}, {stacks} stacks of {depth} frames: {:.2} MB, written in {:.3} s ({:.1}x the baseline)",
            out.len() as f64 / 1e6,
            written.as_secs_f64(),
            written.as_secs_f64() / base
        );
        if let Some(chromium) = &chromium {
            let (dom, took) = chromium.dom(&page);
            let drawn = dom
                .split("data-drawn-ms=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("?");
            let pdf = scratch.path().join("report.pdf");
            let printing = chromium.print(&page, &pdf);
            let text = pdf_text(&pdf);
            println!(
                "    chromium: loaded and drawn in {:.2} s (its script: {drawn} ms); printed to PDF in \
                 {:.2} s: {} pages, {:.1} MB, {} characters of text",
                took.as_secs_f64(),
                printing.as_secs_f64(),
                pages(&pdf).map_or("?".to_string(), |n| n.to_string()),
                std::fs::metadata(&pdf).map_or(0, |m| m.len()) as f64 / 1e6,
                text.len()
            );
        }
        if let Some(firefox) = &firefox {
            let (reading, took) = firefox.check(&page);
            println!(
                "    firefox: loaded, used and read in {:.2} s (its script: {} ms, the printed flamegraphs {} ms)",
                took.as_secs_f64(),
                reading["drawnMs"].as_str().unwrap_or("?"),
                reading["printMs"]
            );
        }
    }
}

/// The pages of a PDF, as `pdfinfo` counts them.
fn pages(pdf: &Path) -> Option<usize> {
    let info = Command::new("pdfinfo").arg(pdf).output().ok()?;
    String::from_utf8_lossy(&info.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("Pages:"))
        .and_then(|n| n.trim().parse().ok())
}
