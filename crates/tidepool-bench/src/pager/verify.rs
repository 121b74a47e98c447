//! The paging verification workload as a program of its own ([`crate::job::Job::Verify`]):
//! every byte written is checked when read back, under `tidepool run` with any store and
//! profile.

use crate::job::VerifyJob;
use anyhow::Result;

/// Runs the verification workload on an ordinary heap allocation, for running under
/// `tidepool run`. Prints "filled" once the first round is written (and with `wait`, waits for
/// a line on standard input before going on), then one line of results; exits 1 if any byte
/// was wrong.
pub fn verify_worker(job: &VerifyJob) -> Result<()> {
    let VerifyJob {
        bytes,
        threads,
        rounds,
        wait,
    } = *job;
    let pages = bytes.div_ceil(4096);
    // Page-aligned memory from the program's allocator, as any program would get it
    // (over-allocated and sliced: no unsafe needed for the alignment).
    let mut buf = vec![0u8; (pages + 1) * 4096];
    let start = buf.as_ptr().align_offset(4096);
    let mem = &mut buf[start..start + pages * 4096];
    let mut total = tidepool_pager::verify::Report::default();
    for round in 0..rounds {
        let r = tidepool_pager::verify::run_rounds(mem, threads, round, 1);
        total.bytes_checked += r.bytes_checked;
        total.wrong_words += r.wrong_words;
        total.first_wrong = total.first_wrong.or(r.first_wrong);
        if round == 0 {
            println!("filled");
            if wait {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line)?;
            }
        }
    }
    println!(
        "checked {} bytes, {} wrong words, first wrong {:?}",
        total.bytes_checked, total.wrong_words, total.first_wrong
    );
    if total.wrong_words != 0 {
        std::process::exit(1);
    }
    Ok(())
}
