//! A heap profile as a heaptrack data file, for `heaptrack_print` and heaptrack_gui.
//!
//! heaptrack's file is a line format (what `heaptrack_interpret` writes, what
//! `AccumulatedTraceData` reads): `s` strings, `i` instruction pointers (module, then
//! function, file and line, then the frames inlined there, innermost first), `t` trace
//! nodes (an instruction pointer and the parent node: stacks as a tree from the root),
//! `a` allocation infos (a size and a trace), then the event stream: `+ INFO` for an
//! allocation, `- INFO` for the free of a block allocated with that info, `c` timestamps
//! (milliseconds), `R` resident pages. All numbers are hex; strings carry their length
//! (file format 3). Indexes of strings, pointers and traces count from 1 in the order of
//! their lines, infos from 0. heaptrack reads the file by its name: `.zst` is zstd,
//! `.gz` gzip, anything else plain text; [`Compression::for_path`] follows it.
//!
//! heaptrack computes its figures by replaying the stream: calls are the `+` lines,
//! leaked bytes what is live at the end, the peak the most ever live (and each
//! stack's share of it, what was live when the total first reached it), a temporary a
//! `-` right after the `+` of its own info. cargo-trace keeps per-stack totals, not the
//! events, so the stream is synthesized ([`stream::plan`]) to replay into the same figures:
//! - exact: each stack's allocations, bytes, frees; leaked blocks and bytes per stack
//!   and in total; the peak, and each stack's live bytes at it, when the stack's blocks
//!   can be split into the bytes live at the peak and the rest (always, unless one
//!   block must carry both); temporaries, except those that were live at the peak (of
//!   those, at most one replays as a temporary), and except a block that is not one but
//!   must be alone between its allocation and its free (no two fit below the peak, or
//!   the peak was one block): it replays as one;
//! - synthesized: the order of events and their timestamps (blocks that are freed come
//!   before the peak, the peak is placed at the heap timeline's highest point, the
//!   leaks after it); the sizes of single blocks (a stack's bytes split evenly among
//!   its blocks of one kind: exact when they had one size, as most sites do);
//! - left out: frees of unknown blocks (heaptrack never subtracts them either); blocks
//!   the live map could not track are freed where they cannot move the peak or the
//!   leaks; the frames of the allocator itself (heaptrack's stacks start at its caller);
//!   processes but one (a heaptrack file is one process: the target, or the process that
//!   allocated most if the target allocated nothing). A sampled profile's estimates are
//!   written as counted events, rounded.

mod stream;

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use crate::heap as alloc;
use crate::{HeapProcess, Profile, Sample};
use stream::{plan, BlockKey, Event, StackFigures, Step};

/// heaptrack's version (1.4.0) and file format (3: sized strings) the file claims.
const HEAPTRACK_VERSION: u32 = 0x010400;
const FILE_FORMAT: u32 = 3;
const PAGE_SIZE: u64 = 4096;

/// How the file is compressed: as heaptrack expects from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Zstd,
    Gzip,
    Plain,
}

impl Compression {
    /// `.zst`: zstd, `.gz`: gzip, anything else: plain text (heaptrack reads a file by
    /// its extension).
    pub fn for_path(path: &Path) -> Compression {
        match path.extension().and_then(|e| e.to_str()) {
            Some("zst") => Compression::Zstd,
            Some("gz") => Compression::Gzip,
            _ => Compression::Plain,
        }
    }
}

pub fn write(profile: &Profile, compression: Compression, out: &mut dyn Write) -> io::Result<()> {
    // The events are expanded as they are compressed: a file can hold far more lines
    // than the profile has stacks.
    let mut text = render(profile)?;
    match compression {
        Compression::Plain => io::copy(&mut text, out).map(|_| ()),
        Compression::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            io::copy(&mut text, &mut encoder)?;
            encoder.finish().map(|_| ())
        }
        Compression::Zstd => {
            // ruzstd panics on a failing writer: it writes to memory, then to `out`.
            let mut compressed = Vec::new();
            ruzstd::encoding::compress(
                text,
                &mut compressed,
                ruzstd::encoding::CompressionLevel::Fastest,
            );
            out.write_all(&compressed)
        }
    }
}

