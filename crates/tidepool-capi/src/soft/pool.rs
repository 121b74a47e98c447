//! Pools of fixed-size objects and their boxes (Midas's `SoftMemPool` and `SoftUniquePtr`).

use super::arena::{tp_arena, tp_reconstruct_fn, tp_stats, Stripes};
use crate::ffi::{self, User};
use crate::{construct, fail, guard, tp_status};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tidepool_soft::{SoftMap, SoftRuntime};

use tp_status::*;

/// Objects of one size rebuilt by one callback (Midas's `SoftMemPool`).
#[derive(Debug)]
pub struct tp_soft_pool(Arc<Pool>);

#[derive(Debug)]
struct Pool {
    objects: SoftMap<u64, Vec<u8>>,
    /// Keeps the arena's evacuator and budget running while the pool lives.
    _runtime: Arc<SoftRuntime>,
    size: usize,
    reconstruct: tp_reconstruct_fn,
    user: User,
    next: AtomicU64,
    stripes: Stripes,
    reconstructions: AtomicU64,
    failures: AtomicU64,
    nanos: AtomicU64,
}

/// One object of a pool (Midas's `SoftUniquePtr`): freeing it frees the object.
#[derive(Debug)]
pub struct tp_soft_box {
    pool: Arc<Pool>,
    id: u64,
}

/// A pool of `size`-byte objects in `arena`, rebuilt by `reconstruct(user, args, out, size)`
/// from the arguments each read passes. Null on failure.
///
/// # Safety
/// `arena` is from `tp_arena_new`, not yet freed; `reconstruct` and `user` can be called from
/// any thread for as long as the pool or any of its boxes lives.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_pool_new(
    arena: *const tp_arena,
    size: usize,
    reconstruct: tp_reconstruct_fn,
    user: *mut c_void,
) -> *mut tp_soft_pool {
    construct(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let a = unsafe { ffi::object(arena) }.ok_or("null arena")?;
        if size == 0 {
            return Err("objects of 0 bytes".into());
        }
        reconstruct.ok_or("a pool needs a reconstruct callback")?;
        Ok(tp_soft_pool(Arc::new(Pool {
            objects: SoftMap::new(a.0.arena()),
            _runtime: a.0.clone(),
            size,
            reconstruct,
            user: User(user),
            next: AtomicU64::new(0),
            stripes: Stripes::default(),
            reconstructions: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        })))
    })
}

/// Frees a pool handle (its boxes keep the pool alive until they are freed).
///
/// # Safety
/// `pool` is null or from `tp_soft_pool_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_pool_free(pool: *mut tp_soft_pool) {
    // SAFETY: the caller promises a handle from `tp_soft_pool_new`, freed once.
    unsafe { ffi::free(pool) }
}

/// The pool's hits, misses and reconstructions so far.
///
/// # Safety
/// `pool` is from `tp_soft_pool_new`, not yet freed; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_pool_stats(
    pool: *const tp_soft_pool,
    out: *mut tp_stats,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(p) = (unsafe { ffi::object(pool) }) else {
            return fail(TP_EINVAL, "null pool");
        };
        let s = p.0.objects.stats();
        let n = p.0.reconstructions.load(Relaxed);
        let stats = tp_stats {
            hits: s.hits,
            misses: s.misses,
            reconstructions: n,
            reconstruct_failures: p.0.failures.load(Relaxed),
            reconstruct_us: if n == 0 {
                0.0
            } else {
                p.0.nanos.load(Relaxed) as f64 / n as f64 / 1000.0
            },
        };
        // SAFETY: the caller promises `out` is writable (or null, ignored).
        unsafe { ffi::put(out, stats) };
        TP_OK
    })
}

/// A new, empty object of `pool`: its first read reconstructs it. Null on failure.
///
/// # Safety
/// `pool` is from `tp_soft_pool_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_box_new(pool: *const tp_soft_pool) -> *mut tp_soft_box {
    construct(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let p = unsafe { ffi::object(pool) }.ok_or("null pool")?;
        Ok(tp_soft_box {
            pool: p.0.clone(),
            id: p.0.next.fetch_add(1, Relaxed),
        })
    })
}

/// Frees an object.
///
/// # Safety
/// `b` is null or from `tp_soft_box_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_box_free(b: *mut tp_soft_box) {
    // SAFETY: the caller promises a live handle or null.
    if let Some(x) = unsafe { b.as_ref() } {
        x.pool.objects.remove(&x.id);
    }
    // SAFETY: as above, freed once.
    unsafe { ffi::free(b) }
}

