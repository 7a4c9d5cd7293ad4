//! The userspace half of the stack storage: every stack the BPF programs sent, by key.
//!
//! Stacks that differ share most of their frames: the outer ones (`main` and what
//! calls it, a thread's start) are common to thousands of stacks that part at their
//! innermost few frames, the more so in a long profile, whose new stacks are mostly
//! known paths ending in a pc not seen before. So a stack is kept as a node of a tree
//! of frames built from the outermost in, where each node is a frame and its caller's
//! node, made once: a new stack costs its key and the frames it does not share.

use std::collections::HashMap;

use unwind_tables::walk::WalkEnd;

use crate::records::Stack;

/// No node: the parent of an outermost frame.
const ROOT: u32 = u32::MAX;

/// One stack: where its innermost frame's node is, and how its walk ended.
#[derive(Clone, Copy, Debug)]
struct Stored {
    check: u64,
    node: u32,
    len: u32,
    end: WalkEnd,
}

/// Stacks by key, their frames in a tree shared by all.
#[derive(Debug, Default)]
pub(crate) struct StackStore {
    stacks: HashMap<u64, Stored>,
    /// Node `i`: a frame and its caller's node (`ROOT` for an outermost frame).
    nodes: Vec<(u64, u32)>,
    /// (frame, caller's node) -> node.
    node_of: HashMap<(u64, u32), u32>,
    /// Frames of all stacks, counted once per stack.
    frames: usize,
}

/// What adding a stack found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Added {
    New,
    /// The key held this very stack (same check) already.
    Repeat,
    /// The key held another stack: the first one stays.
    Conflict,
}

impl StackStore {
    pub(crate) fn add(&mut self, key: u64, check: u64, stack: &Stack) -> Added {
        if let Some(known) = self.stacks.get(&key) {
            return if known.check == check {
                Added::Repeat
            } else {
                Added::Conflict
            };
        }
        let mut node = ROOT;
        for &frame in stack.pcs.iter().rev() {
            node = match self.node_of.get(&(frame, node)) {
                Some(&known) => known,
                None => {
                    let new = u32::try_from(self.nodes.len()).expect("fewer than 2^32 frames");
                    self.nodes.push((frame, node));
                    self.node_of.insert((frame, node), new);
                    new
                }
            };
        }
        self.stacks.insert(
            key,
            Stored {
                check,
                node,
                len: stack.pcs.len() as u32,
                end: stack.end,
            },
        );
        self.frames += stack.pcs.len();
        Added::New
    }

    /// The stack under `key`, innermost frame first.
    pub(crate) fn get(&self, key: u64) -> Option<Stack> {
        let stored = self.stacks.get(&key)?;
        let mut pcs = Vec::with_capacity(stored.len as usize);
        let mut node = stored.node;
        while node != ROOT {
            let (frame, caller) = self.nodes[node as usize];
            pcs.push(frame);
            node = caller;
        }
        Some(Stack {
            pcs,
            end: stored.end,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Frames of all the stacks, as if each were kept whole.
    pub(crate) fn frames(&self) -> usize {
        self.frames
    }

    /// Frames actually kept: the nodes of the tree.
    pub(crate) fn nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(pcs: &[u64], end: WalkEnd) -> Stack {
        Stack {
            pcs: pcs.to_vec(),
            end,
        }
    }

    #[test]
    fn stacks_come_back_whole_and_share_their_outer_frames() {
        let mut store = StackStore::default();
        let a = stack(&[1, 2, 3, 4], WalkEnd::Complete);
        let b = stack(&[5, 2, 3, 4], WalkEnd::ReadFault);
        let c = stack(&[3, 4], WalkEnd::Complete);
        let d = stack(&[], WalkEnd::NoProcess);
        assert_eq!(store.add(10, 1, &a), Added::New);
        assert_eq!(store.add(11, 2, &b), Added::New);
        assert_eq!(store.add(12, 3, &c), Added::New);
        assert_eq!(store.add(13, 4, &d), Added::New);
        assert_eq!(store.add(10, 1, &a), Added::Repeat);
        assert_eq!(store.add(10, 9, &b), Added::Conflict);
        assert_eq!(store.get(10), Some(a));
        assert_eq!(store.get(11), Some(b));
        assert_eq!(store.get(12), Some(c));
        assert_eq!(store.get(13), Some(d));
        assert_eq!(store.get(14), None);
        assert_eq!(store.len(), 4);
        assert_eq!(store.frames(), 10);
        // 4, 3, 2 shared by the first two stacks (and 4, 3 by the third), 1 and 5 apart.
        assert_eq!(store.nodes(), 5);
    }

    #[test]
    fn a_frame_under_two_callers_is_two_nodes() {
        let mut store = StackStore::default();
        store.add(1, 0, &stack(&[7, 8], WalkEnd::Complete));
        store.add(2, 0, &stack(&[7, 9], WalkEnd::Complete));
        assert_eq!(store.get(1).unwrap().pcs, [7, 8]);
        assert_eq!(store.get(2).unwrap().pcs, [7, 9]);
        assert_eq!(store.nodes(), 4);
    }
}