/// The text of the file (before compression), read as it is generated.
struct Text {
    buffer: Vec<u8>,
    read: usize,
    events: Box<dyn Iterator<Item = Event>>,
    /// Allocation info of each block key.
    infos: HashMap<BlockKey, usize>,
    peak_ms: u64,
    /// The lines after the events.
    tail: Option<Vec<u8>>,
}

impl io::Read for Text {
    fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
        if self.read == self.buffer.len() {
            self.buffer.clear();
            self.read = 0;
            while self.buffer.len() < 1 << 16 {
                match self.events.next() {
                    Some(Event::Alloc(key)) => writeln!(self.buffer, "+ {:x}", self.infos[&key])?,
                    Some(Event::Free(key)) => writeln!(self.buffer, "- {:x}", self.infos[&key])?,
                    Some(Event::PeakTime) => writeln!(self.buffer, "c {:x}", self.peak_ms)?,
                    None => {
                        if let Some(tail) = self.tail.take() {
                            self.buffer.extend_from_slice(&tail);
                        }
                        break;
                    }
                }
            }
        }
        let n = into.len().min(self.buffer.len() - self.read);
        into[..n].copy_from_slice(&self.buffer[self.read..self.read + n]);
        self.read += n;
        Ok(n)
    }
}

fn render(profile: &Profile) -> io::Result<Text> {
    let heap = profile.heap.as_ref().ok_or_else(|| {
        io::Error::other("no heap profile to write for heaptrack (trace with the alloc probe)")
    })?;
    let mut out = Vec::new();
    writeln!(out, "v {HEAPTRACK_VERSION:x} {FILE_FORMAT:x}")?;
    writeln!(
        out,
        "# written by cargo-trace from per-stack totals: the event order, timestamps and \
         single block sizes are synthesized"
    )?;
    let debuggee = match &profile.metadata.command {
        Some(argv) => argv.join(" "),
        None => profile.metadata.executable.clone().unwrap_or_default(),
    };
    writeln!(out, "X {}", one_line(&debuggee))?;
    if profile.metadata.command.is_none() {
        // heaptrack's mark of a run attached to a running process.
        writeln!(out, "A")?;
    }
    let rss_pages = heap
        .timeline
        .iter()
        .map(|p| p.rss_bytes.div_ceil(PAGE_SIZE))
        .max()
        .unwrap_or(0);
    writeln!(out, "I {PAGE_SIZE:x} {:x}", physical_pages())?;

    let mut text = Text {
        buffer: Vec::new(),
        read: 0,
        events: Box::new(std::iter::empty()),
        infos: HashMap::new(),
        peak_ms: 0,
        tail: None,
    };
    let Some(process) = chosen_process(profile, &heap.processes) else {
        writeln!(out, "c 0")?;
        text.buffer = out;
        return Ok(text);
    };
    let samples: Vec<&Sample> = profile
        .samples
        .iter()
        .filter(|s| s.pid == process.pid && s.probe == process.probe)
        .filter(|s| figures(profile, s).allocs > 0)
        .collect();
    let stacks: Vec<StackFigures> = samples.iter().map(|s| figures(profile, s)).collect();

    let mut tables = Tables::default();
    let traces: Vec<u64> = samples.iter().map(|s| tables.trace(profile, s)).collect();
    out.extend_from_slice(&tables.lines);

    let steps = plan(&stacks, process.peak_bytes.max(0) as u64);
    // Allocation info 0 is never used: heaptrack takes a `-` of info 0 right after
    // another `-` for a temporary.
    writeln!(out, "a 0 {:x}", traces.first().copied().unwrap_or(0))?;
    for key in steps.iter().flat_map(Step::keys) {
        if !text.infos.contains_key(&key) {
            text.infos.insert(key, text.infos.len() + 1);
            writeln!(out, "a {:x} {:x}", key.size, traces[key.stack])?;
        }
    }

    let duration_ms = profile.metadata.duration.as_millis() as u64;
    text.peak_ms = heap
        .timeline
        .iter()
        .max_by_key(|p| p.live_bytes)
        .map_or(duration_ms / 2, |p| p.at.as_millis() as u64)
        .min(duration_ms);
    writeln!(out, "c 0")?;
    if rss_pages > 0 {
        writeln!(out, "R {rss_pages:x}")?;
    }
    text.buffer = out;
    text.events = Box::new(steps.into_iter().flat_map(Step::events));
    if duration_ms > text.peak_ms {
        text.tail = Some(format!("c {duration_ms:x}\n").into_bytes());
    }
    Ok(text)
}

