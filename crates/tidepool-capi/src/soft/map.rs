//! Maps of byte strings, rebuilt by key.

use super::arena::{copy_out, tp_arena, tp_buf, tp_key_fn, tp_stats};
use crate::ffi::{self, User};
use crate::{construct, fail, guard, tp_status};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use tidepool_soft::{PoolStats, SoftMap, SoftRuntime};

use tp_status::*;

/// A map from byte strings to byte strings in soft memory.
#[derive(Debug)]
pub struct tp_soft_map {
    map: Map,
    /// Keeps the arena's evacuator and budget running while the map lives.
    _runtime: Arc<SoftRuntime>,
}

#[derive(Debug)]
enum Map {
    /// No reconstructor: a vanished value is simply absent.
    Plain(SoftMap<Vec<u8>, Vec<u8>>),
    Rebuilt(SoftMap<Vec<u8>, Vec<u8>, c_int>),
}

impl Map {
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, c_int> {
        match self {
            Map::Plain(m) => Ok(m.get(&k.to_vec())),
            Map::Rebuilt(m) => m.try_get_or_reconstruct(k.to_vec()),
        }
    }
    fn insert(&self, k: &[u8], v: &[u8]) -> Result<(), tidepool_soft::SoftError> {
        match self {
            Map::Plain(m) => m.insert(k.to_vec(), &v.to_vec()),
            Map::Rebuilt(m) => m.insert(k.to_vec(), &v.to_vec()),
        }
    }
    fn remove(&self, k: &[u8]) -> bool {
        match self {
            Map::Plain(m) => m.remove(&k.to_vec()),
            Map::Rebuilt(m) => m.remove(&k.to_vec()),
        }
    }
    fn len(&self) -> usize {
        match self {
            Map::Plain(m) => m.len(),
            Map::Rebuilt(m) => m.len(),
        }
    }
    fn stats(&self) -> PoolStats {
        match self {
            Map::Plain(m) => m.stats(),
            Map::Rebuilt(m) => m.stats(),
        }
    }
}

/// A map in `arena`; with `reconstruct` (may be null), a value that vanished, or was never
/// there, is rebuilt by `reconstruct(user, key, key_len, out)` when read. Null on failure.
///
/// # Safety
/// `arena` is from `tp_arena_new`, not yet freed; `reconstruct` and `user` can be called from
/// any thread while the map lives.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_new(
    arena: *const tp_arena,
    reconstruct: tp_key_fn,
    user: *mut c_void,
) -> *mut tp_soft_map {
    construct(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let a = unsafe { ffi::object(arena) }.ok_or("null arena")?;
        let user = User(user);
        Ok(tp_soft_map {
            map: match reconstruct {
                Some(f) => Map::Rebuilt(SoftMap::fallible(a.0.arena(), move |k: &Vec<u8>| {
                    let mut out = tp_buf::default();
                    // SAFETY: the callback and its user data were registered for this map,
                    // promised callable from any thread; the key and buffer live across the call.
                    let rc = unsafe { f(user.ptr(), k.as_ptr(), k.len(), &mut out) };
                    if rc == 0 {
                        Ok(out.0)
                    } else {
                        Err(rc)
                    }
                })),
                None => Map::Plain(SoftMap::new(a.0.arena())),
            },
            _runtime: a.0.clone(),
        })
    })
}

/// Frees a map and its values.
///
/// # Safety
/// `map` is null or from `tp_soft_map_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_free(map: *mut tp_soft_map) {
    // SAFETY: the caller promises a handle from `tp_soft_map_new`, freed once.
    unsafe { ffi::free(map) }
}

/// The value of `key`: copied into `out` (`cap` bytes) with its length in `*len`.
/// `TP_NOT_FOUND` if it is not there and cannot be rebuilt; `TP_ETOOSMALL` if it does not fit
/// (`*len` says how much room it needs).
///
/// # Safety
/// `map` is from `tp_soft_map_new`, not yet freed; `key` has `key_len` readable bytes; `out`
/// has `cap` writable bytes; `len` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_get(
    map: *const tp_soft_map,
    key: *const c_void,
    key_len: usize,
    out: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(m) = (unsafe { ffi::object(map) }) else {
            return fail(TP_EINVAL, "null map");
        };
        // SAFETY: the caller promises `key_len` readable bytes.
        let Some(k) = (unsafe { ffi::bytes(key, key_len) }) else {
            return fail(TP_EINVAL, "null key");
        };
        match m.map.get(k) {
            // SAFETY: the caller's promises for `out`, `cap` and `len`, passed on.
            Ok(Some(v)) => unsafe { copy_out(&v, out, cap, len) },
            Ok(None) => fail(TP_NOT_FOUND, "no such key"),
            Err(rc) => fail(
                TP_ERECONSTRUCT,
                format!("the reconstruct callback returned {rc}"),
            ),
        }
    })
}

/// Sets the value of `key`.
///
/// # Safety
/// `map` is from `tp_soft_map_new`, not yet freed; `key` and `value` have `key_len` and
/// `value_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_insert(
    map: *const tp_soft_map,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle and readable key and value bytes.
        let (m, k, v) = unsafe {
            (
                ffi::object(map),
                ffi::bytes(key, key_len),
                ffi::bytes(value, value_len),
            )
        };
        let (Some(m), Some(k), Some(v)) = (m, k, v) else {
            return fail(TP_EINVAL, "null map, key or value");
        };
        match m.map.insert(k, v) {
            Ok(()) => TP_OK,
            Err(e) => fail(TP_ESOFT, e.to_string()),
        }
    })
}

/// Removes `key`: `TP_OK`, or `TP_NOT_FOUND` if it was not there.
///
/// # Safety
/// `map` is from `tp_soft_map_new`, not yet freed; `key` has `key_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_remove(
    map: *const tp_soft_map,
    key: *const c_void,
    key_len: usize,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle and readable key bytes.
        let (m, k) = unsafe { (ffi::object(map), ffi::bytes(key, key_len)) };
        let (Some(m), Some(k)) = (m, k) else {
            return fail(TP_EINVAL, "null map or key");
        };
        if m.map.remove(k) {
            TP_OK
        } else {
            fail(TP_NOT_FOUND, "no such key")
        }
    })
}

/// Keys in the map (their values may have vanished).
///
/// # Safety
/// `map` is from `tp_soft_map_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_len(map: *const tp_soft_map) -> usize {
    // SAFETY: the caller promises a live handle (or null: 0).
    unsafe { ffi::object(map) }.map_or(0, |m| m.map.len())
}

/// The map's hits, misses and reconstructions so far.
///
/// # Safety
/// `map` is from `tp_soft_map_new`, not yet freed; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_map_stats(
    map: *const tp_soft_map,
    out: *mut tp_stats,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(m) = (unsafe { ffi::object(map) }) else {
            return fail(TP_EINVAL, "null map");
        };
        // SAFETY: the caller promises `out` is writable (or null, ignored).
        unsafe { ffi::put(out, m.map.stats().into()) };
        TP_OK
    })
}
