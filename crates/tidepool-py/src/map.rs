//! `SoftBytesMap`: a soft map of bytes to bytes, whose vanished values a Python callable
//! rebuilds.
//!
//! The map's reconstructor (a `SoftMap` has one, fixed when it is made) calls whatever is on
//! top of this thread's stack of makers: the map's own Python reconstructor, pushed by
//! `get_or_reconstruct`, or a one-off callable pushed by `get_or_call`. `SoftMap` runs the
//! reconstructor on the calling thread, inside the call that pushed the maker and holding no
//! lock, so a maker that reads the same map again (a recursive memoized function) pushes its
//! own maker above and pops it before returning.

use crate::{arena, buffer, soft_error};
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use tidepool_soft::{PoolStats, SoftMap, SoftValue};

type Map = SoftMap<Vec<u8>, Value, PyErr>;

/// A map's value: bytes of its own (written, or made by a reconstructor), or, once read, in
/// this thread's read buffer. Reading into a buffer that is kept spares a large value's read an
/// allocation: a fresh megabyte costs 256 page faults, and reading one into a new `Vec` and
/// then into a new `bytes` made glibc grow and trim its heap by two megabytes on every read
/// (0.9 ms instead of 0.1).
#[derive(Debug)]
pub(crate) enum Value {
    Owned(Vec<u8>),
    Read,
}

/// A read buffer larger than this is given back after use.
const KEEP_READ_BUFFER: usize = 16 << 20;

thread_local! {
    static READ: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl SoftValue for Value {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Owned(v) => out.extend_from_slice(v),
            Value::Read => READ.with(|r| out.extend_from_slice(&r.borrow())),
        }
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        READ.with(|r| {
            let mut r = r.borrow_mut();
            r.clear();
            r.extend_from_slice(bytes);
        });
        Some(Value::Read)
    }
}

impl Value {
    /// As a Python `bytes`, or what `decode` makes of a read-only view of its bytes (a `Read`
    /// value must be taken before this thread reads again).
    fn into_py<'py>(
        self,
        py: Python<'py>,
        decode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (buf, read) = match self {
            Value::Owned(v) => (v, false),
            Value::Read => (READ.with(|r| std::mem::take(&mut *r.borrow_mut())), true),
        };
        let give_back = |buf: Vec<u8>| {
            if read && buf.capacity() <= KEEP_READ_BUFFER {
                READ.with(|r| *r.borrow_mut() = buf);
            }
        };
        let Some(decode) = decode else {
            let b = PyBytes::new(py, &buf).into_any();
            give_back(buf);
            return Ok(b);
        };
        let view = Bound::new(
            py,
            ValueView {
                bytes: Mutex::new(Some(buf)),
                exports: AtomicUsize::new(0),
            },
        )?;
        let out = decode.call1((&view,));
        // The bytes go back for the next read, unless the decoder kept an export of them: the
        // view then keeps them until that ends.
        let back = {
            let v = view.get();
            let mut bytes = v.bytes.lock();
            if v.exports.load(Relaxed) == 0 {
                bytes.take()
            } else {
                None
            }
        };
        if let Some(buf) = back {
            give_back(buf);
        }
        out
    }
}

/// A value's bytes, read-only through the buffer protocol, handed to a decoder
/// (`SoftBytesMap.get(key, decode)`): only for the length of that call, unless the decoder
/// keeps an export of it (a memoryview).
#[pyclass(frozen, module = "tidepool._tidepool")]
#[derive(Debug)]
pub struct ValueView {
    bytes: Mutex<Option<Vec<u8>>>,
    exports: AtomicUsize,
}

#[pymethods]
impl ValueView {
    /// # Safety
    ///
    /// Called by Python with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let guard = me.bytes.lock();
        let Some(bytes) = guard.as_ref() else {
            return Err(PyValueError::new_err(
                "this view of a soft value was for the decoder's call only; decode the value \
                 then, or keep a memoryview of it",
            ));
        };
        let export = buffer::Export {
            buf: bytes.as_ptr() as *mut c_void,
            len: bytes.len(),
            itemsize: 1,
            format: c"B",
            readonly: true,
        };
        // SAFETY: Python passes a valid Py_buffer; the bytes are neither changed nor taken
        // while exports are counted (counted below, under the lock `into_py` takes to take
        // them back), and the view owns them until then.
        unsafe { buffer::fill(view, flags, export, slf.clone().into_any())? };
        me.exports.fetch_add(1, Relaxed);
        drop(guard);
        Ok(())
    }

    /// # Safety
    ///
    /// Called by Python with a `Py_buffer` that `__getbuffer__` filled.
    unsafe fn __releasebuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer) {
        // SAFETY: Python's promise, passed on.
        unsafe { buffer::release(view) };
        let me = slf.get();
        let _guard = me.bytes.lock();
        me.exports.fetch_sub(1, Relaxed);
    }

    fn __len__(&self) -> usize {
        self.bytes.lock().as_ref().map_or(0, Vec::len)
    }
}

