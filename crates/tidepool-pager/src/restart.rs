//! A pager's part in a fork (see `fork.rs`): the tag handover around it and, in the child, a
//! pager of the child's own over the same memory.

use crate::fork::ForkHooks;
use crate::pager::{spawn_threads, Inner, RegionInner, Shared};
use crate::sys::PAGE;
use crate::table::{kind, INHERITED, RESIDENT};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

impl ForkHooks for Shared {
    fn prepare(&self) {
        self.inner.tags.prepare_fork();
        if let Some(hook) = self.before_fork {
            hook();
        }
    }

    fn parent(&self) {
        self.inner.tags.parent_after_fork();
    }

    fn child_prepare(&self) {
        self.prepare_in_child();
    }

    fn child_start(&self) {
        self.start_in_child();
    }
}

impl Shared {
    /// In a forked child (see `fork.rs`), first half: the pager's userfaultfd object,
    /// registrations, write protections and store connections, made again for this process.
    /// Runs with the fork gate closed and enters no section.
    pub(crate) fn prepare_in_child(&self) {
        let i = &self.inner;
        let fail = |what: &str, e: std::io::Error| -> ! {
            i.fatal(
                &format!("restarting the pager in a forked child: {what}"),
                &e,
            )
        };
        // The parent's object must not be read here (its faults would be stolen), nor kept
        // open (it would keep the parent's registrations alive).
        if let Err(e) = i.uffd.reopen() {
            fail("opening a userfaultfd object", e);
        }
        if let Err(e) = i.uffd.register(i.doorbell.addr(), PAGE) {
            fail("registering the doorbell", e);
        }
        i.tags.child_after_fork();
        let regions = i.regions.read().clone();
        for r in &regions {
            if let Some(shadow) = &r.shadow {
                if let Err(e) = i.uffd.register_present(shadow.addr(), r.len) {
                    fail("registering a region's frames", e);
                }
            }
            if let Err(e) = i.uffd.register_present(r.base, r.len) {
                fail("registering a region", e);
            }
            i.apply_inheritance_in_child(r);
        }
        let inherited = i.protect_mapped_in_child(&regions);
        // Those pages are the parent's as much as this process's: they leave the clock and the
        // count, and this process's budget is for what it brings in or writes. Its store is a
        // copy-on-write copy of the parent's, so it keeps the copies of what it reads.
        let parent_budget = i.total_budget_pages() * PAGE;
        i.eviction.clear();
        if let Some(tier) = i.frames.probation() {
            tier.forget_at_fork();
        }
        *i.inherited.lock() = inherited;
        i.budget.resident.store(0, Relaxed);
        i.set_budget(i.child_budget.unwrap_or(parent_budget / 4));
        i.drop_far_copies.store(false, Relaxed);
        i.counters.reset();
        i.timings.reset();
        i.interrupts.set_now();
        i.handler_tids.clear();
        // The parent's threads are not here; the handler on this thread's CPU reads first.
        i.follow.start_here();
        i.activity.reset();
        if let Some(store) = i.store.fork_aware() {
            store.after_fork_in_child();
        }
    }

    /// In a forked child, second half (every pager's regions are registered again, and the
    /// gate is open): new threads, with faults served on this thread until they run.
    pub(crate) fn start_in_child(&self) {
        let i = &self.inner;
        let mut threads = self.threads.lock();
        // Those were the parent's threads: nothing to join or detach here.
        for t in threads.drain(..) {
            std::mem::forget(t);
        }
        // No handler runs yet: what this thread allocates meanwhile must not be paged.
        if let Some(hook) = self.around_child_restart {
            hook(true);
        }
        let spawned = spawn_threads(i, &self.cpus, self.thread_start);
        if let Some(hook) = self.around_child_restart {
            hook(false);
        }
        match spawned {
            Ok((t, _)) => *threads = t,
            Err(e) => i.fatal("restarting the pager in a forked child", &e),
        }
    }
}

impl Inner {
    /// In a forked child: the kernel dropped the write protections with the parent's
    /// registration, so the pages the table knows as mapped take it again, in runs, and are
    /// marked inherited. Returns them.
    fn protect_mapped_in_child(
        &self,
        regions: &[Arc<RegionInner>],
    ) -> Vec<(Arc<RegionInner>, usize)> {
        // The kernel dropped the write protections with the parent's registration: the pages
        // the table knows as mapped (on the clock, or inherited by this process in turn and
        // not written since) take it again, in runs. Not every present page: those the owner
        // touched before a region was adopted are not the pager's. Pages on their way to the
        // store keep their keys: parent and child both write the same bytes there, and the
        // child never removes what it did not tag.
        let mut mapped: Vec<(u32, usize)> = {
            let clock = self.eviction.clock.entries();
            let inherited = self.inherited.lock();
            clock
                .iter()
                .map(|(r, p, _)| (r, *p))
                .chain(inherited.iter().map(|(r, p)| (r, *p)))
                .filter(|(r, p)| kind(r.table.state(*p).load(Relaxed)) == RESIDENT)
                .map(|(r, p)| (r.id, p))
                .collect()
        };
        mapped.sort_unstable();
        mapped.dedup();
        let mut inherited = Vec::with_capacity(mapped.len());
        let mut k = 0;
        while k < mapped.len() {
            let (id, first) = mapped[k];
            let mut n = 1;
            while mapped.get(k + n) == Some(&(id, first + n)) {
                n += 1;
            }
            if let Some(r) = regions.iter().find(|r| r.id == id) {
                let _ = self.uffd.write_protect(r.addr(first), n * PAGE, true);
                for p in first..first + n {
                    r.table.state(p).fetch_or(INHERITED, Relaxed);
                    inherited.push((r.clone(), p));
                }
            }
            k += n;
        }
        inherited
    }
}
