//! The profile as the page's script reads it: embedded once, as one JSON object of
//! tables and number arrays, whatever the number of value types.
//!
//! - `frames`: every distinct frame (a function's name as the flamegraph shows it, and
//!   whether it is user code, kernel code or a frame that is no code: a probe, a reason
//!   a stack was cut short), numbered by how many tree nodes hold it, so that the most
//!   common frames have the shortest numbers; `objects` names the files they are in.
//! - `tree`: the stacks as one prefix tree, root first, in preorder with each node's
//!   children in name order (the flamegraph's order). A number `f ≥ 0` is a child of the
//!   current node, of frame `f`, which becomes the current node; `-k` goes up `k`
//!   levels first. A stack of 500 frames shared by 100 k samples is written once, and a
//!   sample is one node number.
//! - `samples`: one per distinct (node, pid), ordered by node; node numbers as the
//!   differences from the previous one, pids as indexes into `pids`.
//! - `columns`: one per value type, with the values of the samples in that order,
//!   divided by their greatest common divisor `scale` (the period of a CPU profile's
//!   nanoseconds), dense, or as `at` (index differences) and `v` when most are zero (a
//!   heap histogram's buckets).
//!
//! Nothing in it is HTML: the page escapes `<` so that no string ends the script
//! element that holds it.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::writers::Weighting;
use crate::{heap, Frame, Profile};

/// What a frame is: the page colors them apart.
const USER: u8 = 0;
const KERNEL: u8 = 1;
/// Not code: a probe at the root of its stacks, why a stack was cut short, `[no stack]`.
const NOT_CODE: u8 = 2;

const NONE: u32 = u32::MAX;

/// The format's version, for a reader of the embedded object.
const VERSION: u32 = 1;

/// A node with more children than this finds them by hash rather than by a walk of
/// its list.
const WIDE: u32 = 16;