/// What rebuilds a value: called with the key, or with nothing.
#[derive(Debug)]
enum Maker {
    ByKey(Py<PyAny>),
    Thunk(Py<PyAny>),
}

/// A maker on the stack, and the `bytes` object it made (returned as it is, no copy).
#[derive(Debug)]
struct Making {
    maker: Maker,
    made: Option<Py<PyBytes>>,
}

thread_local! {
    static MAKERS: RefCell<Vec<Making>> = const { RefCell::new(Vec::new()) };
}

/// A maker pushed for the length of one call; popped on drop (with the GIL held: the calls
/// that push it hold it).
struct Pushed;

impl Pushed {
    fn new(maker: Maker) -> Pushed {
        MAKERS.with(|m| m.borrow_mut().push(Making { maker, made: None }));
        Pushed
    }

    /// What the maker made during this call, if it ran.
    fn made(&self) -> Option<Py<PyBytes>> {
        MAKERS.with(|m| m.borrow_mut().last_mut().and_then(|t| t.made.take()))
    }

    /// A value this call made, as the maker returned it; or read, decoded by `decode`.
    fn value<'py>(
        &self,
        py: Python<'py>,
        v: Value,
        decode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match (self.made(), &v) {
            (Some(made), Value::Owned(_)) => Ok(made.into_bound(py).into_any()),
            _ => v.into_py(py, decode),
        }
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        MAKERS.with(|m| m.borrow_mut().pop());
    }
}

/// The reconstructor of every map: runs the maker on top of the stack.
fn rebuild(key: &[u8]) -> Result<Value, PyErr> {
    Python::attach(|py| {
        let maker = MAKERS.with(|m| {
            m.borrow().last().map(|t| match &t.maker {
                Maker::ByKey(f) => (true, f.clone_ref(py)),
                Maker::Thunk(f) => (false, f.clone_ref(py)),
            })
        });
        let Some((by_key, f)) = maker else {
            return Err(PyRuntimeError::new_err(
                "tidepool: a soft value was rebuilt with no reconstructor in force (a bug)",
            ));
        };
        let value = if by_key {
            f.call1(py, (PyBytes::new(py, key),))?
        } else {
            f.call0(py)?
        };
        let value = value.bind(py);
        if let Ok(b) = value.cast::<PyBytes>() {
            let bytes = b.as_bytes().to_vec();
            let made = b.clone().unbind();
            MAKERS.with(|m| {
                if let Some(top) = m.borrow_mut().last_mut() {
                    top.made = Some(made);
                }
            });
            return Ok(Value::Owned(bytes));
        }
        match value.extract::<Vec<u8>>() {
            Ok(v) => Ok(Value::Owned(v)),
            Err(_) => Err(PyTypeError::new_err(format!(
                "a SoftBytesMap's reconstructor must return bytes, not {}",
                value
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "another type".into())
            ))),
        }
    })
}

#[derive(Debug)]
pub(crate) struct MapCore {
    name: String,
    map: Map,
}

/// Maps alive now, for `tidepool.stats()`.
static LIVE: Mutex<Vec<Weak<MapCore>>> = Mutex::new(Vec::new());

/// Each live map's stats as a dict, with its raw counters.
pub(crate) fn live_stats(py: Python<'_>) -> PyResult<Vec<(Bound<'_, PyDict>, PoolStats)>> {
    let maps: Vec<Arc<MapCore>> = {
        let mut live = LIVE.lock();
        live.retain(|w| w.strong_count() > 0);
        live.iter().filter_map(Weak::upgrade).collect()
    };
    maps.iter()
        .map(|m| Ok((stats_dict(py, m)?, m.map.stats())))
        .collect()
}

fn stats_dict<'py>(py: Python<'py>, m: &MapCore) -> PyResult<Bound<'py, PyDict>> {
    let s = m.map.stats();
    let d = PyDict::new(py);
    d.set_item("name", &m.name)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("reconstructions", s.reconstructions)?;
    d.set_item("reconstruct_failures", s.reconstruct_failures)?;
    d.set_item("reconstruct_us", s.reconstruct_us)?;
    d.set_item("miss_rate", s.miss_rate())?;
    d.set_item("present", m.map.present_len())?;
    d.set_item("indexed", m.map.len())?;
    Ok(d)
}