/// The target's heap if it has one, else the process that allocated most.
fn chosen_process<'a>(profile: &Profile, processes: &'a [HeapProcess]) -> Option<&'a HeapProcess> {
    processes
        .iter()
        .filter(|p| p.pid == profile.metadata.pid && p.allocs > 0)
        .max_by_key(|p| p.allocs)
        .or_else(|| processes.iter().max_by_key(|p| p.allocs))
}

fn figures(profile: &Profile, sample: &Sample) -> StackFigures {
    let value = |kind: &str| -> u64 {
        profile
            .value_index(kind)
            .map_or(0, |index| sample.values[index].max(0) as u64)
    };
    StackFigures {
        allocs: value(alloc::ALLOCS),
        bytes: value(alloc::ALLOC_SPACE),
        frees: value(alloc::FREES),
        freed_bytes: value(alloc::FREED_SPACE),
        leaked_blocks: value(alloc::LEAKED_BLOCKS),
        leaked_bytes: value(alloc::LEAKED_BYTES),
        temporaries: value(alloc::TEMPORARIES),
        peak_bytes: value(alloc::PEAK_BYTES),
    }
}

/// A string as one line of the file (heaptrack reads a line at a time).
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// The machine's memory in pages, for heaptrack's system line.
fn physical_pages() -> u64 {
    // SAFETY: sysconf only reads a system setting.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    pages.max(0) as u64
}

/// The string, instruction pointer and trace lines, each written once, in an order
/// where every index is defined before it is used.
#[derive(Default)]
struct Tables {
    lines: Vec<u8>,
    strings: HashMap<String, usize>,
    /// Location id → instruction pointer index.
    ips: HashMap<usize, usize>,
    /// (instruction pointer, parent trace) → trace index.
    traces: HashMap<(usize, usize), usize>,
}

impl Tables {
    fn string(&mut self, text: &str) -> usize {
        let text = one_line(text);
        if let Some(&index) = self.strings.get(&text) {
            return index;
        }
        let index = self.strings.len() + 1;
        // Writing to a Vec cannot fail.
        let _ = writeln!(self.lines, "s {:x} {text}", text.len());
        self.strings.insert(text, index);
        index
    }

    fn ip(&mut self, profile: &Profile, location: usize) -> usize {
        if let Some(&index) = self.ips.get(&location) {
            return index;
        }
        let found = &profile.locations[location];
        let module = found
            .mapping
            .map_or(0, |m| self.string(&profile.mappings[m].path));
        let mut line = format!("i {:x} {module:x}", found.address);
        for frame in &found.frames {
            let function = self.string(&frame.function);
            let file = frame.file.as_deref().map_or(0, |f| self.string(f));
            line.push_str(&format!(
                " {function:x} {file:x} {:x}",
                frame.line.unwrap_or(0)
            ));
        }
        let _ = writeln!(self.lines, "{line}");
        let index = self.ips.len() + 1;
        self.ips.insert(location, index);
        index
    }

