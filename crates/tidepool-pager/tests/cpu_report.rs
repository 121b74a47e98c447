//! What a pager reports of the CPUs' side of its misses: the handlers' sleeps, the machine's
//! interrupts and the sampled delivery and wake-up of a fault; and that following the program
//! (one reader on its CPU) serves every fault of threads on several CPUs.

use tidepool_pager::{verify, Config, Pager, Region};

#[test]
fn a_run_of_faults_reports_sleeps_interrupts_and_sampled_delivery() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let pages = 1024;
    let pager = Pager::start(
        Config::new(1 << 30),
        tidepool_store::open("local:").unwrap(),
    )
    .unwrap();
    let region = Region::new(&pager, pages * tidepool_pager::PAGE).unwrap();
    // One thread, first touches in an order no stride detector follows: each a fault, the
    // thread stopped in each, so each sample can complete at its next fault.
    let mut sum = 0u64;
    for i in 0..pages {
        let p = (i * 2_654_435_761) % pages;
        sum += region.as_slice()[p * tidepool_pager::PAGE] as u64;
    }
    assert_eq!(sum, 0);
    let s = pager.stats();
    assert!(s.missing_faults >= 256, "{s}");
    assert!(s.handler_sleeps > 0, "the handlers slept: {s}");
    if std::path::Path::new("/proc/interrupts").exists() {
        assert!(s.interrupts.is_some());
    }
    assert!(s.miss.delivery.count >= 1, "no delivery sampled: {s}");
    assert_eq!(s.miss.delivery.count, s.miss.wake.count);
    let report = s.to_string();
    assert!(report.contains("handlers slept"), "{report}");
    assert!(report.contains("miss path    delivery"), "{report}");
    // Following the program (the default where it may: two CPUs, the right to leave
    // SCHED_IDLE): one thread on one CPU, so one handler served faults alone.
    if let Some(f) = s.follow {
        assert!(f.alone > 0, "no fault served by a lone reader: {report}");
        assert_eq!(f.two_cpus, 0, "one thread counted as two CPUs: {report}");
        assert!(report.contains("follow       one handler"), "{report}");
    }
}

/// Threads on every CPU, one reader following wherever it can: every byte comes back, with
/// 1, 4 and 8 threads.
#[test]
fn every_byte_survives_with_one_reader_following_the_threads() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    for threads in [1, 4, 8] {
        let config = Config::new(8 << 20).follow_program(true);
        let pager = Pager::start(config, tidepool_store::open("local:").unwrap()).unwrap();
        let mut region = Region::new(&pager, 32 << 20).unwrap();
        let report = verify::run(region.as_mut_slice(), threads, 2);
        assert!(
            report.first_wrong.is_none(),
            "{threads} threads: {report:?}\n{}",
            pager.stats()
        );
    }
}