/// A map of bytes to bytes whose values live in soft memory: they may vanish at any moment
/// (when memory is needed elsewhere) and are rebuilt on their next read by
/// `reconstruct(key) -> bytes`, if given. Keys and the index stay in normal memory.
#[pyclass(frozen, module = "tidepool._tidepool")]
#[derive(Debug)]
pub struct SoftBytesMap {
    core: Arc<MapCore>,
    reconstruct: Mutex<Option<Py<PyAny>>>,
}

impl SoftBytesMap {
    /// Runs `f` on the map without the GIL.
    fn detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Map) -> T + Send) -> T {
        let core = &self.core;
        py.detach(|| f(&core.map))
    }
}

#[pymethods]
impl SoftBytesMap {
    #[new]
    #[pyo3(signature = (reconstruct=None, *, name=None))]
    fn new(reconstruct: Option<Py<PyAny>>, name: Option<String>) -> PyResult<Self> {
        let arena = arena()?;
        let core = Arc::new(MapCore {
            name: name.unwrap_or_else(|| "SoftBytesMap".into()),
            map: SoftMap::fallible(&arena, |k: &Vec<u8>| rebuild(k)),
        });
        LIVE.lock().push(Arc::downgrade(&core));
        Ok(SoftBytesMap {
            core,
            reconstruct: Mutex::new(reconstruct),
        })
    }

    /// The name `tidepool.stats()` lists the map under.
    #[getter]
    fn name(&self) -> &str {
        &self.core.name
    }

    /// The value of `key` if it is in soft memory, else `default` (counted as a hit or a
    /// miss): bytes, or what `decode` returns for a read-only memoryview of them (released
    /// after the call), which spares a copy: `get(key, pickle.loads)`.
    #[pyo3(signature = (key, decode=None, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        decode: Option<&Bound<'py, PyAny>>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.detached(py, |m| m.get(&key.to_vec())) {
            Some(v) => v.into_py(py, decode).map(Some),
            None => Ok(default),
        }
    }

    /// The value of `key`, rebuilt by the reconstructor (and stored) if it vanished or was
    /// never set; None without a reconstructor. The reconstructor's exception propagates. A
    /// value read is decoded as by `get`; one just rebuilt is returned as the reconstructor
    /// returned it.
    #[pyo3(signature = (key, decode=None))]
    fn get_or_reconstruct<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        decode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(f) = self.reconstruct.lock().as_ref().map(|f| f.clone_ref(py)) else {
            return self.get(py, key, decode, None);
        };
        let pushed = Pushed::new(Maker::ByKey(f));
        match self.detached(py, |m| m.try_get_or_reconstruct(key.to_vec()))? {
            Some(v) => pushed.value(py, v, decode).map(Some),
            None => Ok(None),
        }
    }

    /// The value of `key`, or else what `make()` returns (bytes), stored and counted as a
    /// reconstruction: a memoizing cache's read. A value read is decoded as by `get`; one just
    /// made is returned as `make` returned it.
    #[pyo3(signature = (key, make, decode=None))]
    fn get_or_call<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        make: Py<PyAny>,
        decode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let pushed = Pushed::new(Maker::Thunk(make));
        let v = self.detached(py, |m| m.try_get_or_reconstruct(key.to_vec()))?;
        let v = v.ok_or_else(|| PyRuntimeError::new_err("tidepool: a value made was lost"))?;
        pushed.value(py, v, decode)
    }

    /// Stores `value` for `key`. Raises SoftMemoryError when it cannot be held (larger than
    /// the budget, or in a forked child).
    fn insert(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        self.detached(py, |m| {
            m.insert(key.to_vec(), &Value::Owned(value.to_vec()))
        })
        .map_err(soft_error)
    }

    /// Removes `key`; whether it was in the index (its value present or not).
    fn remove(&self, py: Python<'_>, key: &[u8]) -> bool {
        self.detached(py, |m| m.remove(&key.to_vec()))
    }

    /// Whether the value of `key` is in soft memory now (no read, no reconstruction).
    fn __contains__(&self, key: &[u8]) -> bool {
        self.core.map.contains_key(&key.to_vec())
    }

    /// The keys whose values are in soft memory now.
    fn keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        let keys = self.detached(py, |m| m.keys());
        keys.iter().map(|k| PyBytes::new(py, k)).collect()
    }

    /// How many keys have their values in soft memory now.
    fn __len__(&self) -> usize {
        self.core.map.present_len()
    }

    /// Hits, misses, reconstructions (and their mean time in microseconds), keys present and
    /// keys in the index.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.core)
    }

    fn __repr__(&self) -> String {
        format!(
            "<tidepool.SoftBytesMap {:?}: {} of {} keys present>",
            self.core.name,
            self.core.map.present_len(),
            self.core.map.len()
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(guard) = self.reconstruct.try_lock() {
            if let Some(f) = guard.as_ref() {
                visit.call(f)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let f = self.reconstruct.lock().take();
        drop(f);
    }
}