    /// The trace of a heap sample's stack, without its innermost user location: the
    /// allocating function's entry, where heaptrack's own stacks start at its caller.
    fn trace(&mut self, profile: &Profile, sample: &Sample) -> u64 {
        let user: Vec<usize> = sample
            .stack
            .iter()
            .copied()
            .filter(|&id| !profile.locations[id].kernel)
            .collect();
        let mut parent = 0;
        for &location in user.iter().skip(1).rev() {
            let ip = self.ip(profile, location);
            parent = match self.traces.get(&(ip, parent)) {
                Some(&index) => index,
                None => {
                    let index = self.traces.len() + 1;
                    let _ = writeln!(self.lines, "t {ip:x} {parent:x}");
                    self.traces.insert((ip, parent), index);
                    index
                }
            };
        }
        parent as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::{golden, heap_example};

    #[test]
    fn the_file_in_every_compression() {
        let profile = heap_example();
        let mut plain = Vec::new();
        write(&profile, Compression::Plain, &mut plain).unwrap();
        let text = String::from_utf8(plain.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "v 10400 3");
        assert!(lines.contains(&"X ./demo arg"), "{text}");
        // Sized strings, a pointer with its inlined frame (innermost first), the trace
        // from the root, without the innermost location (the allocator's entry).
        assert!(lines.contains(&"s a /work/demo"), "{text}");
        assert!(lines.contains(&"s 14 demo::inlined_helper"), "{text}");
        let inlined = lines
            .iter()
            .find(|l| l.starts_with("i 555555551234 "))
            .unwrap();
        assert_eq!(inlined.split(' ').count(), 3 + 2 * 3, "{inlined}");
        assert!(!text.contains("malloc"), "{text}");
        let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("+ "), 15, "{text}");
        assert_eq!(count("- "), 14, "{text}");
        assert!(lines.contains(&"t 1 0"), "{text}");
        let replayed_peak = {
            let infos: Vec<u64> = lines
                .iter()
                .filter_map(|l| l.strip_prefix("a "))
                .map(|l| u64::from_str_radix(l.split(' ').next().unwrap(), 16).unwrap())
                .collect();
            let (mut live, mut peak) = (0u64, 0u64);
            for line in &lines {
                if let Some(i) = line.strip_prefix("+ ") {
                    live += infos[usize::from_str_radix(i, 16).unwrap()];
                    peak = peak.max(live);
                } else if let Some(i) = line.strip_prefix("- ") {
                    live -= infos[usize::from_str_radix(i, 16).unwrap()];
                }
            }
            assert_eq!(live, 100, "leaked");
            peak
        };
        assert_eq!(replayed_peak, 300);

        let mut gz = Vec::new();
        write(&profile, Compression::Gzip, &mut gz).unwrap();
        let mut unzipped = Vec::new();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut unzipped).unwrap();
        assert_eq!(unzipped, plain);
        let mut zst = Vec::new();
        write(&profile, Compression::Zstd, &mut zst).unwrap();
        let mut decoded = Vec::new();
        io::Read::read_to_end(
            &mut ruzstd::decoding::StreamingDecoder::new(&zst[..]).unwrap(),
            &mut decoded,
        )
        .unwrap();
        assert_eq!(decoded, plain);
    }

    #[test]
    fn a_profile_without_heap_is_an_error() {
        let error = write(
            &crate::writers::tests::example(),
            Compression::Plain,
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(error.to_string().contains("alloc probe"), "{error}");
    }

    #[test]
    fn a_string_is_one_line_written_once() {
        let mut tables = Tables::default();
        assert_eq!(tables.string("a\nb"), 1);
        assert_eq!(tables.string("a b"), 1);
        assert_eq!(tables.string("a\nb"), 1);
        assert_eq!(tables.string("c"), 2);
        assert_eq!(String::from_utf8_lossy(&tables.lines), "s 3 a b\ns 1 c\n");
    }

    #[test]
    fn compression_follows_the_name() {
        assert_eq!(Compression::for_path(Path::new("h.zst")), Compression::Zstd);
        assert_eq!(
            Compression::for_path(Path::new("a/h.gz")),
            Compression::Gzip
        );
        assert_eq!(
            Compression::for_path(Path::new("h.txt")),
            Compression::Plain
        );
    }

    /// The heap example as heaptrack reads it; the machine's memory (the `I` line) is
    /// the writing machine's, so it is left out of the comparison.
    #[test]
    fn golden_heaptrack() {
        let mut plain = Vec::new();
        write(&heap_example(), Compression::Plain, &mut plain).unwrap();
        let text = String::from_utf8(plain).unwrap();
        let portable: String = text
            .lines()
            .filter(|line| !line.starts_with("I "))
            .map(|line| format!("{line}\n"))
            .collect();
        golden("heap.heaptrack", portable.as_bytes());
    }
}