/// Reads the object into `out` (the pool's object size), rebuilding it from `args` with the
/// pool's callback if it vanished (Midas's `read(args)`).
///
/// # Safety
/// `b` is from `tp_soft_box_new`, not yet freed; `out` has the pool's object size of writable
/// bytes; `args` is whatever the pool's callback expects.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_box_read(
    b: *const tp_soft_box,
    args: *const c_void,
    out: *mut c_void,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(x) = (unsafe { ffi::object(b) }) else {
            return fail(TP_EINVAL, "null box");
        };
        let p = &x.pool;
        // SAFETY: the caller promises the pool's object size of writable bytes at `out`.
        let Some(o) = (unsafe { ffi::bytes_mut(out, p.size) }) else {
            return fail(TP_EINVAL, "null output buffer");
        };
        if let Some(v) = p.objects.get(&x.id) {
            o.copy_from_slice(&v);
            return TP_OK;
        }
        let f = p.reconstruct.expect("checked at pool creation");
        let t0 = Instant::now();
        // SAFETY: the callback and its user data were registered for this pool, promised
        // callable from any thread; `out` holds `size` writable bytes.
        let rc = unsafe { f(p.user.ptr(), args, out, p.size) };
        if rc != 0 {
            p.failures.fetch_add(1, Relaxed);
            return fail(
                TP_ERECONSTRUCT,
                format!("the reconstruct callback returned {rc}"),
            );
        }
        p.nanos.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        p.reconstructions.fetch_add(1, Relaxed);
        let _lock = p.stripes.lock(x.id);
        match p.objects.get(&x.id) {
            // Written meanwhile: the newer value wins over the rebuilt one.
            Some(v) => o.copy_from_slice(&v),
            // Cached on a best-effort basis: soft memory may be full.
            None => {
                let _ = p.objects.insert(x.id, &o.to_vec());
            }
        }
        TP_OK
    })
}

/// Sets the object's value (`value`: the pool's object size of bytes).
///
/// # Safety
/// `b` is from `tp_soft_box_new`, not yet freed; `value` has the pool's object size of
/// readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_box_write(
    b: *const tp_soft_box,
    value: *const c_void,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(x) = (unsafe { ffi::object(b) }) else {
            return fail(TP_EINVAL, "null box");
        };
        // SAFETY: the caller promises the pool's object size of readable bytes.
        let Some(v) = (unsafe { ffi::bytes(value, x.pool.size) }) else {
            return fail(TP_EINVAL, "null value");
        };
        let _lock = x.pool.stripes.lock(x.id);
        match x.pool.objects.insert(x.id, &v.to_vec()) {
            Ok(()) => TP_OK,
            Err(e) => fail(TP_ESOFT, e.to_string()),
        }
    })
}

/// Sets the object to `desired` if it holds `expected` (both the pool's object size), as one
/// atomic step: `TP_OK` if it did, `TP_MISMATCH` if the object holds something else, and
/// `TP_NOT_FOUND` if it vanished (read it, which rebuilds it, and try again).
///
/// # Safety
/// `b` is from `tp_soft_box_new`, not yet freed; `expected` and `desired` have the pool's
/// object size of readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tp_soft_box_cmpxchg(
    b: *const tp_soft_box,
    expected: *const c_void,
    desired: *const c_void,
) -> tp_status {
    guard(|| {
        // SAFETY: the caller promises a live handle (or null, refused).
        let Some(x) = (unsafe { ffi::object(b) }) else {
            return fail(TP_EINVAL, "null box");
        };
        let size = x.pool.size;
        // SAFETY: the caller promises the pool's object size of readable bytes in each.
        let (e, d) = unsafe { (ffi::bytes(expected, size), ffi::bytes(desired, size)) };
        let (Some(e), Some(d)) = (e, d) else {
            return fail(TP_EINVAL, "null expected or desired value");
        };
        let _lock = x.pool.stripes.lock(x.id);
        match x.pool.objects.get(&x.id) {
            None => fail(TP_NOT_FOUND, "the object vanished; read it to rebuild it"),
            Some(v) if v != e => TP_MISMATCH,
            Some(_) => match x.pool.objects.insert(x.id, &d.to_vec()) {
                Ok(()) => TP_OK,
                Err(e) => fail(TP_ESOFT, e.to_string()),
            },
        }
    })
}
