//! The userspace half of the stack storage, and the counters of processes that exited:
//! in unlinked files, not in memory.
//!
//! A long profile keeps meeting stacks it has not met before (a pc not sampled yet, a
//! kernel path under a known user one), and a program that keeps starting short children
//! keeps handing over the counters of those that exited. Kept in memory, both would make
//! cargo-trace grow for as long as the target runs. So each record goes to the end of a
//! file as it comes, with nothing kept in memory for it:
//! - The kernel sends each distinct stack once (its set of known stacks says which it
//!   sent), so the file of stacks needs no lookup to be free of repeats. Stacks are
//!   looked up by key only to report: the index is built from the file then, and carried
//!   on from where it stopped if more come.
//! - Counters handed over by each pass of [`Tracer::retire_processes`] go to the file of
//!   counters; reading them sums the file's.
//!
//! The files are made in the temporary directory (`$TMPDIR`, else `/tmp`) and unlinked
//! at once: nothing is left behind, however cargo-trace ends.
//!
//! [`Tracer::retire_processes`]: crate::Tracer::retire_processes

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;

use crate::layout::{self, CtCountRecord};
use crate::records::{Count, CountKey, Record, Stack};

/// Records are written in batches of about this many bytes.
const BATCH: usize = 64 << 10;

/// Records, each as the BPF program wrote it (a length, then its bytes), in a file.
#[derive(Debug)]
pub(crate) struct RecordFile {
    file: File,
    /// Bytes of whole records in the file.
    written: u64,
    /// Records not written yet, and how many.
    pending: Vec<u8>,
    pending_records: u64,
    /// Records a write failed for, and the first failure.
    lost: u64,
    error: Option<io::Error>,
}

impl RecordFile {
    pub(crate) fn new() -> io::Result<RecordFile> {
        Ok(RecordFile {
            file: tempfile::tempfile()?,
            written: 0,
            pending: Vec::new(),
            pending_records: 0,
            lost: 0,
            error: None,
        })
    }

    /// Appends `record`; returns where it starts (a [`RecordFile::read_at`] place).
    pub(crate) fn append(&mut self, record: &[u8]) -> u64 {
        let at = self.written + self.pending.len() as u64;
        let len = u32::try_from(record.len()).expect("records are far shorter than 4 GiB");
        self.pending.extend_from_slice(&len.to_ne_bytes());
        self.pending.extend_from_slice(record);
        self.pending_records += 1;
        if self.pending.len() >= BATCH {
            self.flush();
        }
        at
    }

    /// Writes the pending records. A failed write loses them (counted in
    /// [`RecordFile::lost`]); the next batch goes where they would have.
    pub(crate) fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        match self.file.write_all_at(&self.pending, self.written) {
            Ok(()) => self.written += self.pending.len() as u64,
            Err(error) => {
                self.lost += self.pending_records;
                self.error.get_or_insert(error);
            }
        }
        self.pending.clear();
        self.pending_records = 0;
    }

    /// Bytes of the records written.
    pub(crate) fn len(&self) -> u64 {
        self.written
    }

    /// Records lost to a failed write, and the first failure.
    pub(crate) fn lost(&self) -> Option<(u64, &io::Error)> {
        self.error.as_ref().map(|error| (self.lost, error))
    }

    /// The record of `len` bytes at `at` (after a [`RecordFile::flush`]).
    pub(crate) fn read_at(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut record = vec![0u8; len];
        self.file.read_exact_at(&mut record, at + 4)?;
        Ok(record)
    }

    /// Calls `each` with every record written from `from` on, and its place; returns
    /// where the records end. Flushes first.
    pub(crate) fn for_each(
        &mut self,
        from: u64,
        mut each: impl FnMut(u64, &[u8]),
    ) -> io::Result<u64> {
        self.flush();
        if from >= self.written {
            return Ok(from);
        }
        let mut reader = BufReader::with_capacity(
            BATCH,
            At {
                file: &self.file,
                at: from,
                end: self.written,
            },
        );
        let mut at = from;
        let mut record = Vec::new();
        while at < self.written {
            let mut len = [0u8; 4];
            reader.read_exact(&mut len)?;
            record.resize(u32::from_ne_bytes(len) as usize, 0);
            reader.read_exact(&mut record)?;
            each(at, &record);
            at += 4 + record.len() as u64;
        }
        Ok(at)
    }
}

/// Reads a file from `at` to `end` with positioned reads: the file's own offset is
/// not used.
struct At<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.at).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        let read = self.file.read_at(&mut buf[..want], self.at)?;
        self.at += read as u64;
        Ok(read)
    }
}

