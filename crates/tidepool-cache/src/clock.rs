//! The server's clock and memcached's expiry times on it.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Relative expiry times longer than this are absolute Unix times (memcached's rule).
const MAX_DELTA: i64 = 60 * 60 * 24 * 30;
/// An expiry time that has passed.
pub(crate) const EXPIRED: u32 = 1;

/// The server's clock: seconds since start (plus 2, so that 1 can mean "long ago"), and the
/// Unix time it started at (for absolute expiry times).
#[derive(Debug)]
pub(crate) struct Clock {
    start: Instant,
    pub(crate) unix_start: i64,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock {
            start: Instant::now(),
            unix_start: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
        }
    }

    pub(crate) fn now(&self) -> u32 {
        self.start.elapsed().as_secs() as u32 + 2
    }
    pub(crate) fn now_ms(&self) -> u32 {
        (self.start.elapsed().as_millis() as u32).max(1)
    }
    /// memcached's `realtime`: a client's expiry time as server seconds (0: never).
    pub(crate) fn expiry(&self, exptime: i64) -> u32 {
        if exptime == 0 {
            0
        } else if exptime < 0 {
            EXPIRED
        } else if exptime > MAX_DELTA {
            if exptime <= self.unix_start {
                EXPIRED
            } else {
                (exptime - self.unix_start + 2).min(u32::MAX as i64) as u32
            }
        } else {
            self.now().saturating_add(exptime as u32)
        }
    }
}
