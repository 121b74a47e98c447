//! The verification workload under the in-process stores, with the working set eight times the
//! local budget and four threads.

use tidepool_pager::{verify, Config, Pager, PagerStats, Region};

/// Three rounds of the workload over 64 MiB with four threads under an 8 MiB budget; every
/// byte must come back. Returns the pager's counters.
fn verify_64m_in_8m(config: Config) -> PagerStats {
    verify_in(config, 64 << 20)
}

/// [`verify_64m_in_8m`] over `wss` bytes.
fn verify_in(config: Config, wss: usize) -> PagerStats {
    verify_over("local:", config, wss)
}

/// [`verify_in`] over the store `url`.
fn verify_over(url: &str, config: Config, wss: usize) -> PagerStats {
    let store = tidepool_store::open(url).unwrap();
    let pager = Pager::start(config, store).unwrap();
    let mut region = Region::new(&pager, wss).unwrap();
    let report = verify::run(region.as_mut_slice(), 4, 3);
    let stats = pager.stats();
    eprintln!("{report:?}\n{stats}");
    #[cfg(feature = "trace")]
    if let Some((page, ..)) = report.first_wrong {
        use tidepool_pager::trace;
        eprintln!("history of page {page}:\n{}", trace::dump_page(page));
        eprintln!(
            "calls nearby:\n{}",
            trace::dump_calls(page.saturating_sub(64), page + 64)
        );
    }
    assert_eq!(
        report.wrong_words, 0,
        "first wrong word: {:?}",
        report.first_wrong
    );
    assert!(report.bytes_checked >= 3 * wss as u64);
    stats
}

#[test]
fn every_byte_survives_eviction_with_the_local_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let stats = verify_64m_in_8m(Config::new(8 << 20));
    // The working set really went far and came back.
    assert!(stats.written_back > 0 && stats.far_fetches > 0, "{stats:?}");
    assert!(stats.evicted_zero > 0, "zero pages were stored: {stats:?}");
    assert!(stats.resident_pages <= stats.budget_pages + 4096);
}

/// The compressing store as `tidepool run` has it (a probation tier in front, refill, no far
/// copies of pages that came back), with each codec, and with copies kept: every byte survives
/// being packed and unpacked.
#[test]
fn every_byte_survives_eviction_through_the_compressing_store_and_its_probation_tier() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    for (url, drop_far_copies) in [
        ("local:?compress=lz4", true),
        ("local:?compress=lz4", false),
        ("local:?compress=zstd", true),
    ] {
        let config = Config::new(8 << 20)
            .probation(true)
            .refill(true)
            .drop_far_copies(drop_far_copies);
        let stats = verify_over(url, config, 64 << 20);
        assert!(
            stats.written_back > 0 && stats.far_fetches > 0,
            "{url}: {stats:?}"
        );
        let held = stats
            .store_memory
            .as_ref()
            .expect("an in-process store says what it holds");
        assert!(held.original.is_some(), "{url}: {held:?}");
    }
}

/// Far pages as frames moved with UFFDIO_MOVE. On Linux 6.18 under CPU contention the kernel
/// now and then moves a page between region and frame without being asked (about one run in
/// a hundred with `yes` on both CPUs); the pager finds that and keeps the page where the
/// kernel put it (`frames_repaired`). Before it did, this test read such a page back as zeros.
#[test]
fn every_byte_survives_eviction_with_in_process_frames() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let config = Config::new(8 << 20).in_process_frames(true);
    let stats = verify_64m_in_8m(config);
    // Pages went out as frames, came back, and zero pages were not kept.
    assert!(stats.moved_out > 0 && stats.far_fetches > 0, "{stats:?}");
    assert_eq!(
        stats.written_back, 0,
        "nothing was refused a move: {stats:?}"
    );
    assert!(stats.evicted_zero > 0, "zero pages were kept: {stats:?}");
    assert!(stats.resident_pages <= stats.budget_pages + 4096);
}

#[test]
fn discarded_pages_read_zero_and_untouched_pages_are_never_fetched() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let store = tidepool_store::open("local:").unwrap();
    let pager = Pager::start(Config::new(1 << 20), store).unwrap();
    let mut region = Region::new(&pager, 16 << 20).unwrap();
    let mem = region.as_mut_slice();
    for (i, b) in mem.iter_mut().enumerate().step_by(4096) {
        *b = (i / 4096) as u8 | 1;
    }
    region.discard(4096 * 10, 4096 * 20);
    let mem = region.as_slice();
    for p in 0..mem.len() / 4096 {
        let expect = if (10..30).contains(&p) {
            0
        } else {
            p as u8 | 1
        };
        assert_eq!(mem[p * 4096], expect, "page {p}");
    }
    let stats = pager.stats();
    assert!(stats.far_fetches > 0);
}

/// A probation tier in front of the store: pages go out to frames, are touched back from
/// there or spilled to the store, clean ones dropped, dirty ones written. A working set a
/// third over the budget, so that pages are touched in the tier as well as spilled; the tier
/// grows as it does in front of a store elsewhere (in front of this one it would keep its
/// least share, a hundredth, where touches are rare).
#[test]
fn every_byte_survives_eviction_through_a_probation_tier() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let config = Config::new(12 << 20).probation(true).probation_grows(true);
    let stats = verify_in(config, 16 << 20);
    if stats.tier_cap_pages == 0 {
        eprintln!("skipped: a probation tier needs UFFDIO_MOVE (Linux 6.8)");
        return;
    }
    assert!(
        stats.tier_touched > 0 && stats.tier_spilled > 0 && stats.written_back > 0,
        "{stats:?}"
    );
    assert!(stats.far_fetches > 0, "{stats:?}");
    assert!(stats.resident_pages + stats.tier_pages <= stats.budget_pages + 4096);
}
