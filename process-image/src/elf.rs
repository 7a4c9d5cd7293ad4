//! What a mapping needs from its ELF file: where its loadable segments are (for the
//! load bias) and its build id.

use std::fmt::Write as _;

use object::{Object, ObjectSegment};

/// A loadable segment of an ELF file, as the bias computation needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub file_size: u64,
    pub vaddr: u64,
    /// `PF_X` is set.
    pub executable: bool,
}

/// The loadable segments of an ELF file, for [`load_bias`].
pub fn load_segments(file: &object::File<'_>) -> Vec<LoadSegment> {
    file.segments()
        .map(|s| {
            let (file_offset, file_size) = s.file_range();
            let executable = match s.flags() {
                object::SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
                _ => false,
            };
            LoadSegment {
                file_offset,
                file_size,
                vaddr: s.address(),
                executable,
            }
        })
        .collect()
}

/// The load bias (runtime address − ELF virtual address) of the object whose
/// executable mapping starts at `map_start` from file offset `map_offset`.
///
/// The mapping holds the page-aligned start of the executable segment whose
/// file range contains `map_offset` (only an executable one: lld packs the
/// read-only segment and the text into one file page, each with its own
/// vaddr − offset delta): the segment's bytes at file offset `o` are at ELF
/// address `vaddr + (o - file_offset)` and at runtime address
/// `map_start + (o - map_offset)`. The mapping's offset is rounded down to a
/// page while the segment's may not be, so containment is tested from the
/// segment's page-aligned offset; the ELF rules make `vaddr ≡ file_offset`
/// modulo the page size, so the bias comes out page-aligned.
pub fn load_bias(segments: &[LoadSegment], map_start: u64, map_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let segment = segments.iter().filter(|s| s.executable).find(|s| {
        let first = s.file_offset & !(PAGE - 1);
        first <= map_offset && map_offset < s.file_offset + s.file_size.max(1)
    })?;
    Some(
        map_start
            .wrapping_sub(map_offset)
            .wrapping_add(segment.file_offset)
            .wrapping_sub(segment.vaddr),
    )
}

/// [`load_bias`] of a parsed file.
pub fn load_bias_of(file: &object::File<'_>, map_start: u64, map_offset: u64) -> Option<u64> {
    load_bias(&load_segments(file), map_start, map_offset)
}

/// The GNU build id of `file`, hex encoded.
pub fn build_id(file: &object::File<'_>) -> Option<String> {
    let id = file.build_id().ok()??;
    Some(id.iter().fold(String::new(), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_from_segments() {
        // A PIE: text at vaddr 0x1000 from offset 0x1000.
        let pie = [
            LoadSegment {
                file_offset: 0,
                file_size: 0x800,
                vaddr: 0,
                executable: false,
            },
            LoadSegment {
                file_offset: 0x1000,
                file_size: 0x3000,
                vaddr: 0x1000,
                executable: true,
            },
        ];
        assert_eq!(
            load_bias(&pie, 0x5555_5555_5000, 0x1000),
            Some(0x5555_5555_4000)
        );
        // A segment whose offset is not page aligned: vaddr 0x21a0c0 at offset
        // 0x2190c0 is mapped from the page at offset 0x219000.
        let odd = [LoadSegment {
            file_offset: 0x2190c0,
            file_size: 0x5000,
            vaddr: 0x21a0c0,
            executable: true,
        }];
        assert_eq!(
            load_bias(&odd, 0x7f00_0021_a000, 0x219000),
            Some(0x7f00_0000_0000)
        );
        // lld: the read-only segment ends in the file page where the text
        // starts; the text's delta differs, and the mapping is the text's.
        let lld = [
            LoadSegment {
                file_offset: 0,
                file_size: 0x16054,
                vaddr: 0,
                executable: false,
            },
            LoadSegment {
                file_offset: 0x16060,
                file_size: 0x42e20,
                vaddr: 0x17060,
                executable: true,
            },
        ];
        assert_eq!(
            load_bias(&lld, 0x5555_5556_c000, 0x16000),
            Some(0x5555_5555_5000)
        );
        // A non-PIE executable: bias 0.
        let exec = [LoadSegment {
            file_offset: 0x1000,
            file_size: 0x100,
            vaddr: 0x401000,
            executable: true,
        }];
        assert_eq!(load_bias(&exec, 0x401000, 0x1000), Some(0));
        // No segment holds the offset.
        assert_eq!(load_bias(&pie, 0x5555_5555_9000, 0x9000), None);
    }
}
