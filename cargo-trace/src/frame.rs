//! The frames collectors hand over: typed values the symbolizer reads alike from every
//! collector, never encoded words.

/// A user frame as a collector found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UserFrame {
    /// An ELF address in an object the session's tables gave an id: the same code in
    /// every process that maps it, wherever it was placed.
    InObject { object: ObjectId, address: u64 },
    /// A runtime address of the process (in no object with an id).
    Runtime(u64),
}

/// An object's id: frames in it are kept as its ELF addresses under this id, the same
/// code in every process (1 up to [`ObjectId::MAX`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(u16);

impl ObjectId {
    /// The largest id: what a BPF frame word has room for.
    pub const MAX: u32 = (1 << 15) - 1;

    /// The id `index` (1 up to [`ObjectId::MAX`]), `None` outside that range.
    pub fn new(index: u32) -> Option<ObjectId> {
        (index > 0 && index <= Self::MAX).then_some(ObjectId(index as u16))
    }

    pub fn index(self) -> u32 {
        u32::from(self.0)
    }
}
