//! Naming far copies so that a fork can share them: tags.
//!
//! A far copy of page `p` of region `r` lives under the key `tag << 40 | r << 32 | p`. With a
//! store private to the process (the in-process store, which a fork copies), the tag is always
//! zero and a page's copy is overwritten in place.
//!
//! With a store on a server (a memory node, Redis, memcached) parent and child share the
//! copies made before the fork, so neither may overwrite or remove them while the other may
//! still read them. At each fork both sides take a fresh tag for what they write from then on
//! (tags come from a counter in a shared page that every process forked from the same one
//! inherits, so no two processes ever write under the same key), and the tag they wrote under
//! until then is *frozen*:
//!
//! - the child never removes a copy under a tag it did not make (its parent's, or older);
//! - the parent defers removing a copy under a frozen tag until every child forked since that
//!   tag was frozen is gone. A child holds the write end of a close-on-exec pipe, and so do its
//!   own children; the parent sees the pipe's end once all of them have exited or exec'd.
//!
//! Each page records the tag of its far copy ([`crate::table::PageTable::tag`]).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering::*};
use tidepool_store::Key;

/// Bits of a key below the tag.
pub(crate) const TAG_SHIFT: u32 = 40;
/// Bits of a key below the region id.
pub(crate) const REGION_SHIFT: u32 = 32;
/// Regions one pager can have at once (region ids are 8 bits).
pub(crate) const MAX_REGIONS: usize = 255;
/// Pages one region can have (page numbers are 32 bits): 16 TiB.
pub(crate) const MAX_REGION_PAGES: usize = 1 << 32;
/// Tags are 24 bits.
const MAX_TAG: u32 = (1 << 24) - 1;

/// The key of a far copy.
#[inline]
pub(crate) fn key(tag: u32, region: u32, page: usize) -> Key {
    debug_assert!(tag <= MAX_TAG && region <= MAX_REGIONS as u32);
    ((tag as u64) << TAG_SHIFT) | ((region as u64) << REGION_SHIFT) | page as u64
}

/// The tag of a key.
#[inline]
pub(crate) fn tag_of(key: Key) -> u32 {
    (key >> TAG_SHIFT) as u32
}

/// The counter tags come from: one shared page per family of forked processes.
static COUNTER: std::sync::OnceLock<&'static AtomicU32> = std::sync::OnceLock::new();

/// A tag no other process of this family has used or will use.
fn fresh_tag() -> u32 {
    let counter = COUNTER.get_or_init(|| {
        crate::sys::shared_counter_page()
            .unwrap_or_else(|e| fatal(&format!("cannot map the page tags are counted in: {e}")))
    });
    let tag = counter.fetch_add(1, AcqRel) + 1;
    if tag > MAX_TAG {
        fatal(
            "this family of forked processes has used all 16,777,215 tags for pages in a far store \
             shared between processes; a store in this process (local:) has no such limit",
        );
    }
    tag
}

fn fatal(msg: &str) -> ! {
    crate::sys::die(&format!("tidepool pager: {msg}\n"), crate::FATAL_EXIT_CODE)
}

/// What to do with a far copy nobody will read here any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Remove it now.
    Remove,
    /// Keep it until every child forked at or after this fork number is gone.
    Defer(u32),
    /// Never remove it: it belongs to a process up the line of forks.
    Keep,
}

/// A child this process forked, while the store is shared.
#[derive(Debug)]
struct Child {
    /// 1 for the first fork, and so on.
    fork: u32,
    /// The read end of the child's pipe; `None` once it reported the end.
    pipe: Option<OwnedFd>,
}

#[derive(Debug, Default)]
struct State {
    /// Tags this process made: (tag, the fork that froze it, 0 for the current one).
    own: Vec<(u32, u32)>,
    children: Vec<Child>,
    /// Copies waiting for children: (key, the first fork whose child may read it).
    deferred: Vec<(Key, u32)>,
    forks: u32,
    /// Between prepare and the parent's half of a fork: the pipe, (read end, write end).
    pipe: Option<(OwnedFd, OwnedFd)>,
}

