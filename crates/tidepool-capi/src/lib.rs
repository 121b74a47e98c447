//! Tidepool's C ABI: soft memory ([`soft`]), far vectors and blocks ([`far`]) and pager
//! regions ([`pager`]). The header, `include/tidepool.h`, is generated from this crate by
//! cbindgen and committed; `cargo test -p tidepool-capi --test header` fails when it is stale
//! (`TIDEPOOL_WRITE_HEADER=1` rewrites it).
//!
//! Conventions, for every function:
//! - Handles (`tp_arena *`, `tp_soft_map *`, ...) come from a `*_new` function and go back
//!   through the matching `*_free`, once; null is accepted by `*_free` and refused (with
//!   `TP_EINVAL`) everywhere else.
//! - Functions that can fail return a `tp_status`; constructors return null. Either way
//!   `tp_last_error()` then gives a message saying what went wrong, for this thread.
//! - A panic inside the library never crosses into C: it becomes `TP_EPANIC` (or null) with
//!   its message.
//! - Reconstruct callbacks run in whichever thread reads, so they and their user data must be
//!   safe to call from any thread.
#![allow(non_camel_case_types)]

pub mod far;
mod ffi;
pub mod pager;
pub mod soft;

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call did.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tp_status {
    /// Done.
    TP_OK = 0,
    /// The key or object is not there (and there is no reconstructor to rebuild it).
    TP_NOT_FOUND = 1,
    /// A compare-and-exchange found another value: nothing was changed.
    TP_MISMATCH = 2,
    /// An argument is invalid: a null handle or buffer, an index out of bounds.
    TP_EINVAL = -1,
    /// Soft memory could not hold the value (see the message).
    TP_ESOFT = -2,
    /// The output buffer is too small; the length needed was written to the length pointer.
    TP_ETOOSMALL = -3,
    /// The reconstruct callback returned an error (its code is in the message).
    TP_ERECONSTRUCT = -4,
    /// A bug in the library (a Rust panic, caught at the boundary); see the message.
    TP_EPANIC = -5,
    /// The far store failed or refused (see the message); nothing written was lost.
    TP_EFAR = -6,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error and returns `status`.
pub(crate) fn fail(status: tp_status, msg: impl Into<String>) -> tp_status {
    let msg = msg.into().replace('\0', " ");
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(msg).unwrap_or_default());
    status
}

/// Runs `f`, turning a panic into `TP_EPANIC` with its message.
pub(crate) fn guard(f: impl FnOnce() -> tp_status) -> tp_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(s) => s,
        Err(p) => fail(tp_status::TP_EPANIC, panic_message(&p)),
    }
}

/// Runs a constructor, turning an error or a panic into null with a message.
pub(crate) fn construct<T>(f: impl FnOnce() -> Result<T, String>) -> *mut T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => ffi::into_raw(v),
        Ok(Err(msg)) => {
            fail(tp_status::TP_EINVAL, msg);
            std::ptr::null_mut()
        }
        Err(p) => {
            fail(tp_status::TP_EPANIC, panic_message(&p));
            std::ptr::null_mut()
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into());
    format!("internal error (a bug in tidepool; please report it): {what}")
}

/// The message of this thread's last failed call ("" if none failed yet). Valid until the
/// thread's next failing call.
#[no_mangle]
pub extern "C" fn tp_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
