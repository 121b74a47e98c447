//! SEQ, eviction's first source of victims: the pages streams walked past (Glass and Cao,
//! SIGMETRICS 1997). For a loop over more data than fits, evicting what was just used keeps a
//! fixed part resident that every pass hits, where CLOCK (like LRU) evicts each page just
//! before its reuse. The stride detector names them (`prefetch.rs`, [`Plan`]'s `behind`).

use super::{Ask, VictimPolicy, Victims};
use crate::budget::EVICT_BATCH;
use crate::prefetch::Plan;
use crate::region::RegionInner;
use crate::sections::Keep;
use crate::table::{kind, INHERITED, REFERENCED, RESIDENT};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// Pages streams are done with, newest last.
#[derive(Debug, Default)]
pub(crate) struct Done(Mutex<VecDeque<(Arc<RegionInner>, usize)>>);

impl Done {
    /// Remembers the pages `plan`'s stream walked past in `region`, keeping the newest `cap`.
    pub(crate) fn note(&self, region: &Arc<RegionInner>, plan: &Plan, cap: usize) {
        let pages = region.table.pages() as i64;
        let mut done = self.0.lock();
        for i in 0..plan.behind_count as i64 {
            let p = plan.behind_start + i * plan.stride;
            if (0..pages).contains(&p) {
                done.push_back((region.clone(), p as usize));
            }
        }
        // Old hints are the least useful: the newest are taken first.
        while done.len() > cap {
            done.pop_front();
        }
    }

    /// Forgets them all.
    pub(crate) fn clear(&self) {
        self.0.lock().clear();
    }
}

/// The newest first.
impl VictimPolicy for Done {
    fn take(&self, ask: &Ask, victims: &mut Victims) {
        let mut done = self.0.lock();
        while victims.len() < EVICT_BATCH {
            let Some((region, page)) = done.pop_back() else {
                break;
            };
            let word = region.table.state(page).load(Acquire);
            if region.dead.load(Acquire)
                || kind(word) != RESIDENT
                || word & (REFERENCED | INHERITED) != 0
                || ask.sections.keep_of(&region.sections, page) == Keep::Pin
                || !region.readable(page)
            {
                continue;
            }
            if let Some(w) = region.table.try_lock(page, &[RESIDENT]) {
                victims.push((region, page, w));
            }
        }
    }
}