impl State {
    /// The newest fork whose child (or its descendants) may still be running.
    fn newest_live_child(&self) -> u32 {
        self.children
            .iter()
            .filter(|c| c.pipe.is_some())
            .map(|c| c.fork)
            .max()
            .unwrap_or(0)
    }
}

/// Tags of one pager.
#[derive(Debug)]
pub(crate) struct Tags {
    /// False for a store private to the process: every tag is zero and nothing is deferred.
    shared: bool,
    current: AtomicU32,
    state: parking_lot::Mutex<State>,
}

impl Tags {
    pub(crate) fn new(shared: bool) -> Tags {
        let current = if shared { fresh_tag() } else { 0 };
        Tags {
            shared,
            current: AtomicU32::new(current),
            state: parking_lot::Mutex::new(State {
                own: vec![(current, 0)],
                ..State::default()
            }),
        }
    }

    /// The tag this process writes under now.
    #[inline]
    pub(crate) fn current(&self) -> u32 {
        self.current.load(Relaxed)
    }

    /// What to do with a copy under `tag` that this process no longer needs.
    pub(crate) fn fate(&self, tag: u32) -> Fate {
        if !self.shared || tag == self.current() {
            return Fate::Remove;
        }
        let st = self.state.lock();
        match st.own.iter().find(|&&(t, _)| t == tag) {
            None => Fate::Keep,
            Some(&(_, frozen_at)) if frozen_at > 0 && st.newest_live_child() >= frozen_at => {
                Fate::Defer(frozen_at)
            }
            Some(_) => Fate::Remove,
        }
    }

    /// Sorts a copy this process no longer needs: onto `removes`, onto the deferred list, or
    /// nowhere.
    pub(crate) fn drop_copy(&self, key: Key, removes: &mut Vec<Key>) {
        match self.fate(tag_of(key)) {
            Fate::Remove => removes.push(key),
            Fate::Defer(since) => self.state.lock().deferred.push((key, since)),
            Fate::Keep => {}
        }
    }

    /// Looks for children that are gone; returns the deferred copies nobody can read any more.
    pub(crate) fn sweep(&self) -> Vec<Key> {
        if !self.shared {
            return Vec::new();
        }
        let mut st = self.state.lock();
        if st.deferred.is_empty() && st.children.iter().all(|c| c.pipe.is_none()) {
            return Vec::new();
        }
        for c in st.children.iter_mut() {
            if c.pipe.as_ref().is_some_and(crate::sys::pipe_closed) {
                c.pipe = None;
            }
        }
        st.children.retain(|c| c.pipe.is_some());
        let newest = st.newest_live_child();
        let mut free = Vec::new();
        st.deferred.retain(|&(key, since)| {
            let keep = since <= newest;
            if !keep {
                free.push(key);
            }
            keep
        });
        free
    }

    /// Before a fork: the pipe the child will hold.
    pub(crate) fn prepare_fork(&self) {
        if !self.shared {
            return;
        }
        let (r, w) = crate::sys::pipe().unwrap_or_else(|e| {
            fatal(&format!(
                "cannot make the pipe a forked child keeps its parent's far copies with: {e}"
            ))
        });
        self.state.lock().pipe = Some((r, w));
    }

    /// The parent's half of a fork: the current tag is frozen and a fresh one taken.
    pub(crate) fn parent_after_fork(&self) {
        if !self.shared {
            return;
        }
        let mut st = self.state.lock();
        st.forks += 1;
        let fork = st.forks;
        // Dropping the write end here leaves the child's (and its descendants') copies.
        let pipe = st.pipe.take().map(|(r, _w)| r);
        st.children.push(Child { fork, pipe });
        let current = self.current();
        for t in st.own.iter_mut() {
            if t.0 == current {
                t.1 = fork;
            }
        }
        let fresh = fresh_tag();
        st.own.push((fresh, 0));
        self.current.store(fresh, Relaxed);
    }

