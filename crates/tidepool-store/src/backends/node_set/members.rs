//! The set's members (appendable while in use: a member's index never changes) and where each
//! value's pieces are.

use super::NOWHERE;
use crate::backends::node::NodeStore;
use crate::url::MAX_PIECES;
use parking_lot::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::*;

#[derive(Debug)]
pub(super) struct Member {
    pub(super) name: String,
    pub(super) seed: u64,
    pub(super) store: NodeStore,
    pub(super) down: AtomicBool,
}

/// Where one value's pieces are: `on[p]` is the member holding piece `p`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    pub(super) len: u32,
    pub(super) on: [u8; MAX_PIECES],
}

impl Placed {
    /// A value whose last write failed part way: no piece can be trusted.
    pub(super) const BROKEN: Placed = Placed {
        len: 0,
        on: [NOWHERE; MAX_PIECES],
    };

    pub(super) fn is_broken(&self) -> bool {
        self.on[0] == NOWHERE
    }

    /// (piece, member) for each piece stored, in piece order.
    pub(super) fn pieces(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.on
            .iter()
            .enumerate()
            .filter(|(_, &m)| m != NOWHERE)
            .map(|(p, &m)| (p, m as usize))
    }

    pub(super) fn holds_on(&self, member: usize) -> bool {
        self.on.contains(&(member as u8))
    }
}

/// The most nodes one set can have (listed and added): a piece's node is a byte.
pub(super) const MAX_MEMBERS: usize = NOWHERE as usize - 1;

/// The nodes, in the order they were listed or added. Appended to while in use: a member's
/// index never changes and its slot is set before the count covers it.
#[derive(Debug)]
pub(super) struct Members {
    pub(super) slots: Box<[std::sync::OnceLock<Member>]>,
    pub(super) len: std::sync::atomic::AtomicUsize,
    /// Held while a node is added.
    pub(super) adding: Mutex<()>,
}

impl Members {
    pub(super) fn new(members: Vec<Member>) -> Members {
        let len = members.len();
        let slots: Box<[std::sync::OnceLock<Member>]> = (0..MAX_MEMBERS)
            .map(|_| std::sync::OnceLock::new())
            .collect();
        for (slot, m) in slots.iter().zip(members) {
            let _ = slot.set(m);
        }
        Members {
            slots,
            len: len.into(),
            adding: Mutex::new(()),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Acquire)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Member> {
        self.slots[..self.len()]
            .iter()
            .map(|s| s.get().expect("set before counted"))
    }

    /// Appends a member (the caller holds `adding`).
    pub(super) fn push(&self, m: Member) -> usize {
        let i = self.len();
        assert!(
            i < MAX_MEMBERS && self.slots[i].set(m).is_ok(),
            "a free slot"
        );
        self.len.store(i + 1, Release);
        i
    }
}

impl std::ops::Index<usize> for Members {
    type Output = Member;

    fn index(&self, i: usize) -> &Member {
        self.slots[i].get().expect("a member's index")
    }
}
