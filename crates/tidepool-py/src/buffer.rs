//! Filling and releasing the `Py_buffer` of a one-dimensional, C-contiguous export: what
//! `FarArray` and the views of read values share.

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_int, c_void, CStr};

/// What an export keeps: its shape and stride (the buffer points at them).
struct Layout {
    shape: [isize; 1],
    strides: [isize; 1],
}

/// One dimension of `len / itemsize` elements of `format`, starting at `buf`.
#[derive(Debug, Clone, Copy)]
pub struct Export {
    pub buf: *mut c_void,
    /// Bytes.
    pub len: usize,
    pub itemsize: usize,
    pub format: &'static CStr,
    pub readonly: bool,
}

/// Fills `view` for `flags` (as the `array` module does: the format, shape and strides only
/// when asked for), the exporter `owner` taking a reference in `obj`.
///
/// # Safety
///
/// `view` is the valid `Py_buffer` Python passed to `__getbuffer__`; `export.buf` stays valid
/// for `export.len` bytes (and unchanged, if read-only) until [`release`] is called for it.
pub unsafe fn fill(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    export: Export,
    owner: Bound<'_, PyAny>,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("a null Py_buffer"));
    }
    if export.readonly && flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err("the buffer is read-only"));
    }
    let want = |flag: c_int| flags & flag == flag;
    let layout = Box::into_raw(Box::new(Layout {
        shape: [(export.len / export.itemsize.max(1)) as isize],
        strides: [export.itemsize as isize],
    }));
    // SAFETY: `view` is valid (the caller's promise, and non-null); `layout` is ours until
    // `release` frees it, so the shape and strides stay valid for the export's life; the
    // format strings are static; the bytes are valid as the caller promises.
    unsafe {
        (*view).buf = export.buf;
        (*view).len = export.len as isize;
        (*view).readonly = export.readonly as c_int;
        (*view).itemsize = export.itemsize as isize;
        (*view).format = if want(ffi::PyBUF_FORMAT) {
            export.format.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if want(ffi::PyBUF_ND) {
            (*layout).shape.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if want(ffi::PyBUF_STRIDES) {
            (*layout).strides.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = layout.cast();
        (*view).obj = owner.into_ptr();
    }
    Ok(())
}

/// Frees what [`fill`] allocated for `view`.
///
/// # Safety
///
/// `view` is a `Py_buffer` that [`fill`] filled, released once (Python's promise).
pub unsafe fn release(view: *mut ffi::Py_buffer) {
    // SAFETY: `internal` is the layout `fill` leaked for this export, freed once.
    unsafe {
        let layout = (*view).internal.cast::<Layout>();
        if !layout.is_null() {
            drop(Box::from_raw(layout));
            (*view).internal = std::ptr::null_mut();
        }
    }
}