    /// The child's half: every tag it inherited belongs to its parent; it writes under a fresh
    /// one, keeps the pipe's write end (closed when it exits or execs), and forgets the
    /// parent's children and deferred copies.
    pub(crate) fn child_after_fork(&self) {
        if !self.shared {
            return;
        }
        let mut st = self.state.lock();
        if let Some((r, w)) = st.pipe.take() {
            drop(r);
            // Kept open until exit or exec (close-on-exec).
            std::mem::forget(w);
        }
        st.children.clear();
        st.deferred.clear();
        st.forks = 0;
        let fresh = fresh_tag();
        st.own = vec![(fresh, 0)];
        self.current.store(fresh, Relaxed);
    }

    /// Copies waiting for children.
    #[cfg(test)]
    pub(crate) fn deferred_count(&self) -> usize {
        self.state.lock().deferred.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_tag_region_and_page_apart() {
        let k = key(0xAB_CDEF, 200, 0xFFFF_FFFF);
        assert_eq!(tag_of(k), 0xAB_CDEF);
        assert_eq!((k >> REGION_SHIFT) & 0xFF, 200);
        assert_eq!(k & 0xFFFF_FFFF, 0xFFFF_FFFF);
        assert_ne!(key(1, 1, 0), key(0, 1, 0));
        assert_ne!(key(1, 1, 0), key(1, 2, 0));
    }

    #[test]
    fn a_private_store_removes_at_once_and_never_tags() {
        let t = Tags::new(false);
        assert_eq!(t.current(), 0);
        t.prepare_fork();
        t.parent_after_fork();
        assert_eq!(t.current(), 0);
        let mut removes = vec![];
        t.drop_copy(key(0, 1, 5), &mut removes);
        assert_eq!(removes, vec![key(0, 1, 5)]);
    }

    #[test]
    fn a_parent_keeps_frozen_copies_until_its_child_is_gone() {
        let t = Tags::new(true);
        let before = t.current();
        t.prepare_fork();
        // The child's write end, as the child would hold it.
        let child_end = t
            .state
            .lock()
            .pipe
            .as_ref()
            .map(|(_, w)| w.try_clone().unwrap());
        t.parent_after_fork();
        let after = t.current();
        assert_ne!(
            before, after,
            "the parent writes under a fresh tag after a fork"
        );

        let mut removes = vec![];
        // Its own current copies go at once; frozen ones wait; others' are never removed.
        t.drop_copy(key(after, 1, 1), &mut removes);
        t.drop_copy(key(before, 1, 2), &mut removes);
        t.drop_copy(key(MAX_TAG, 1, 3), &mut removes);
        assert_eq!(removes, vec![key(after, 1, 1)]);
        assert_eq!(t.deferred_count(), 1);
        assert!(t.sweep().is_empty(), "the child still runs");

        drop(child_end);
        assert_eq!(t.sweep(), vec![key(before, 1, 2)]);
        assert_eq!(t.deferred_count(), 0);
        // With the child gone, the old tag is this process's alone again.
        assert_eq!(t.fate(before), Fate::Remove);
    }

    #[test]
    fn a_child_never_removes_what_it_inherited() {
        let t = Tags::new(true);
        let inherited = t.current();
        t.prepare_fork();
        t.child_after_fork();
        let own = t.current();
        assert_ne!(own, inherited);
        assert_eq!(t.fate(inherited), Fate::Keep);
        assert_eq!(t.fate(own), Fate::Remove);
    }

    #[test]
    fn tags_are_unique_across_a_family_of_processes() {
        let t = Tags::new(true);
        let mine = t.current();
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only takes a tag (atomics on the shared page), writes it to the
        // pipe and exits without running anything of the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let tag = fresh_tag();
            // SAFETY: writing 4 bytes of a u32, then leaving at once.
            unsafe {
                libc::write(fds[1], (&tag as *const u32).cast(), 4);
                libc::_exit(0);
            }
        }
        let mut theirs = 0u32;
        // SAFETY: reading 4 bytes into a u32.
        unsafe {
            libc::read(fds[0], (&mut theirs as *mut u32).cast(), 4);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let next = fresh_tag();
        assert!(theirs != mine && next != mine && next != theirs);
    }
}
