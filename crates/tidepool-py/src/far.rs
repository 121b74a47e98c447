//! `FarArray`: a one-dimensional array whose bytes live in far memory. Its memory is a region
//! of a userfaultfd pager of its own: at most `local` bytes of it are in this process at a
//! time, the rest in the far store, fetched back on the next touch. Exported through the
//! buffer protocol, so `numpy.asarray(far)` and `memoryview(far)` are views without a copy.

use crate::{buffer, FarMemoryError};
use parking_lot::Mutex;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tidepool_pager::{Config, Pager, PagerError, Region};

/// Local memory an array may use when the caller does not say.
const DEFAULT_LOCAL: usize = 64 << 20;

/// An element type: its struct-module typecode, the format string exported, its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Element {
    pub code: char,
    pub format: &'static CStr,
    pub size: usize,
}

const ELEMENTS: &[Element] = &[
    Element {
        code: 'b',
        format: c"b",
        size: 1,
    },
    Element {
        code: 'B',
        format: c"B",
        size: 1,
    },
    Element {
        code: '?',
        format: c"?",
        size: 1,
    },
    Element {
        code: 'h',
        format: c"h",
        size: 2,
    },
    Element {
        code: 'H',
        format: c"H",
        size: 2,
    },
    Element {
        code: 'i',
        format: c"i",
        size: 4,
    },
    Element {
        code: 'I',
        format: c"I",
        size: 4,
    },
    Element {
        code: 'l',
        format: c"l",
        size: std::mem::size_of::<std::ffi::c_long>(),
    },
    Element {
        code: 'L',
        format: c"L",
        size: std::mem::size_of::<std::ffi::c_ulong>(),
    },
    Element {
        code: 'q',
        format: c"q",
        size: 8,
    },
    Element {
        code: 'Q',
        format: c"Q",
        size: 8,
    },
    Element {
        code: 'e',
        format: c"e",
        size: 2,
    },
    Element {
        code: 'f',
        format: c"f",
        size: 4,
    },
    Element {
        code: 'd',
        format: c"d",
        size: 8,
    },
];

/// The element a typecode names (one character, as in the `array` and `struct` modules and
/// numpy's `dtype.char`).
pub fn element(code: &str) -> Option<Element> {
    let mut chars = code.chars();
    let c = chars.next()?;
    if chars.next().is_some() {
        return None;
    }
    ELEMENTS.iter().copied().find(|e| e.code == c)
}

fn typecodes() -> String {
    ELEMENTS.iter().map(|e| e.code).collect()
}

/// The pager and its region (dropped in this order: the region first).
#[derive(Debug)]
struct Far {
    region: Region,
    pager: Pager,
}

/// What a pager error means, and what to do about it.
fn pager_message(e: &PagerError) -> String {
    let hint = match e {
        PagerError::Userfaultfd(_) => {
            "; FarArray needs userfaultfd with kernel faults: run as root, or give this user \
             read-write access to /dev/userfaultfd"
        }
        PagerError::Reserve(_) => "; the address space or memory may be exhausted",
        _ => "",
    };
    format!("{}{hint}", crate::describe(e))
}

fn pager_error(e: PagerError) -> PyErr {
    FarMemoryError::new_err(pager_message(&e))
}

/// A one-dimensional array of `length` elements of `dtype` (a typecode such as 'd', 'f',
/// 'q', 'B', or a numpy dtype), zero to start with, whose bytes live in far memory: at most
/// `local` bytes of it are in this process at a time (default 64 MiB), the rest in the far
/// store `store` ("local:" in this process, compressed; "node://host:port",
/// "redis://host:port", ...). Use it through numpy (`numpy.asarray(far)`) or `memoryview`.
#[pyclass(frozen, module = "tidepool._tidepool")]
#[derive(Debug)]
pub struct FarArray {
    far: Mutex<Option<Far>>,
    /// Where the region starts (fixed for its life).
    base: usize,
    length: usize,
    element: Element,
    /// Buffers exported and not yet released.
    exports: AtomicUsize,
}

