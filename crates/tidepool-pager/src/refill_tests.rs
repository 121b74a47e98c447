//! Refill (`refill.rs`) seen from the program's side: pages evicted while the budget was short
//! come back on their own once it has room, through a whole pager. Kept out of `refill.rs`,
//! which knows the pager only as its [`crate::refill::Host`].

use crate::table::{kind, RESIDENT};
use crate::testkit::{evict_all, fill, holds, inner, pager, pager_with, word, Recorder};
use crate::{Config, PAGE};
use std::time::{Duration, Instant};

/// Waits until `done` holds (10 s at most).
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn evicted_pages_come_back_while_the_budget_has_room() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut config = Config::new(1 << 30);
    config.refill = true;
    let (pager, mut region) = pager_with(config, Recorder::new(), 256);
    for p in 0..256 {
        fill(&mut region, p, (p % 251) as u8 + 1);
    }
    evict_all(&pager, &region);
    assert!(pager.stats().evicted > 0, "nothing was evicted");
    until("every page back", || {
        (0..256).all(|p| kind(word(&region, p)) == RESIDENT)
    });
    let s = pager.stats();
    assert!(s.refilled > 0, "{s}");
    assert_eq!(
        s.far_fetches, 0,
        "the program faulted them back itself: {s}"
    );
    for p in 0..256 {
        assert!(
            holds(&region, p, (p % 251) as u8 + 1),
            "page {p} came back wrong"
        );
    }
    assert_eq!(pager.stats().far_fetches, 0);
}

#[test]
fn a_refill_stops_two_margins_short_of_the_budget_and_loses_nothing() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut config = Config::new(256 * PAGE);
    config.refill = true;
    let (pager, mut region) = pager_with(config, Recorder::new(), 1024);
    for p in 0..1024 {
        fill(&mut region, p, (p % 251) as u8 + 1);
    }
    // Quiet first: the last fault's prefetch window may still be going in.
    let mut last = pager.stats();
    until("the pager to settle under the budget", || {
        std::thread::sleep(Duration::from_millis(50));
        let now = pager.stats();
        let quiet = (now.missing_faults, now.prefetched, now.evicted)
            == (last.missing_faults, last.prefetched, last.evicted);
        last = now;
        quiet && last.resident_pages <= 256
    });
    pager.set_local_budget(512 * PAGE);
    until("a refill", || pager.stats().refilled > 0);
    // Nothing else faults: what the refill brought stays under two margins (64 pages each
    // at this budget) below the budget.
    std::thread::sleep(Duration::from_millis(100));
    let s = pager.stats();
    assert!(
        s.resident_pages <= 512 - 128,
        "{} pages: {s}",
        s.resident_pages
    );
    assert!(s.resident_pages > 256, "{s}");
    for p in 0..1024 {
        assert!(holds(&region, p, (p % 251) as u8 + 1), "page {p} lost");
    }
}

#[test]
fn a_sparse_region_is_refilled_without_reading_what_was_never_evicted() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut config = Config::new(1 << 30);
    config.refill = true;
    // 16 GiB of address space, of which the last 256 KiB are used.
    let pages = 1 << 22;
    let (pager, mut region) = pager_with(config, Recorder::new(), pages);
    let used = pages - 64..pages;
    for p in used.clone() {
        fill(&mut region, p, (p % 251) as u8 + 1);
    }
    evict_all(&pager, &region);
    until("every page back", || {
        used.clone().all(|p| kind(word(&region, p)) == RESIDENT)
    });
    // One sweep of every state word up to them reads four million; each pass here reads
    // the one chunk that had evictions (and evict_all, evicting what comes back, makes a
    // few dozen passes).
    let read = inner(&pager)
        .refill
        .as_ref()
        .expect("refill is on")
        .states_read();
    assert!(
        read < (pages / 4) as u64,
        "{read} page states read to bring back 64 pages"
    );
    for p in used {
        assert!(
            holds(&region, p, (p % 251) as u8 + 1),
            "page {p} came back wrong"
        );
    }
}

#[test]
fn without_the_option_nothing_comes_back_on_its_own() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let (pager, mut region) = pager(Recorder::new(), false, 128);
    for p in 0..128 {
        fill(&mut region, p, 7);
    }
    evict_all(&pager, &region);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(pager.stats().refilled, 0);
    assert!((0..128).all(|p| kind(word(&region, p)) != RESIDENT));
}

#[test]
fn a_probation_tiers_frames_stay_in_the_tier() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut config = Config::new(1 << 30);
    config.probation = true;
    config.refill = true;
    let (pager, mut region) = pager_with(config, Recorder::new(), 128);
    if inner(&pager).frames.probation().is_none() {
        eprintln!("skipped: a probation tier needs UFFDIO_MOVE (Linux 6.8)");
        return;
    }
    for p in 0..128 {
        fill(&mut region, p, 9);
    }
    evict_all(&pager, &region);
    std::thread::sleep(Duration::from_millis(100));
    // Local already: moving them in would count as the program touching the tier (and grow
    // a tier that may grow).
    assert_eq!(pager.stats().refilled, 0);
    assert!((0..128).all(|p| holds(&region, p, 9)));
}
