//! Fixed-length arrays of byte strings, rebuilt by index (Midas's `SoftArray`).

use super::arena::{copy_out, tp_arena, tp_buf, tp_index_fn, tp_stats, Stripes};
use crate::ffi::{self, User};
use crate::{construct, fail, guard, tp_status};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use tidepool_soft::{SoftRuntime, SoftVec};

use tp_status::*;

/// A fixed-length array of byte strings in soft memory, each rebuilt from its index (Midas's
/// `SoftArray`).
#[derive(Debug)]
pub struct tp_soft_array {
    v: SoftVec<Vec<u8>, c_int>,
    stripes: Stripes,
    /// Keeps the arena's evacuator and budget running while the array lives.
    _runtime: Arc<SoftRuntime>,
}

/// An array of `len` elements in `arena`, element `i` rebuilt by
/// `reconstruct(user, i, out)` when it is read and gone. Null on failure.
///
/// # Safety
/// `arena` is from `tp_arena_new`, not yet freed; `reconstruct` and `user` can be called from
/// any thread while the array lives.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_new(
    arena: *const tp_arena,
    len: usize,
    reconstruct: tp_index_fn,
    user: *mut c_void,
) -> *mut tp_soft_array {
    construct(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let a = unsafe { ffi::object(arena) }.ok_or("null arena")?;
        let f = reconstruct.ok_or("an array needs a reconstruct callback")?;
        let user = User(user);
        let v = SoftVec::fallible(a.0.arena(), len, move |i| {
            let mut out = tp_buf::default();
            // SAFETY: the callback and its user data were registered for this array, promised
            // callable from any thread; the buffer lives across the call.
            let rc = unsafe { f(user.ptr(), i, &mut out) };
            if rc == 0 {
                Ok(out.0)
            } else {
                Err(rc)
            }
        });
        Ok(tp_soft_array {
            v,
            stripes: Stripes::default(),
            _runtime: a.0.clone(),
        })
    })
}

/// The array behind a handle, with `index` checked.
///
/// # Safety
/// `array` is null or a live handle.
unsafe fn element<'a>(
    array: *const tp_soft_array,
    index: usize,
) -> Result<&'a tp_soft_array, tp_status> {
    // SAFETY: the caller promises a live handle or null.
    let a = unsafe { ffi::object(array) }.ok_or_else(|| fail(TP_EINVAL, "null array"))?;
    if index >= a.v.len() {
        return Err(fail(
            TP_EINVAL,
            format!("index {index} of an array of {}", a.v.len()),
        ));
    }
    Ok(a)
}

/// Frees an array and its elements.
///
/// # Safety
/// `array` is null or from `tp_soft_array_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_free(array: *mut tp_soft_array) {
    // SAFETY: the caller promises a handle from `tp_soft_array_new`, freed once.
    unsafe { ffi::free(array) }
}

/// Element `index` (rebuilt if gone), copied into `out` (`cap` bytes) with its length in
/// `*len`; `TP_ETOOSMALL` if it does not fit.
///
/// # Safety
/// `array` is from `tp_soft_array_new`, not yet freed; `out` has `cap` writable bytes; `len`
/// is null or writable.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_get(
    array: *const tp_soft_array,
    index: usize,
    out: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let a = match unsafe { element(array, index) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        // No lock across the reconstructor: it may read other elements of this array.
        match a.v.try_get(index) {
            // SAFETY: the caller's promises for `out`, `cap` and `len`, passed on.
            Ok(v) => unsafe { copy_out(&v, out, cap, len) },
            Err(rc) => reconstruct_failed(rc),
        }
    })
}

/// Sets element `index`.
///
/// # Safety
/// `array` is from `tp_soft_array_new`, not yet freed; `value` has `value_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_set(
    array: *const tp_soft_array,
    index: usize,
    value: *const c_void,
    value_len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let a = match unsafe { element(array, index) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        // SAFETY: the caller promises `value_len` readable bytes.
        let Some(v) = (unsafe { ffi::bytes(value, value_len) }) else {
            return fail(TP_EINVAL, "null value");
        };
        let _lock = a.stripes.lock(index as u64);
        match a.v.set(index, &v.to_vec()) {
            Ok(()) => TP_OK,
            Err(e) => fail(TP_ESOFT, e.to_string()),
        }
    })
}

/// Sets element `index` to `desired` if it holds `expected`, as one atomic step (a vanished
/// element is rebuilt first): `TP_OK` if it did, `TP_MISMATCH` if it holds something else.
///
/// # Safety
/// `array` is from `tp_soft_array_new`, not yet freed; `expected` and `desired` have
/// `expected_len` and `desired_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_cmpxchg(
    array: *const tp_soft_array,
    index: usize,
    expected: *const c_void,
    expected_len: usize,
    desired: *const c_void,
    desired_len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let a = match unsafe { element(array, index) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        // SAFETY: the caller promises the lengths given of readable bytes.
        let (e, d) = unsafe {
            (
                ffi::bytes(expected, expected_len),
                ffi::bytes(desired, desired_len),
            )
        };
        let (Some(e), Some(d)) = (e, d) else {
            return fail(TP_EINVAL, "null expected or desired value");
        };
        loop {
            // Rebuilt outside the lock (the reconstructor may read other elements), then
            // compared and set under it; if it vanished in between, again.
            if let Err(rc) = a.v.try_get(index) {
                return reconstruct_failed(rc);
            }
            let _lock = a.stripes.lock(index as u64);
            match a.v.get_cached(index) {
                None => continue,
                Some(v) if v != e => return TP_MISMATCH,
                Some(_) => {
                    return match a.v.set(index, &d.to_vec()) {
                        Ok(()) => TP_OK,
                        Err(e) => fail(TP_ESOFT, e.to_string()),
                    }
                }
            }
        }
    })
}

/// The array's length.
///
/// # Safety
/// `array` is from `tp_soft_array_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_len(array: *const tp_soft_array) -> usize {
    // SAFETY: the caller promises a live handle (or null: 0).
    unsafe { ffi::object(array) }.map_or(0, |a| a.v.len())
}

/// The array's hits, misses and reconstructions so far.
///
/// # Safety
/// `array` is from `tp_soft_array_new`, not yet freed; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_array_stats(
    array: *const tp_soft_array,
    out: *mut tp_stats,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(a) = (unsafe { ffi::object(array) }) else {
            return fail(TP_EINVAL, "null array");
        };
        // SAFETY: the caller promises `out` is writable (or null, ignored).
        unsafe { ffi::put(out, a.v.stats().into()) };
        TP_OK
    })
}

fn reconstruct_failed(rc: c_int) -> tp_status {
    fail(
        TP_ERECONSTRUCT,
        format!("the reconstruct callback returned {rc}"),
    )
}