impl FarArray {
    fn with_far<T>(&self, f: impl FnOnce(&Far) -> T) -> PyResult<T> {
        match self.far.lock().as_ref() {
            Some(far) => Ok(f(far)),
            None => Err(PyValueError::new_err("the FarArray is closed")),
        }
    }
}

#[pymethods]
impl FarArray {
    #[new]
    #[pyo3(signature = (length, dtype=None, *, local=None, store="local:"))]
    fn new(
        py: Python<'_>,
        length: i64,
        dtype: Option<&Bound<'_, PyAny>>,
        local: Option<i64>,
        store: &str,
    ) -> PyResult<Self> {
        if length < 0 {
            return Err(PyValueError::new_err(format!(
                "a FarArray's length must be 0 or more, not {length}"
            )));
        }
        let code = match dtype {
            None => "d".to_string(),
            Some(d) => match d.cast::<PyString>() {
                Ok(s) => s.to_str()?.to_string(),
                // A numpy dtype says its typecode in `char`.
                Err(_) => match d.getattr("char") {
                    Ok(c) => c.extract::<String>()?,
                    Err(_) => {
                        return Err(PyTypeError::new_err(
                            "dtype must be a typecode string such as 'd', or a numpy dtype",
                        ))
                    }
                },
            },
        };
        let element = element(&code).ok_or_else(|| {
            PyValueError::new_err(format!(
                "no FarArray of typecode {code:?}; use one of {}",
                typecodes()
            ))
        })?;
        let local = match local {
            None => DEFAULT_LOCAL,
            Some(n) if n <= 0 => {
                return Err(PyValueError::new_err(format!(
                    "local must be a number of bytes above 0, not {n}"
                )))
            }
            Some(n) => n as usize,
        };
        let bytes = (length as usize).checked_mul(element.size).ok_or_else(|| {
            PyValueError::new_err(format!("a FarArray of {length} elements is too large"))
        })?;
        let url = if store == "local" { "local:" } else { store };
        let far = py.detach(|| -> PyResult<Far> {
            let store = tidepool_store::open(url).map_err(|e| {
                FarMemoryError::new_err(format!(
                    "cannot open the far store {url:?}: {}",
                    crate::describe(&e)
                ))
            })?;
            let pager = Pager::start(Config::new(local), store).map_err(pager_error)?;
            let region = Region::new(&pager, bytes).map_err(pager_error)?;
            Ok(Far { region, pager })
        })?;
        Ok(FarArray {
            base: far.region.as_ptr() as usize,
            far: Mutex::new(Some(far)),
            length: length as usize,
            element,
            exports: AtomicUsize::new(0),
        })
    }

    fn __len__(&self) -> usize {
        self.length
    }

    /// The element's typecode ('d', 'f', 'q', ...).
    #[getter]
    fn typecode(&self) -> String {
        self.element.code.to_string()
    }

    /// Bytes of one element.
    #[getter]
    fn itemsize(&self) -> usize {
        self.element.size
    }

    /// Bytes of the array.
    #[getter]
    fn nbytes(&self) -> usize {
        self.length * self.element.size
    }

    /// Local memory the array may use, in bytes; setting it smaller evicts at once.
    #[getter]
    fn get_local(&self) -> PyResult<usize> {
        self.with_far(|f| f.pager.local_budget())
    }

    #[setter]
    fn set_local(&self, bytes: i64) -> PyResult<()> {
        if bytes <= 0 {
            return Err(PyValueError::new_err(format!(
                "local must be a number of bytes above 0, not {bytes}"
            )));
        }
        self.with_far(|f| f.pager.set_local_budget(bytes as usize))
    }

    /// The far store, described.
    #[getter]
    fn store(&self) -> PyResult<String> {
        self.with_far(|f| f.pager.store_description())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.far.lock().is_none()
    }