/// Where a stack is in the file, its length, and its check.
#[derive(Clone, Copy, Debug)]
struct Indexed {
    check: u64,
    at: u64,
    len: u32,
}

/// Every stack the BPF programs sent, in a [`RecordFile`], and an index of them by key
/// built when a stack is first asked for.
#[derive(Debug)]
pub(crate) struct StackFile {
    file: RecordFile,
    index: HashMap<u64, Indexed>,
    /// Bytes of the file the index covers.
    indexed: u64,
    /// Of the stacks indexed: frames, stacks met again under their key (the kernel's
    /// set of known stacks was full, or two CPUs met a new stack at once), stacks whose
    /// key another stack held (the first one stays), and records that could not be read.
    frames: usize,
    repeats: u64,
    conflicts: u64,
    malformed: u64,
}

/// What the file of stacks holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StackFileFigures {
    pub(crate) stacks: usize,
    pub(crate) frames: usize,
    pub(crate) bytes: u64,
    pub(crate) repeats: u64,
    pub(crate) conflicts: u64,
    pub(crate) malformed: u64,
}

impl StackFile {
    pub(crate) fn new() -> io::Result<StackFile> {
        Ok(StackFile {
            file: RecordFile::new()?,
            index: HashMap::new(),
            indexed: 0,
            frames: 0,
            repeats: 0,
            conflicts: 0,
            malformed: 0,
        })
    }

    /// Keeps a stack record (its header and frames: see [`Record::stack_header`]).
    pub(crate) fn add(&mut self, record: &[u8]) {
        self.file.append(record);
    }

    /// The stack under `key`.
    pub(crate) fn get(&mut self, key: u64) -> io::Result<Option<Stack>> {
        self.catch_up()?;
        let Some(indexed) = self.index.get(&key) else {
            return Ok(None);
        };
        let record = self.file.read_at(indexed.at, indexed.len as usize)?;
        Ok(match Record::parse(&record) {
            Some(Record::Stack { stack, .. }) => Some(stack),
            _ => None,
        })
    }

    pub(crate) fn figures(&mut self) -> io::Result<StackFileFigures> {
        self.catch_up()?;
        Ok(StackFileFigures {
            stacks: self.index.len(),
            frames: self.frames,
            bytes: self.file.len(),
            repeats: self.repeats,
            conflicts: self.conflicts,
            malformed: self.malformed,
        })
    }

    /// Records lost to a failed write, and the first failure.
    pub(crate) fn lost(&self) -> Option<(u64, &io::Error)> {
        self.file.lost()
    }

    /// Indexes the stacks written since the last time.
    fn catch_up(&mut self) -> io::Result<()> {
        let StackFile {
            file,
            index,
            indexed,
            frames,
            repeats,
            conflicts,
            malformed,
        } = self;
        *indexed = file.for_each(*indexed, |at, record| match Record::stack_header(record) {
            Some(header) => match index.get(&header.key) {
                Some(known) if known.check == header.check => *repeats += 1,
                Some(_) => *conflicts += 1,
                None => {
                    let len = header.bytes as u32;
                    let check = header.check;
                    index.insert(header.key, Indexed { check, at, len });
                    *frames += header.frames;
                }
            },
            None => *malformed += 1,
        })?;
        Ok(())
    }
}

/// Counters handed over by the passes that retire processes, in a [`RecordFile`]: each
/// pass's as it was, summed when read.
#[derive(Debug)]
pub(crate) struct CountFile {
    file: RecordFile,
}

impl CountFile {
    pub(crate) fn new() -> io::Result<CountFile> {
        Ok(CountFile {
            file: RecordFile::new()?,
        })
    }

    pub(crate) fn add(&mut self, key: &CountKey, count: Count) {
        let record = CtCountRecord {
            kind: layout::record_kind::COUNT,
            pad: 0,
            key: key.to_raw(),
            count: layout::CtCount {
                events: count.events,
                amount: count.amount,
            },
        };
        self.file.append(layout::bytes_of(&record));
    }

    /// Adds every counter in the file to `totals`.
    pub(crate) fn sum_into(&mut self, totals: &mut HashMap<CountKey, Count>) -> io::Result<()> {
        self.file.for_each(0, |_, record| {
            if let Some(Record::Count(key, count)) = Record::parse(record) {
                let total = totals.entry(key).or_default();
                total.events += count.events;
                total.amount += count.amount;
            }
        })?;
        Ok(())
    }

    /// Bytes of the counters written.
    pub(crate) fn len(&self) -> u64 {
        self.file.len()
    }

