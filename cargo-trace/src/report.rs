//! Aggregated stacks → folded lines → flamegraph SVG, and the closing summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};

use crate::symbolize::{Frame, Symbolizer};

/// One aggregated stack as read from the kernel.
#[derive(Clone, Debug)]
pub struct Sample {
    pub probe: usize,
    pub pid: u32,
    /// User return addresses, innermost first; `user[0]` is the current pc.
    pub user: Vec<u64>,
    /// Why the user walk ended early, if it did (e.g. "read fault").
    pub truncated: Option<String>,
    /// Kernel addresses, innermost first.
    pub kernel: Vec<u64>,
    pub count: u64,
}

/// Folded stacks: `root;...;leaf` → count, merged over identical symbolized stacks.
pub struct Folded {
    pub lines: BTreeMap<String, u64>,
}

/// Symbolize every sample and fold it. With more than one probe, each stack is
/// rooted at its probe's name so the probes' counts stay apart.
/// `line_numbers`: frames read `function (file:line)`, so each line of a function is
/// its own frame.
pub fn fold(
    samples: &[Sample],
    probe_names: &[String],
    symbolizer: &mut Symbolizer,
    line_numbers: bool,
) -> Folded {
    let mut lines = BTreeMap::new();
    for sample in samples {
        let mut frames: Vec<String> = Vec::new();
        if probe_names.len() > 1 {
            frames.push(probe_names[sample.probe].clone());
        }
        if let Some(reason) = &sample.truncated {
            frames.push(format!("[truncated: {reason}]"));
        }
        for (depth, &pc) in sample.user.iter().enumerate().rev() {
            let symbolized = symbolizer.user(sample.pid, pc, depth > 0);
            frames.extend(
                symbolized
                    .iter()
                    .map(|frame| frame_name(frame, line_numbers)),
            );
        }
        let kernel: Vec<String> = sample
            .kernel
            .iter()
            .map(|&address| symbolizer.kernel(address).function)
            // Innermost first: the BPF program and its trampoline are not the
            // traced code.
            .skip_while(|name| is_bpf_machinery(name))
            .collect();
        frames.extend(kernel.iter().rev().map(|name| format!("{name}_[k]")));
        if frames.is_empty() {
            frames.push("[no stack]".to_string());
        }
        *lines.entry(frames.join(";")).or_insert(0) += sample.count;
    }
    Folded { lines }
}

/// Kernel frames of the BPF program itself and of the code that runs it.
fn is_bpf_machinery(name: &str) -> bool {
    name.starts_with("bpf_prog_")
        || name.starts_with("bpf_trace_run")
        || name.starts_with("__bpf_trace_")
        || name.starts_with("bpf_get_stack")
}

/// A frame as it appears in folded output: `;` would split it, so it becomes `:`
/// as in the original stackcollapse scripts.
fn frame_name(frame: &Frame, line_numbers: bool) -> String {
    let name = match (&frame.file, frame.line, line_numbers) {
        (Some(file), Some(line), true) => format!("{} ({file}:{line})", frame.function),
        _ => frame.function.clone(),
    };
    name.replace(';', ":")
}

impl Folded {
    pub fn total(&self) -> u64 {
        self.lines.values().sum()
    }

    pub fn to_text(&self) -> String {
        let mut text = String::new();
        for (stack, count) in &self.lines {
            let _ = writeln!(text, "{stack} {count}");
        }
        text
    }

    /// The flamegraph of these stacks, as SVG.
    pub fn svg(&self, title: &str, count_name: &str) -> Result<Vec<u8>> {
        let mut options = inferno::flamegraph::Options::default();
        options.title = title.to_string();
        options.count_name = count_name.to_string();
        let text = self.to_text();
        let mut svg = Vec::new();
        if text.is_empty() {
            // inferno refuses empty input; an empty profile is still a valid answer.
            options.title = format!("{title} (no events)");
            inferno::flamegraph::from_lines(&mut options, ["[no events] 1"], &mut svg)
        } else {
            inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg)
        }
        .context("rendering the flamegraph")?;
        Ok(svg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semicolons_in_names_do_not_split_frames() {
        let frame = Frame {
            function: "<[u8; 32] as Debug>::fmt".into(),
            file: None,
            line: None,
        };
        assert_eq!(frame_name(&frame, false), "<[u8: 32] as Debug>::fmt");
        let located = Frame {
            file: Some("src/lib.rs".into()),
            line: Some(7),
            ..frame
        };
        assert_eq!(
            frame_name(&located, true),
            "<[u8: 32] as Debug>::fmt (src/lib.rs:7)"
        );
    }

    #[test]
    fn svg_of_folded_lines_and_of_nothing() {
        let mut lines = BTreeMap::new();
        lines.insert("main;work;leaf".to_string(), 3);
        lines.insert("main;other".to_string(), 1);
        let folded = Folded { lines };
        assert_eq!(folded.total(), 4);
        assert_eq!(folded.to_text(), "main;other 1\nmain;work;leaf 3\n");
        let text = String::from_utf8(folded.svg("t", "samples").unwrap()).unwrap();
        assert!(text.starts_with("<?xml") && text.contains("leaf"));
        let empty = Folded {
            lines: BTreeMap::new(),
        };
        let text = String::from_utf8(empty.svg("t", "samples").unwrap()).unwrap();
        assert!(text.contains("no events"));
    }
}
