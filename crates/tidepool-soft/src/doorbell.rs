//! A doorbell: one thread rings, another waits for the ring or a timeout. Allocation rings
//! it when free segments run short; the evacuator's thread waits on it.
//!
//! parking_lot even under loom: ringing takes the lock for an instant with nothing else done
//! under it, and loom tests run no evacuator thread to wait.

use std::time::{Duration, Instant};

/// Wakes the evacuator early (allocation found the free list short).
#[derive(Debug, Default)]
pub struct Doorbell {
    rung: parking_lot::Mutex<bool>,
    cv: parking_lot::Condvar,
}

impl Doorbell {
    /// Wakes the waiter (once: rings before it wakes count as one).
    pub fn ring(&self) {
        if *self.rung.lock() {
            return;
        }
        *self.rung.lock() = true;
        self.cv.notify_one();
    }

    /// Waits for a ring, at most `timeout`; clears it.
    pub fn wait(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut rung = self.rung.lock();
        while !*rung {
            if self.cv.wait_until(&mut rung, deadline).timed_out() {
                break;
            }
        }
        *rung = false;
    }
}