    /// Records lost to a failed write, and the first failure.
    pub(crate) fn lost(&self) -> Option<(u64, &io::Error)> {
        self.file.lost()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::StackRef;

    /// A stack record as the program writes it, with `slack` bytes past its frames.
    fn stack_record(key: u64, check: u64, pcs: &[u64], slack: usize) -> Vec<u8> {
        let mut raw = layout::CtStack {
            kind: layout::record_kind::STACK,
            len: pcs.len() as u32,
            key,
            check,
            error: 0,
            reason: 0,
            pad: 0,
            pcs: [0; layout::MAX_FRAMES],
        };
        raw.pcs[..pcs.len()].copy_from_slice(pcs);
        let bytes = layout::bytes_of(&raw);
        bytes[..layout::STACK_HEADER_SIZE + pcs.len() * 8 + slack].to_vec()
    }

    fn add(file: &mut StackFile, key: u64, check: u64, pcs: &[u64]) {
        let record = stack_record(key, check, pcs, 24);
        let header = Record::stack_header(&record).unwrap();
        assert_eq!((header.key, header.frames), (key, pcs.len()));
        file.add(&record[..header.bytes]);
    }

    #[test]
    fn stacks_come_back_by_key_and_repeats_and_conflicts_are_told_apart() {
        let mut file = StackFile::new().unwrap();
        add(&mut file, 10, 1, &[1, 2, 3, 4]);
        add(&mut file, 11, 2, &[5, 2, 3, 4]);
        assert_eq!(file.get(10).unwrap().unwrap().pcs, [1, 2, 3, 4]);
        // Stacks that come after a lookup are indexed too.
        add(&mut file, 12, 3, &[]);
        add(&mut file, 10, 1, &[1, 2, 3, 4]);
        add(&mut file, 10, 9, &[7]);
        assert_eq!(file.get(11).unwrap().unwrap().pcs, [5, 2, 3, 4]);
        assert_eq!(file.get(12).unwrap().unwrap().pcs, Vec::<u64>::new());
        assert_eq!(
            file.get(10).unwrap().unwrap().pcs,
            [1, 2, 3, 4],
            "the first stays"
        );
        assert_eq!(file.get(13).unwrap(), None);
        let figures = file.figures().unwrap();
        assert_eq!(
            (
                figures.stacks,
                figures.frames,
                figures.repeats,
                figures.conflicts
            ),
            (3, 8, 1, 1)
        );
        // Each record's header and frames, after its length.
        let header = layout::STACK_HEADER_SIZE as u64 + 4;
        assert_eq!(figures.bytes, 5 * header + (4 + 4 + 4 + 1) * 8);
    }

    #[test]
    fn a_file_of_many_batches_reads_back_whole() {
        let mut file = StackFile::new().unwrap();
        let stacks = 3 * BATCH / (layout::STACK_HEADER_SIZE + 64 * 8) + 7;
        for key in 0..stacks as u64 {
            let pcs: Vec<u64> = (key..key + 64).collect();
            add(&mut file, key, key, &pcs);
        }
        for key in (0..stacks as u64).rev() {
            let stack = file.get(key).unwrap().unwrap();
            assert_eq!(stack.pcs, (key..key + 64).collect::<Vec<_>>());
        }
        assert_eq!(file.figures().unwrap().stacks, stacks);
    }

    #[test]
    fn counters_add_up_from_the_file() {
        let mut file = CountFile::new().unwrap();
        let key = |pid, stack| CountKey {
            probe_id: 1,
            pid,
            stack,
            kernel_stack: None,
        };
        let with_kernel = CountKey {
            kernel_stack: Some(77),
            ..key(0, StackRef::Hash(5))
        };
        for _ in 0..3 {
            file.add(
                &key(0, StackRef::Hash(5)),
                Count {
                    events: 2,
                    amount: 10,
                },
            );
        }
        file.add(
            &key(7, StackRef::None),
            Count {
                events: 1,
                amount: 0,
            },
        );
        file.add(
            &key(7, StackRef::NotStored),
            Count {
                events: 4,
                amount: 0,
            },
        );
        file.add(
            &with_kernel,
            Count {
                events: 1,
                amount: 1,
            },
        );
        let mut totals = HashMap::new();
        totals.insert(
            key(7, StackRef::None),
            Count {
                events: 5,
                amount: 0,
            },
        );
        file.sum_into(&mut totals).unwrap();
        assert_eq!(totals.len(), 4);
        assert_eq!(
            totals[&key(0, StackRef::Hash(5))],
            Count {
                events: 6,
                amount: 30
            }
        );
        assert_eq!(
            totals[&key(7, StackRef::None)],
            Count {
                events: 6,
                amount: 0
            }
        );
        assert_eq!(totals[&key(7, StackRef::NotStored)].events, 4);
        assert_eq!(totals[&with_kernel].events, 1);
    }
}