    /// What the pager has done: faults (and how many went to the far store), evictions,
    /// write-backs, bytes moved, pages resident now and the budget in pages.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, local) = self.with_far(|f| (f.pager.stats(), f.pager.local_budget()))?;
        let d = PyDict::new(py);
        d.set_item("missing_faults", s.missing_faults)?;
        d.set_item("wp_faults", s.wp_faults)?;
        d.set_item("zero_fills", s.zero_fills)?;
        d.set_item("far_fetches", s.far_fetches)?;
        d.set_item("writeback_hits", s.writeback_hits)?;
        d.set_item("prefetched", s.prefetched)?;
        d.set_item("prefetch_planned", s.prefetch_planned)?;
        d.set_item("prefetch_credited", s.prefetch_credited)?;
        d.set_item("evicted", s.evicted)?;
        d.set_item("evicted_clean", s.evicted_clean)?;
        d.set_item("evicted_zero", s.evicted_zero)?;
        d.set_item("written_back", s.written_back)?;
        d.set_item("moved_out", s.moved_out)?;
        d.set_item("frames_repaired", s.frames_repaired)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("bytes_written", s.bytes_written)?;
        d.set_item("discarded", s.discarded)?;
        d.set_item("resident_pages", s.resident_pages)?;
        d.set_item("budget_pages", s.budget_pages)?;
        d.set_item("local_hit_ratio", s.local_hit_ratio())?;
        d.set_item("prefetch_accuracy", s.prefetch_accuracy())?;
        d.set_item("local", local)?;
        Ok(d)
    }

    /// Frees the array's memory, local and far, now (rather than when it is collected).
    /// Raises BufferError while numpy arrays or memoryviews still use it.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.far.lock();
        if self.exports.load(Relaxed) > 0 {
            return Err(PyBufferError::new_err(
                "the FarArray is still in use by numpy arrays or memoryviews; delete them (and \
                 release the memoryviews) before closing it",
            ));
        }
        let far = guard.take();
        drop(guard);
        py.detach(|| drop(far));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        match self.far.lock().as_ref() {
            Some(f) => format!(
                "<tidepool.FarArray of {} x {:?}, {} MiB local, in {}>",
                self.length,
                self.element.code,
                f.pager.local_budget() >> 20,
                f.pager.store_description()
            ),
            None => "<tidepool.FarArray (closed)>".into(),
        }
    }

    /// The buffer protocol: the region's bytes, writable, one dimension.
    ///
    /// # Safety
    ///
    /// Called by Python with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        // Held while exporting, so that `close` cannot free the region in between.
        let guard = me.far.lock();
        if guard.is_none() {
            return Err(PyValueError::new_err("the FarArray is closed"));
        }
        let export = buffer::Export {
            buf: me.base as *mut c_void,
            len: me.length * me.element.size,
            itemsize: me.element.size,
            format: me.element.format,
            readonly: false,
        };
        // SAFETY: Python passes a valid Py_buffer; the region stays mapped while the export
        // holds a reference to this object (`obj`), and `close` refuses while exports are
        // counted (counted below, under the same lock).
        unsafe { buffer::fill(view, flags, export, slf.clone().into_any())? };
        me.exports.fetch_add(1, Relaxed);
        drop(guard);
        Ok(())
    }

    /// Ends an export.
    ///
    /// # Safety
    ///
    /// Called by Python with a `Py_buffer` that `__getbuffer__` filled.
    unsafe fn __releasebuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer) {
        // SAFETY: Python's promise, passed on.
        unsafe { buffer::release(view) };
        slf.get().exports.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typecodes_name_elements() {
        assert_eq!(element("d").unwrap().size, 8);
        assert_eq!(element("B").unwrap().size, 1);
        assert_eq!(element("q").unwrap().format, c"q");
        assert_eq!(element("e").unwrap().size, 2);
        assert!(element("").is_none());
        assert!(element("dd").is_none());
        assert!(element("z").is_none());
        assert_eq!(typecodes().len(), ELEMENTS.len());
    }

    #[test]
    fn no_userfaultfd_says_what_to_do() {
        let e = PagerError::Userfaultfd(std::io::ErrorKind::PermissionDenied.into());
        let m = pager_message(&e);
        assert!(m.starts_with("cannot open a userfaultfd object: "), "{m}");
        assert!(
            m.contains("run as root") && m.contains("/dev/userfaultfd"),
            "{m}"
        );
    }
}