/// The JSON object the page reads, `<` escaped.
pub fn encode(profile: &Profile, weighting: Weighting) -> String {
    let mut frames = Frames::default();
    let mut trie = Trie::new();
    // Each location's frames, root first, named once.
    let mut located: Vec<Option<Vec<u32>>> = vec![None; profile.locations.len()];
    let probe_frames: Vec<u32> = profile
        .probes
        .iter()
        .map(|probe| frames.intern(probe.clone(), NOT_CODE, None))
        .collect();
    let mut samples: Vec<(u32, u32, usize)> = Vec::with_capacity(profile.samples.len());
    // The previous sample's start (the node above its locations) and the node after each
    // of its locations, root first: a sample shares its outer locations with most
    // others (an interpreter's hundreds of frames), found again by comparing location
    // numbers rather than by walking the tree.
    let mut previous: (u32, &[usize], Vec<u32>) = (NONE, &[], Vec::new());
    for (index, sample) in profile.samples.iter().enumerate() {
        let mut start = 0;
        if profile.probes.len() > 1 {
            start = trie.child(start, probe_frames[sample.probe]);
        }
        if let Some(reason) = &sample.truncated {
            let name = if sample.stack.is_empty() {
                format!("[{reason}]")
            } else {
                format!("[truncated: {reason}]")
            };
            start = trie.child(start, frames.intern(name, NOT_CODE, None));
        }
        let shared = if start == previous.0 {
            common_suffix(&sample.stack, previous.1)
        } else {
            0
        };
        let nodes = &mut previous.2;
        nodes.truncate(shared);
        let mut node = nodes.last().copied().unwrap_or(start);
        for &location in sample.stack.iter().rev().skip(shared) {
            let ids = located[location].get_or_insert_with(|| {
                let at = &profile.locations[location];
                let kind = if at.kernel { KERNEL } else { USER };
                at.frames
                    .iter()
                    .rev()
                    .map(|frame| frames.intern(name(frame, weighting), kind, at.mapping))
                    .collect()
            });
            for &frame in ids.iter() {
                node = trie.child(node, frame);
            }
            nodes.push(node);
        }
        previous.0 = start;
        previous.1 = &sample.stack;
        if node == 0 {
            node = trie.child(node, frames.intern("[no stack]".into(), NOT_CODE, None));
        }
        samples.push((node, sample.pid, index));
    }

    // Frame numbers by use, most used first; children in name order.
    let frame_count = frames.names.len();
    let mut uses = vec![0u32; frame_count];
    for &frame in &trie.frame[1..] {
        uses[frame as usize] += 1;
    }
    let mut by_use: Vec<u32> = (0..frame_count as u32).collect();
    by_use.sort_by(|&a, &b| {
        uses[b as usize]
            .cmp(&uses[a as usize])
            .then_with(|| frames.names[a as usize].cmp(&frames.names[b as usize]))
            .then(a.cmp(&b))
    });
    let mut frame_number = vec![0u32; frame_count];
    for (new, &old) in by_use.iter().enumerate() {
        frame_number[old as usize] = new as u32;
    }
    let mut by_name: Vec<u32> = (0..frame_count as u32).collect();
    by_name.sort_by(|&a, &b| {
        let (a, b) = (a as usize, b as usize);
        frames.names[a]
            .cmp(&frames.names[b])
            .then(frames.kinds[a].cmp(&frames.kinds[b]))
    });
    let mut rank = vec![0u32; frame_count];
    for (position, &frame) in by_name.iter().enumerate() {
        rank[frame as usize] = position as u32;
    }
    let (order, preorder_id, depth) = trie.preorder(&rank);

    let mut json = String::with_capacity(64 + 8 * order.len() + 16 * samples.len());
    let _ = write!(json, "{{\"version\":{VERSION},\"values\":[");
    for (index, value_type) in profile.value_types.iter().enumerate() {
        if index > 0 {
            json.push(',');
        }
        let _ = write!(
            json,
            "{{\"kind\":{},\"unit\":{},\"name\":{},\"flame\":{},\"main\":{}}}",
            string(&value_type.kind),
            string(&value_type.unit),
            string(&value_type.describe()),
            super::drawn_as_flamegraph(&value_type.kind),
            super::main_value(profile, &value_type.kind)
        );
    }
    let _ = write!(json, "],\"initial\":{},", weighting.value);

    json.push_str("\"frames\":{\"name\":[");
    list(&mut json, by_use.iter(), |json, &old| {
        json.push_str(&string(&frames.names[old as usize]))
    });
    json.push_str("],\"kind\":[");
    list(&mut json, by_use.iter(), |json, &old| {
        number(json, i64::from(frames.kinds[old as usize]));
    });
    json.push_str("],\"object\":[");
    list(&mut json, by_use.iter(), |json, &old| {
        match frames.objects[old as usize] {
            Some(mapping) => {
                let _ = write!(json, "{mapping}");
            }
            None => json.push_str("-1"),
        }
    });
    json.push_str("]},\"objects\":[");
    list(&mut json, profile.mappings.iter(), |json, mapping| {
        json.push_str(&string(&mapping.path))
    });

    // The tree, root excluded (the page makes it: "all").
    json.push_str("],\"tree\":[");
    let mut current = 0u32;
    let mut first = true;
    for &old in &order[1..] {
        let node_depth = depth[old as usize];
        let up = current + 1 - node_depth;
        if !first {
            json.push(',');
        }
        first = false;
        if up > 0 {
            number(&mut json, -i64::from(up));
            json.push(',');
        }
        number(
            &mut json,
            i64::from(frame_number[trie.frame[old as usize] as usize]),
        );
        current = node_depth;
    }

    // Samples, merged by (node, pid).
    samples.sort_unstable_by_key(|&(node, pid, index)| (preorder_id[node as usize], pid, index));
    let mut pids: Vec<u32> = samples.iter().map(|&(_, pid, _)| pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let mut runs: Vec<(u32, u32, std::ops::Range<usize>)> = Vec::new();
    for (position, &(node, pid, _)) in samples.iter().enumerate() {
        let node = preorder_id[node as usize];
        match runs.last_mut() {
            Some(run) if run.0 == node && run.1 == pid => run.2.end = position + 1,
            _ => runs.push((node, pid, position..position + 1)),
        }
    }
    json.push_str("],\"samples\":{\"node\":[");
    let mut previous = 0u32;
    list(&mut json, runs.iter(), |json, run| {
        number(json, i64::from(run.0 - previous));
        previous = run.0;
    });
    json.push(']');
    if pids.len() > 1 {
        json.push_str(",\"pid\":[");
        list(&mut json, runs.iter(), |json, run| {
            let index = pids.binary_search(&run.1).unwrap_or(0);
            let _ = write!(json, "{index}");
        });
        json.push(']');
    }
    json.push_str("},\"pids\":[");
    list(&mut json, pids.iter(), |json, pid| {
        let _ = write!(json, "{pid}");
    });
    let _ = write!(
        json,
        "],\"mergedProcesses\":{},\"columns\":[",
        profile.summary.merged_processes
    );
    // The values other than 0 of each column, by run, in one pass over the samples (a
    // sample's values are together; a column's are not).
    let mut nonzero: Vec<Vec<(u32, i64)>> = vec![Vec::new(); profile.value_types.len()];
    for (position, run) in runs.iter().enumerate() {
        let mut sums = samples[run.2.clone()]
            .iter()
            .map(|&(_, _, sample)| &profile.samples[sample].values);
        let first = sums.next().expect("a run has a sample");
        let mut row;
        let values: &[i64] = match sums.next() {
            None => first,
            Some(second) => {
                row = first.clone();
                for more in std::iter::once(second).chain(sums) {
                    for (sum, value) in row.iter_mut().zip(more) {
                        *sum += value;
                    }
                }
                &row
            }
        };
        for (column, &value) in nonzero.iter_mut().zip(values) {
            if value != 0 {
                column.push((position as u32, value));
            }
        }
    }
    for (index, values) in nonzero.iter().enumerate() {
        if index > 0 {
            json.push(',');
        }
        column(&mut json, values, runs.len());
    }

    let metadata = &profile.metadata;
    let _ = write!(
        json,
        "],\"durationMs\":{},\"timeline\":[",
        milliseconds(metadata.duration)
    );
    list(&mut json, metadata.timeline.iter(), |json, point| {
        let _ = write!(json, "[{},{}]", milliseconds(point.at), point.walks);
    });
    json.push_str("],\"heap\":");
    match &profile.heap {
        None => json.push_str("null"),
        Some(heap) => {
            json.push_str("{\"timeline\":[");
            list(&mut json, heap.timeline.iter(), |json, p| {
                let _ = write!(
                    json,
                    "[{},{},{},{},{}]",
                    milliseconds(p.at),
                    p.live_bytes,
                    p.allocs,
                    p.frees,
                    p.rss_bytes
                );
            });
            json.push_str("],\"processes\":[");
            list(&mut json, heap.processes.iter(), |json, p| {
                let _ = write!(
                    json,
                    "{{\"pid\":{},\"allocs\":{},\"bytes\":{},\"frees\":{},\"freed\":{},\
                     \"live\":{},\"peak\":{}}}",
                    p.pid, p.allocs, p.bytes, p.frees, p.freed_bytes, p.live_bytes, p.peak_bytes
                );
            });
            let _ = write!(
                json,
                "],\"temporaryMs\":{},\"buckets\":{}}}",
                milliseconds(heap.temporary_threshold),
                heap::BUCKETS
            );
        }
    }
    json.push('}');
    json.replace('<', "\\u003c")
}

/// A frame as the flamegraph names it: its function, with its source line when lines
/// are asked for (each line of a function is then its own frame, as in folded output).
fn name(frame: &Frame, weighting: Weighting) -> String {
    match (&frame.file, frame.line, weighting.line_numbers) {
        (Some(file), Some(line), true) => format!("{} ({file}:{line})", frame.function),
        _ => frame.function.clone(),
    }
}

/// A column of `length` values, given by those other than 0 (position, value): dense,
/// or sparse when most are 0; divided by their greatest common divisor.
fn column(json: &mut String, nonzero: &[(u32, i64)], length: usize) {
    let scale = nonzero
        .iter()
        .fold(0u64, |g, &(_, v)| gcd(g, v.unsigned_abs()))
        .max(1);
    let scale = i64::try_from(scale).unwrap_or(1);
    let _ = write!(json, "{{\"scale\":{scale},");
    if nonzero.len() * 3 >= length {
        json.push_str("\"dense\":[");
        let mut next = nonzero.iter().peekable();
        list(json, 0..length as u32, |json, position| {
            match next.next_if(|&&(at, _)| at == position) {
                Some((_, value)) => number(json, value / scale),
                None => json.push('0'),
            }
        });
        json.push_str("]}");
    } else {
        let mut previous = 0;
        json.push_str("\"at\":[");
        list(json, nonzero.iter(), |json, &(position, _)| {
            number(json, i64::from(position - previous));
            previous = position;
        });
        json.push_str("],\"v\":[");
        list(json, nonzero.iter(), |json, &(_, value)| {
            number(json, value / scale)
        });
        json.push_str("]}");
    }
}

/// An integer in decimal (the formatting machinery is slow for millions of them).
fn number(json: &mut String, value: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        json.push('-');
    }
    json.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
}

