//! The arena (a soft-memory runtime: the arena and its evacuator, budget and coordinator
//! link), the buffers and statistics every structure shares, and the callbacks' types.

use crate::ffi;
use crate::{construct, fail, guard, tp_status};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};
use tidepool_soft::{ArenaConfig, AutoBudget, PoolStats, SoftRuntime};

use tp_status::*;

/// Soft memory: objects here may vanish at any moment and are rebuilt on their next read.
/// Its pools, maps and arrays share the runtime, which runs while any of them lives.
#[derive(Debug)]
pub struct tp_arena(pub(super) Arc<SoftRuntime>);

/// A byte buffer a reconstruct callback fills with `tp_buf_append`.
#[derive(Debug, Default)]
pub struct tp_buf(pub(super) Vec<u8>);

/// Hits, misses and reconstructions of a pool, map or array.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tp_stats {
    pub hits: u64,
    pub misses: u64,
    pub reconstructions: u64,
    pub reconstruct_failures: u64,
    /// Mean time of one reconstruction, in microseconds.
    pub reconstruct_us: f64,
}

impl From<PoolStats> for tp_stats {
    fn from(s: PoolStats) -> Self {
        tp_stats {
            hits: s.hits,
            misses: s.misses,
            reconstructions: s.reconstructions,
            reconstruct_failures: s.reconstruct_failures,
            reconstruct_us: s.reconstruct_us,
        }
    }
}

/// Rebuilds a pool's object: writes `size` bytes to `out` from the reader's `args`; returns 0,
/// or an error code (the read then fails with `TP_ERECONSTRUCT` and nothing is cached).
pub type tp_reconstruct_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        args: *const c_void,
        out: *mut c_void,
        size: usize,
    ) -> c_int,
>;

/// Rebuilds a map's value for `key` into `out` (with `tp_buf_append`); returns 0 or an error
/// code.
pub type tp_key_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        key: *const u8,
        key_len: usize,
        out: *mut tp_buf,
    ) -> c_int,
>;

/// Rebuilds an array's element `index` into `out` (with `tp_buf_append`); returns 0 or an
/// error code.
pub type tp_index_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, index: usize, out: *mut tp_buf) -> c_int>;

/// A soft arena of at most `budget` bytes (0: 256 MiB), its evacuator running. With `auto`
/// nonzero, the budget follows the machine's free memory instead: it grows into idle memory
/// and is cut at once under pressure. Null on failure (see `tp_last_error`).
#[no_mangle]
pub extern "C" fn tp_arena_new(budget: usize, auto: c_int) -> *mut tp_arena {
    construct(|| {
        let mut config = ArenaConfig::default();
        if budget > 0 {
            config = config.budget(budget);
        }
        // The coordinator named in the environment (TIDEPOOL_COORD), if any, is joined.
        let runtime = SoftRuntime::from_env(config).map_err(|e| format!("{e}"))?;
        runtime
            .start_evacuator(0.02, 0.05)
            .map_err(|e| format!("cannot start the evacuator: {e}"))?;
        if auto != 0 {
            runtime
                .start_auto_budget(AutoBudget::default())
                .map_err(|e| format!("cannot start the automatic budget: {e}"))?;
        }
        Ok(tp_arena(Arc::new(runtime)))
    })
}

/// Frees an arena (its pools, maps and arrays keep it alive until they are freed too).
///
/// # Safety
/// `arena` is null or from `tp_arena_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_arena_free(arena: *mut tp_arena) {
    // SAFETY: the caller promises a handle from `tp_arena_new`, freed once.
    unsafe { ffi::free(arena) }
}

/// Sets the arena's budget in bytes (memory beyond it is taken back at once; 0 takes every
/// object back).
///
/// # Safety
/// `arena` is from `tp_arena_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_arena_set_budget(arena: *const tp_arena, bytes: usize) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(a) = (unsafe { ffi::object(arena) }) else {
            return fail(TP_EINVAL, "null arena");
        };
        a.0.arena().set_budget(bytes);
        TP_OK
    })
}

/// Appends `len` bytes at `data` to a reconstruct callback's output buffer.
///
/// # Safety
/// `buf` is the buffer passed to the callback; `data` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_buf_append(
    buf: *mut tp_buf,
    data: *const c_void,
    len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises `len` readable bytes at `data`.
        let Some(d) = (unsafe { ffi::bytes(data, len) }) else {
            return fail(TP_EINVAL, "null data");
        };
        // SAFETY: `buf` is the live buffer this library passed to the callback (or null).
        match unsafe { buf.as_mut() } {
            Some(b) => {
                b.0.extend_from_slice(d);
                TP_OK
            }
            None => fail(TP_EINVAL, "null buffer"),
        }
    })
}

/// Copies `v` out: into `out` if it fits in `cap`, and its length into `len` either way.
///
/// # Safety
/// `out` has `cap` writable bytes (or `cap` is 0); `len` is null or writable.
pub(super) unsafe fn copy_out(
    v: &[u8],
    out: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> tp_status {
    // SAFETY: the caller's promise, passed on.
    unsafe { ffi::put(len, v.len()) };
    if v.len() > cap {
        return fail(
            TP_ETOOSMALL,
            format!("the value is {} bytes, the buffer {cap}", v.len()),
        );
    }
    // SAFETY: the caller promises `cap` writable bytes at `out`.
    match unsafe { ffi::bytes_mut(out, v.len()) } {
        Some(o) => {
            o.copy_from_slice(v);
            TP_OK
        }
        None => fail(TP_EINVAL, "null output buffer"),
    }
}

/// Locks that make compare-and-exchange atomic against writes and reconstructions of the
/// same object (one of 64, by the object's id or index).
#[derive(Debug)]
pub(super) struct Stripes([Mutex<()>; 64]);

impl Default for Stripes {
    fn default() -> Self {
        Stripes(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl Stripes {
    pub(super) fn lock(&self, id: u64) -> MutexGuard<'_, ()> {
        // Nothing is kept under these locks, so a panic while holding one leaves nothing
        // half-done: a poisoned lock is simply taken.
        self.0[(id % 64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}
