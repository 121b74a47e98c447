//! `SoftBytesMap`: a soft map of bytes to bytes, whose vanished values a Python callable
//! rebuilds.
//!
//! The map's reconstructor (a `SoftMap` has one, fixed when it is made) calls whatever is on
//! top of this thread's stack of makers: the map's own Python reconstructor, pushed by
//! `get_or_reconstruct`, or a one-off callable pushed by `get_or_call`. `SoftMap` runs the
//! reconstructor on the calling thread, inside the call that pushed the maker and holding no
//! lock, so a maker that reads the same map again (a recursive memoized function) pushes its
//! own maker above and pops it before returning.

use crate::{arena, soft_error};
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::cell::RefCell;
use std::sync::{Arc, Weak};
use tidepool_soft::{PoolStats, SoftMap};

type Map = SoftMap<Vec<u8>, Vec<u8>, PyErr>;

/// What rebuilds a value: called with the key, or with nothing.
#[derive(Debug)]
enum Maker {
    ByKey(Py<PyAny>),
    Thunk(Py<PyAny>),
}

thread_local! {
    static MAKERS: RefCell<Vec<Maker>> = const { RefCell::new(Vec::new()) };
}

/// A maker pushed for the length of one call; popped on drop (with the GIL held: the calls
/// that push it hold it).
struct Pushed;

impl Pushed {
    fn new(maker: Maker) -> Pushed {
        MAKERS.with(|m| m.borrow_mut().push(maker));
        Pushed
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        MAKERS.with(|m| m.borrow_mut().pop());
    }
}

/// The reconstructor of every map: runs the maker on top of the stack.
fn rebuild(key: &[u8]) -> Result<Vec<u8>, PyErr> {
    Python::attach(|py| {
        let maker = MAKERS.with(|m| {
            m.borrow().last().map(|mk| match mk {
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
            return Ok(b.as_bytes().to_vec());
        }
        value.extract::<Vec<u8>>().map_err(|_| {
            PyTypeError::new_err(format!(
                "a SoftBytesMap's reconstructor must return bytes, not {}",
                value
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "another type".into())
            ))
        })
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

    /// The value of `key` if it is in soft memory, else None (counted as a hit or a miss).
    fn get<'py>(&self, py: Python<'py>, key: &[u8]) -> Option<Bound<'py, PyBytes>> {
        let v = self.detached(py, |m| m.get(&key.to_vec()))?;
        Some(PyBytes::new(py, &v))
    }

    /// The value of `key`, rebuilt by the reconstructor (and stored) if it vanished or was
    /// never set; None without a reconstructor. The reconstructor's exception propagates.
    fn get_or_reconstruct<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let Some(f) = self.reconstruct.lock().as_ref().map(|f| f.clone_ref(py)) else {
            return Ok(self.get(py, key));
        };
        let _pushed = Pushed::new(Maker::ByKey(f));
        let v = self.detached(py, |m| m.try_get_or_reconstruct(key.to_vec()))?;
        Ok(v.map(|v| PyBytes::new(py, &v)))
    }

    /// The value of `key`, or else what `make()` returns (bytes), stored and counted as a
    /// reconstruction: a memoizing cache's read.
    fn get_or_call<'py>(
        &self,
        py: Python<'py>,
        key: &[u8],
        make: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let _pushed = Pushed::new(Maker::Thunk(make));
        let v = self.detached(py, |m| m.try_get_or_reconstruct(key.to_vec()))?;
        let v = v.ok_or_else(|| PyRuntimeError::new_err("tidepool: a value made was lost"))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Stores `value` for `key`. Raises SoftMemoryError when it cannot be held (larger than
    /// the budget, or in a forked child).
    fn insert(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        self.detached(py, |m| m.insert(key.to_vec(), &value.to_vec()))
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