/// The length of the longest common suffix of `a` and `b` (the stacks' outer locations),
/// by bisection over slice comparisons.
fn common_suffix(a: &[usize], b: &[usize]) -> usize {
    let same = |n: usize| a[a.len() - n..] == b[b.len() - n..];
    let longest = a.len().min(b.len());
    if same(longest) {
        return longest;
    }
    // same(low) holds, same(high) does not.
    let (mut low, mut high) = (0, longest);
    while high - low > 1 {
        let middle = (low + high) / 2;
        if same(middle) {
            low = middle;
        } else {
            high = middle;
        }
    }
    low
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Milliseconds, to the microsecond.
fn milliseconds(duration: std::time::Duration) -> String {
    let micros = duration.as_micros();
    if micros.is_multiple_of(1000) {
        (micros / 1000).to_string()
    } else {
        format!("{}.{:03}", micros / 1000, micros % 1000)
    }
}

/// Items written by `each`, comma-separated.
fn list<T>(
    json: &mut String,
    items: impl Iterator<Item = T>,
    mut each: impl FnMut(&mut String, T),
) {
    for (index, item) in items.enumerate() {
        if index > 0 {
            json.push(',');
        }
        each(json, item);
    }
}

fn string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// Distinct frames by (name, kind), with the object of the first location that held
/// each.
#[derive(Default)]
struct Frames {
    ids: HashMap<(String, u8), u32>,
    names: Vec<String>,
    kinds: Vec<u8>,
    objects: Vec<Option<usize>>,
}

impl Frames {
    fn intern(&mut self, name: String, kind: u8, object: Option<usize>) -> u32 {
        let key = (name, kind);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = u32::try_from(self.names.len()).expect("fewer than 2^32 frames");
        self.names.push(key.0.clone());
        self.kinds.push(kind);
        self.objects.push(object);
        self.ids.insert(key, id);
        id
    }
}

/// The stacks' prefix tree: node 0 is the root above every stack. A node's children
/// are a linked list, and by hash as well once there are many of them.
struct Trie {
    frame: Vec<u32>,
    parent: Vec<u32>,
    first_child: Vec<u32>,
    next_sibling: Vec<u32>,
    children: Vec<u32>,
    wide: HashMap<(u32, u32), u32>,
}

impl Trie {
    fn new() -> Trie {
        Trie {
            frame: vec![NONE],
            parent: vec![NONE],
            first_child: vec![NONE],
            next_sibling: vec![NONE],
            children: vec![0],
            wide: HashMap::new(),
        }
    }

    /// The child of `node` of frame `frame`, made if there is none.
    fn child(&mut self, node: u32, frame: u32) -> u32 {
        let at = node as usize;
        if self.children[at] > WIDE {
            if let Some(&child) = self.wide.get(&(node, frame)) {
                return child;
            }
        } else {
            let mut child = self.first_child[at];
            while child != NONE {
                if self.frame[child as usize] == frame {
                    return child;
                }
                child = self.next_sibling[child as usize];
            }
        }
        let child = u32::try_from(self.frame.len()).expect("fewer than 2^32 tree nodes");
        self.frame.push(frame);
        self.parent.push(node);
        self.first_child.push(NONE);
        self.next_sibling.push(self.first_child[at]);
        self.children.push(0);
        self.first_child[at] = child;
        self.children[at] += 1;
        if self.children[at] == WIDE + 1 {
            let mut sibling = child;
            while sibling != NONE {
                self.wide
                    .insert((node, self.frame[sibling as usize]), sibling);
                sibling = self.next_sibling[sibling as usize];
            }
        } else if self.children[at] > WIDE + 1 {
            self.wide.insert((node, frame), child);
        }
        child
    }

    /// The nodes in preorder with children by `rank` of their frames; each node's
    /// position in it; each node's depth (the root's is 0).
    fn preorder(&self, rank: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let count = self.frame.len();
        let mut order = Vec::with_capacity(count);
        let mut position = vec![0u32; count];
        let mut depth = vec![0u32; count];
        let mut pending = vec![0u32];
        let mut children = Vec::new();
        while let Some(node) = pending.pop() {
            position[node as usize] = order.len() as u32;
            order.push(node);
            children.clear();
            let mut child = self.first_child[node as usize];
            while child != NONE {
                depth[child as usize] = depth[node as usize] + 1;
                children.push(child);
                child = self.next_sibling[child as usize];
            }
            // Last in name order first: the first is popped first.
            children.sort_unstable_by_key(|&c| {
                std::cmp::Reverse(rank[self.frame[c as usize] as usize])
            });
            pending.extend_from_slice(&children);
        }
        (order, position, depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writers::tests::example;
    use serde_json::Value;

    /// Each sample's frames, root first, as the page decodes the embedded tree.
    fn decoded_stacks(data: &Value) -> Vec<(Vec<String>, u64)> {
        let names: Vec<&str> = data["frames"]["name"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let mut paths: Vec<Vec<String>> = vec![vec![]];
        let mut current: Vec<usize> = vec![0];
        for item in data["tree"].as_array().unwrap() {
            let item = item.as_i64().unwrap();
            if item < 0 {
                current.truncate(current.len() - (-item) as usize);
                continue;
            }
            let mut path = paths[*current.last().unwrap()].clone();
            path.push(names[item as usize].to_string());
            current.push(paths.len());
            paths.push(path);
        }
        let mut node = 0;
        let events = &data["columns"][0];
        let scale = events["scale"].as_u64().unwrap();
        data["samples"]["node"]
            .as_array()
            .unwrap()
            .iter()
            .zip(events["dense"].as_array().unwrap())
            .map(|(delta, value)| {
                node += delta.as_u64().unwrap() as usize;
                (paths[node].clone(), value.as_u64().unwrap() * scale)
            })
            .collect()
    }

    #[test]
    fn the_tree_holds_every_stack_once() {
        let profile = example();
        let json = encode(&profile, Weighting::default());
        let data: Value = serde_json::from_str(&json).unwrap();
        let stacks = decoded_stacks(&data);
        // As the folded output has them, probe first, each with its own events.
        let mut folded: Vec<(String, u64)> = stacks
            .iter()
            .map(|(path, events)| (path.join(";"), *events))
            .collect();
        folded.sort();
        assert_eq!(
            folded,
            [
                ("profile:hz:99".to_string(), 1),
                (
                    "profile:hz:99;__libc_start_call_main;demo::main;demo::work;\
                     demo::inlined_helper;do_syscall_64"
                        .to_string(),
                    3
                ),
                ("uprobe:libc:malloc;[truncated: read fault];demo::main;<[u8; 4] as demo::Fill>::fill".to_string(), 2),
                ("uprobe:libc:malloc;__libc_start_call_main;demo::main".to_string(), 0),
                (
                    "uprobe:libc:malloc;__libc_start_call_main;demo::main;demo::work;\
                     demo::inlined_helper"
                        .to_string(),
                    5
                ),
            ]
        );
        // The sample of no stack is its probe's node itself.
        assert_eq!(stacks.iter().filter(|(p, _)| p.len() == 1).count(), 1);
        // The kernel frame is marked as kernel code, the probes as no code.
        let names = data["frames"]["name"].as_array().unwrap();
        let kind = |name: &str| {
            let index = names.iter().position(|n| n == name).unwrap();
            data["frames"]["kind"][index].as_u64().unwrap()
        };
        assert_eq!(kind("do_syscall_64"), u64::from(KERNEL));
        assert_eq!(kind("demo::main"), u64::from(USER));
        assert_eq!(kind("profile:hz:99"), u64::from(NOT_CODE));
        // Bytes: one sample of five has none, dense still; its scale is 1 (500, 64, 7).
        assert_eq!(data["columns"][1]["scale"], 1);
    }

    #[test]
    fn sparse_columns_and_common_divisors() {
        let mut json = String::new();
        column(&mut json, &[(2, 30), (6, 90)], 10);
        assert_eq!(json, "{\"scale\":30,\"at\":[2,4],\"v\":[1,3]}");
        json.clear();
        column(&mut json, &[(0, 10_101_010), (1, -20_202_020)], 3);
        assert_eq!(json, "{\"scale\":10101010,\"dense\":[1,-2,0]}");
        json.clear();
        column(&mut json, &[], 2);
        assert_eq!(json, "{\"scale\":1,\"at\":[],\"v\":[]}");
    }

    #[test]
    fn common_suffixes() {
        assert_eq!(common_suffix(&[1, 2, 3], &[9, 2, 3]), 2);
        assert_eq!(common_suffix(&[1, 2, 3], &[1, 2, 3]), 3);
        assert_eq!(common_suffix(&[2, 3], &[1, 2, 3]), 2);
        assert_eq!(common_suffix(&[1, 2, 4], &[1, 2, 3]), 0);
        assert_eq!(common_suffix(&[], &[1]), 0);
    }

    #[test]
    fn wide_nodes_find_their_children_by_hash() {
        let mut trie = Trie::new();
        let children: Vec<u32> = (0..100).map(|frame| trie.child(0, frame)).collect();
        for (frame, &child) in children.iter().enumerate() {
            assert_eq!(trie.child(0, frame as u32), child);
        }
        assert_eq!(trie.frame.len(), 101);
    }

    #[test]
    fn nothing_in_it_ends_its_script_element() {
        let mut profile = example();
        profile.locations[1].frames[0].function = "</script><b>".into();
        let json = encode(&profile, Weighting::default());
        assert!(!json.contains('<'), "{json}");
        let data: Value = serde_json::from_str(&json).unwrap();
        assert!(data["frames"]["name"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "</script><b>"));
    }
}
