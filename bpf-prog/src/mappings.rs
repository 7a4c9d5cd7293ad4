//! What the walker is told of a process's code: its mappings ([`Mapping`], each with the
//! table of its object, [`TableId`]) and where files are mapped ([`FileMapping`]). A
//! leaf: the tracer registers these, records read them back.

use crate::layout::{self, CtMapping};
use crate::records::ObjectId;

/// The id of a table loaded with [`Tracer::add_table`], for [`Mapping::table`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableId(u32);

impl TableId {
    pub(crate) fn new(index: u32) -> TableId {
        TableId(index)
    }

    /// The index in the tables map.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// One executable mapping of a process, as [`Tracer::set_mappings`] takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Runtime address range `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// Runtime address minus ELF virtual address.
    pub bias: u64,
    /// The unwind table of the mapped object; `None` for code without one
    /// (a pc there ends the walk with [`WalkEnd::NoRow`](unwind_tables::walk::WalkEnd::NoRow)).
    pub table: Option<TableId>,
    /// The mapped object's id: frames in this mapping are stored as its ELF addresses
    /// ([`Frame::InObject`](crate::Frame::InObject)); `None`, as runtime addresses.
    pub object: Option<ObjectId>,
}

impl Mapping {
    /// The mapping as the walker reads it.
    pub(crate) fn to_raw(self) -> CtMapping {
        CtMapping {
            start: self.start,
            end: self.end,
            bias: self.bias,
            table_id: self.table.map_or(0, |table| table.0),
            flags: if self.table.is_some() {
                0
            } else {
                layout::MAPPING_NO_TABLE
            },
            object: self.object.map_or(0, ObjectId::index),
            pad: 0,
        }
    }
}

/// Where a mapping of a file starts, as the kernel names it, for
/// [`Tracer::add_file_mapping`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileMapping {
    /// The file's device as the kernel numbers it (`major << 20 | minor`; what
    /// `/proc/PID/maps` prints as `major:minor`).
    pub dev: u64,
    pub inode: u64,
    /// The file offset the mapping starts at.
    pub offset: u64,
}
