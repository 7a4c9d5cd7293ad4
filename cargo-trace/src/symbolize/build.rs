//! Raw samples (stacks as a collector counted them) → a symbolized [`Profile`]: each
//! distinct address symbolized once, identical symbolized stacks merged.

use std::collections::HashMap;
use std::path::PathBuf;

use profile::{
    Frame, Location, LocationId, Mapping, MappingId, Metadata, Profile, Sample, Summary, ValueType,
};

use super::{MappingSource, Symbolizer};
use crate::frame::UserFrame;

/// A stack as a collector counted it, with its values, before symbolization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSample {
    pub probe: usize,
    pub pid: u32,
    /// User frames, innermost first; `user[0]` is the pc of the event, the others
    /// return addresses.
    pub user: Vec<UserFrame>,
    pub truncated: Option<String>,
    /// Kernel addresses, innermost first.
    pub kernel: Vec<u64>,
    pub values: Vec<i64>,
}

/// Builds a [`Profile`] from raw samples, symbolizing each distinct address once.
pub struct ProfileBuilder<'a> {
    symbolizer: &'a mut Symbolizer,
    profile: Profile,
    /// (pid, frame, is return address) → location; pid 0 for the frames that are
    /// objects' addresses, the same in every process.
    user_locations: HashMap<(u32, UserFrame, bool), LocationId>,
    kernel_locations: HashMap<u64, LocationId>,
    kernel_frames: HashMap<u64, Frame>,
    mappings: HashMap<Mapping, MappingId>,
    build_ids: HashMap<PathBuf, Option<String>>,
    /// Identical symbolized stacks of one probe and process are merged.
    merged: HashMap<(usize, u32, Vec<LocationId>, Option<String>), usize>,
}

impl<'a> ProfileBuilder<'a> {
    pub fn new(symbolizer: &'a mut Symbolizer, value_types: Vec<ValueType>) -> Self {
        ProfileBuilder {
            symbolizer,
            profile: Profile {
                value_types,
                ..Profile::default()
            },
            user_locations: HashMap::new(),
            kernel_locations: HashMap::new(),
            kernel_frames: HashMap::new(),
            mappings: HashMap::new(),
            build_ids: HashMap::new(),
            merged: HashMap::new(),
        }
    }

    /// Adds one raw sample; one with the same locations, probe, process and truncation as
    /// an earlier one is added to it.
    pub fn add(&mut self, raw: &RawSample) {
        assert_eq!(raw.values.len(), self.profile.value_types.len());
        let mut stack = Vec::with_capacity(raw.kernel.len() + raw.user.len());
        // The BPF program and the code that runs it are not the traced code: kernel
        // stacks start at the first frame outside that machinery.
        let mut in_machinery = true;
        for &address in &raw.kernel {
            if let Some(location) = self.kernel_location(address, &mut in_machinery) {
                stack.push(location);
            }
        }
        for (depth, &address) in raw.user.iter().enumerate() {
            stack.push(self.user_location(raw.pid, address, depth > 0));
        }
        let key = (raw.probe, raw.pid, stack, raw.truncated.clone());
        match self.merged.get(&key) {
            Some(&index) => {
                let sample = &mut self.profile.samples[index];
                for (total, value) in sample.values.iter_mut().zip(&raw.values) {
                    *total += value;
                }
            }
            None => {
                self.merged.insert(key.clone(), self.profile.samples.len());
                let (probe, pid, stack, truncated) = key;
                self.profile.samples.push(Sample {
                    probe,
                    pid,
                    stack,
                    truncated,
                    values: raw.values.clone(),
                });
            }
        }
    }

    /// The profile, with the probes, summary and metadata given.
    pub fn finish(self, probes: Vec<String>, summary: Summary, metadata: Metadata) -> Profile {
        Profile {
            probes,
            summary,
            metadata,
            ..self.profile
        }
    }

