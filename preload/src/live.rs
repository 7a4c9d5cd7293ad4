//! The consumer's live blocks of one process, by address: an open-addressing table the
//! consumer can prefetch into. A process with a million live blocks makes every free a
//! cache miss (or two) in a general hash map, about as much time as the target takes
//! to allocate and free: the consumer fell behind and the target waited for its rings.
//! Knowing the addresses of the events ahead in a ring, the consumer asks for their
//! slots early ([`LiveTable::prefetch`]) and the misses overlap.
//!
//! Linear probing from a Fibonacci hash of the address, at most half full, deletion by
//! backward shift (no tombstones: probe runs stay short under any churn). Address 0 is
//! the empty slot (no block is at address 0).

/// A live block: its size, its (process, stack) slot and its birth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Block {
    pub size: u64,
    pub born_ns: u64,
    /// Its (process, stack)'s index in the recorder's slots.
    pub slot: u32,
    pub mapped: bool,
}

#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Entry {
    address: u64,
    block: Block,
}

/// A slot found by [`LiveTable::lookup`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    at: usize,
    /// A block is at the address.
    pub live: bool,
}

pub(crate) struct LiveTable {
    entries: Vec<Entry>,
    /// log2 of the capacity.
    bits: u32,
    len: usize,
}

impl Default for LiveTable {
    /// Small: most processes a program starts hold few blocks (a shell's children), and
    /// the table doubles as it fills.
    fn default() -> Self {
        LiveTable::with_bits(6)
    }
}

impl LiveTable {
    fn with_bits(bits: u32) -> LiveTable {
        LiveTable {
            entries: vec![Entry::default(); 1 << bits],
            bits,
            len: 0,
        }
    }

    /// A table that holds nothing and takes no memory, for a process retired (never
    /// looked up again).
    pub fn empty() -> LiveTable {
        LiveTable {
            entries: Vec::new(),
            bits: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn home(&self, address: u64) -> usize {
        ((address >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// Whether the table outgrew the caches (prefetching a small one is wasted work).
    pub fn is_large(&self) -> bool {
        self.bits > 16
    }

    /// Asks the CPU for `address`'s slot, ahead of a lookup.
    pub fn prefetch(&self, address: u64) {
        let at = &self.entries[self.home(address)] as *const Entry;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it never faults, and `at` points into the table.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
        };
    }

    /// The index of `address`'s entry, or of the empty slot where it would go.
    fn find(&self, address: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut at = self.home(address);
        loop {
            let found = self.entries[at].address;
            if found == address {
                return (at, true);
            }
            if found == 0 {
                return (at, false);
            }
            at = (at + 1) & mask;
        }
    }

    /// The slot of the block at `address`, if one is live (to prefetch its counters).
    pub fn slot_of(&self, address: u64) -> Option<u32> {
        if address == 0 {
            return None;
        }
        let (at, found) = self.find(address);
        found.then(|| self.entries[at].block.slot)
    }

    pub fn contains(&self, address: u64) -> bool {
        address != 0 && self.find(address).1
    }

    /// Where `address` is (or would go) and whether a block is there: for
    /// [`LiveTable::put`], with no second search.
    pub fn lookup(&self, address: u64) -> Place {
        let (at, live) = self.find(address);
        Place { at, live }
    }

    /// Puts `block` at `address`, at the place [`LiveTable::lookup`] gave (nothing
    /// changed in between); the block it replaces, if any.
    pub fn put(&mut self, place: Place, address: u64, block: Block) -> Option<Block> {
        debug_assert!(
            address != 0 && self.entries[place.at].address == if place.live { address } else { 0 }
        );
        if place.live {
            return Some(std::mem::replace(&mut self.entries[place.at].block, block));
        }
        self.entries[place.at] = Entry { address, block };
        self.len += 1;
        if self.len * 2 > self.entries.len() {
            self.grow();
        }
        None
    }

    /// Puts `block` at `address`; the block it replaces, if any.
    pub fn insert(&mut self, address: u64, block: Block) -> Option<Block> {
        debug_assert!(address != 0);
        let (at, found) = self.find(address);
        if found {
            return Some(std::mem::replace(&mut self.entries[at].block, block));
        }
        self.entries[at] = Entry { address, block };
        self.len += 1;
        if self.len * 2 > self.entries.len() {
            self.grow();
        }
        None
    }

    /// Takes the block at `address` out.
    pub fn remove(&mut self, address: u64) -> Option<Block> {
        if address == 0 {
            return None;
        }
        let (mut hole, found) = self.find(address);
        if !found {
            return None;
        }
        let block = self.entries[hole].block;
        self.len -= 1;
        // backward shift: each entry of the run after the hole that may live in it moves
        let mask = self.mask();
        let mut at = (hole + 1) & mask;
        loop {
            let address = self.entries[at].address;
            if address == 0 {
                break;
            }
            let home = self.home(address);
            // the entry may move to the hole if its home is not in (hole, at]
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.entries[hole] = self.entries[at];
                hole = at;
            }
            at = (at + 1) & mask;
        }
        self.entries[hole] = Entry::default();
        Some(block)
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, LiveTable::with_bits(self.bits + 1));
        for entry in old.entries.into_iter().filter(|e| e.address != 0) {
            self.insert(entry.address, entry.block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn block(n: u64) -> Block {
        Block {
            size: n,
            born_ns: n * 3,
            slot: n as u32,
            mapped: n.is_multiple_of(2),
        }
    }

    /// Against a HashMap, under churn that makes long runs (addresses in few homes).
    #[test]
    fn behaves_as_a_map_under_churn() {
        let mut table = LiveTable::default();
        let mut model = HashMap::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let address = ((x % 5000) + 1) << 4;
            if x.is_multiple_of(3) {
                assert_eq!(table.remove(address), model.remove(&address), "{i}");
            } else {
                assert_eq!(
                    table.insert(address, block(i)),
                    model.insert(address, block(i))
                );
            }
            assert_eq!(table.len(), model.len());
        }
        for (&address, &b) in &model {
            assert!(table.contains(address));
            assert_eq!(table.remove(address), Some(b));
        }
        assert_eq!(table.len(), 0);
        assert!(!table.contains(16));
    }
}
