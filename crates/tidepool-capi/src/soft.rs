//! Soft memory for C: an arena, pools of fixed-size objects rebuilt by a callback (Midas's
//! `SoftMemPool` and `SoftUniquePtr`), and maps and arrays of bytes.

use crate::ffi::{self, User};
use crate::{construct, fail, guard, tp_status};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tidepool_soft::{ArenaConfig, AutoBudget, PoolStats, SoftArena, SoftMap, SoftVec};

use tp_status::*;

/// Soft memory: objects here may vanish at any moment and are rebuilt on their next read.
#[derive(Debug)]
pub struct tp_arena(Arc<SoftArena>);

/// A byte buffer a reconstruct callback fills with `tp_buf_append`.
#[derive(Debug, Default)]
pub struct tp_buf(Vec<u8>);

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
            config.budget = budget;
        }
        let arena = SoftArena::new(config).map_err(|e| format!("{e}"))?;
        arena
            .start_evacuator(0.02, 0.05)
            .map_err(|e| format!("cannot start the evacuator: {e}"))?;
        if auto != 0 {
            arena
                .start_auto_budget(AutoBudget::default())
                .map_err(|e| format!("cannot start the automatic budget: {e}"))?;
        }
        Ok(tp_arena(arena))
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
        a.0.set_budget(bytes);
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
unsafe fn copy_out(v: &[u8], out: *mut c_void, cap: usize, len: *mut usize) -> tp_status {
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
struct Stripes([Mutex<()>; 64]);

impl Default for Stripes {
    fn default() -> Self {
        Stripes(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl Stripes {
    fn lock(&self, id: u64) -> MutexGuard<'_, ()> {
        // Nothing is kept under these locks, so a panic while holding one leaves nothing
        // half-done: a poisoned lock is simply taken.
        self.0[(id % 64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

// ---- pools and boxes ---------------------------------------------------------------------

/// Objects of one size rebuilt by one callback (Midas's `SoftMemPool`).
#[derive(Debug)]
pub struct tp_soft_pool(Arc<Pool>);

#[derive(Debug)]
struct Pool {
    objects: SoftMap<u64, Vec<u8>>,
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
            objects: SoftMap::new(&a.0),
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

// ---- maps --------------------------------------------------------------------------------

/// A map from byte strings to byte strings in soft memory.
#[derive(Debug)]
pub struct tp_soft_map(Map);

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
        Ok(tp_soft_map(match reconstruct {
            Some(f) => Map::Rebuilt(SoftMap::fallible(&a.0, move |k: &Vec<u8>| {
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
            None => Map::Plain(SoftMap::new(&a.0)),
        }))
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
        match m.0.get(k) {
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
        match m.0.insert(k, v) {
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
        if m.0.remove(k) {
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
    unsafe { ffi::object(map) }.map_or(0, |m| m.0.len())
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
        unsafe { ffi::put(out, m.0.stats().into()) };
        TP_OK
    })
}

// ---- arrays ------------------------------------------------------------------------------

/// A fixed-length array of byte strings in soft memory, each rebuilt from its index (Midas's
/// `SoftArray`).
#[derive(Debug)]
pub struct tp_soft_array {
    v: SoftVec<Vec<u8>, c_int>,
    stripes: Stripes,
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
        let v = SoftVec::fallible(&a.0, len, move |i| {
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

fn reconstruct_failed(rc: c_int) -> tp_status {
    fail(
        TP_ERECONSTRUCT,
        format!("the reconstruct callback returned {rc}"),
    )
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
