//! The synchronisation the soft-memory core is built on: atomics, fences and locks, from the
//! standard library (and parking_lot) in normal builds and from loom under `--cfg loom`, so
//! that the loom tests (`tests/loom_*.rs`) run the real protocol code of the slot table, the
//! handles and the segments rather than a model of it.
//!
//! Only state that takes part in the protocol goes through here. Statistics (counters, demand)
//! and process-wide statics keep the standard library's atomics.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, RwLock};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};
#[cfg(not(loom))]
pub(crate) use std::{hint::spin_loop, thread::yield_now};

#[cfg(loom)]
pub(crate) use loom::{hint::spin_loop, thread::yield_now};
#[cfg(loom)]
pub(crate) use loom_locks::{Mutex, RwLock};

/// loom's locks with parking_lot's interface (no poisoning: a panic under loom ends the test).
#[cfg(loom)]
mod loom_locks {
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("no panics under loom")
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().expect("no panics under loom")
        }
        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().expect("no panics under loom")
        }
    }
}