    fn kernel_location(&mut self, address: u64, in_machinery: &mut bool) -> Option<LocationId> {
        let frame = match self.kernel_frames.get(&address) {
            Some(frame) => frame.clone(),
            None => {
                let frame = self.symbolizer.kernel(address);
                self.kernel_frames.insert(address, frame.clone());
                frame
            }
        };
        if *in_machinery && is_bpf_machinery(&frame.function) {
            return None;
        }
        *in_machinery = false;
        if let Some(&id) = self.kernel_locations.get(&address) {
            return Some(id);
        }
        let id = self.push_location(Location {
            address,
            mapping: None,
            frames: vec![frame],
            kernel: true,
        });
        self.kernel_locations.insert(address, id);
        Some(id)
    }

    fn user_location(&mut self, pid: u32, frame: UserFrame, is_return_address: bool) -> LocationId {
        // A frame stored as an object's address is one location for every process.
        let owner = if Symbolizer::is_process_independent(frame) {
            0
        } else {
            pid
        };
        let key = (owner, frame, is_return_address);
        if let Some(&id) = self.user_locations.get(&key) {
            return id;
        }
        let mut frames = self.symbolizer.user(pid, frame, is_return_address);
        // The symbolizer lists the outermost inline frame first.
        frames.reverse();
        let mapping = self
            .symbolizer
            .mapping_source(pid, frame)
            .map(|source| self.mapping_id(source));
        let id = self.push_location(Location {
            address: self.symbolizer.runtime_address(pid, frame),
            mapping,
            frames,
            kernel: false,
        });
        self.user_locations.insert(key, id);
        id
    }

    fn mapping_id(&mut self, source: MappingSource) -> MappingId {
        if let Some(&id) = self.mappings.get(&source.mapping) {
            return id;
        }
        let mut mapping = source.mapping;
        mapping.build_id = match source.object {
            Some(path) => self
                .build_ids
                .entry(path.clone())
                .or_insert_with(|| build_id_of(&path))
                .clone(),
            None => None,
        };
        let id = self.profile.mappings.len();
        self.profile.mappings.push(mapping.clone());
        self.mappings.insert(mapping, id);
        id
    }

    fn push_location(&mut self, location: Location) -> LocationId {
        self.profile.locations.push(location);
        self.profile.locations.len() - 1
    }
}

/// Kernel frames of the BPF program itself and of the code that runs it.
fn is_bpf_machinery(name: &str) -> bool {
    name.starts_with("bpf_prog_")
        || name.starts_with("bpf_trace_run")
        || name.starts_with("__bpf_trace_")
        || name.starts_with("bpf_get_stack")
}

/// The hex GNU build id of the ELF file at `path`.
fn build_id_of(path: &std::path::Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private map of a file we only read.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    process_image::build_id(&object::File::parse(&*map).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_stacks_merge_and_kernel_machinery_is_dropped() {
        let mut symbolizer = Symbolizer::new();
        let mut builder =
            ProfileBuilder::new(&mut symbolizer, vec![ValueType::new("events", "count")]);
        let raw = RawSample {
            probe: 0,
            pid: 1,
            user: vec![UserFrame::Runtime(0x1000), UserFrame::Runtime(0x2000)],
            truncated: None,
            kernel: vec![],
            values: vec![2],
        };
        builder.add(&raw);
        builder.add(&RawSample {
            values: vec![3],
            ..raw.clone()
        });
        builder.add(&RawSample {
            truncated: Some("read fault".into()),
            ..raw
        });
        let profile = builder.finish(vec!["p".into()], Summary::default(), Metadata::default());
        assert_eq!(profile.samples.len(), 2);
        assert_eq!(profile.samples[0].values, [5]);
        assert_eq!(profile.samples[0].stack, [0, 1]);
        assert_eq!(profile.locations.len(), 2);
        assert_eq!(profile.total(0), 7);
        assert_eq!(profile.locations[1].frames[0].function, "[unknown] 0x2000");
    }

    #[test]
    fn machinery_is_skipped_only_at_the_innermost_end() {
        assert!(is_bpf_machinery("bpf_prog_6deef7357e7b4530_on_tracepoint"));
        assert!(is_bpf_machinery("bpf_trace_run2"));
        assert!(!is_bpf_machinery("do_syscall_64"));
    }
}
