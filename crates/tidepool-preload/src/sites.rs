//! Naming memory by what asked for it, for the pager's sections (`--stats`, `tidepool status`).
//!
//! The heap's size classes are named by rule (see `lib.rs`). A range of the large region is
//! named when it is handed out, by its kind (`mmap`, `malloc` for objects too large for the
//! classes, `brk`) and its call site: the first return address on the stack outside this
//! library, as `module!symbol` (the nearest dynamic symbol before it) or `module+offset`
//! where there is none. Both survive the program's addresses moving between runs (ASLR), so
//! a profile can name a section of another run of the same build.
//!
//! The stack is walked with the unwinder the program already has (libgcc's
//! `_Unwind_Backtrace`, which reads `.eh_frame`), a few microseconds a call; each call site's
//! section is cached by its return address. The cache is only ever `try_lock`ed: a thread
//! forked while another held it finds it busy for good and names without it.

use crate::Runtime;
use libc::{c_int, c_void};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tidepool_pager::SectionId;

/// Frames looked at for a caller outside this library.
const FRAMES: usize = 12;

extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

/// `_URC_NO_REASON`: go on walking; `_URC_NORMAL_STOP`: enough.
const GO_ON: c_int = 0;
const STOP: c_int = 4;

struct Walk {
    ips: [usize; FRAMES],
    len: usize,
}

extern "C" fn frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` that `return_addresses` passed, alive and not otherwise
    // borrowed during the walk; `ctx` is the unwinder's context for this frame.
    let (walk, ip) = unsafe { (&mut *(arg as *mut Walk), _Unwind_GetIP(ctx)) };
    if walk.len == FRAMES {
        return STOP;
    }
    walk.ips[walk.len] = ip;
    walk.len += 1;
    GO_ON
}

/// The return addresses on this thread's stack, innermost first.
fn return_addresses() -> Walk {
    let mut walk = Walk {
        ips: [0; FRAMES],
        len: 0,
    };
    // SAFETY: the callback only writes into `walk`, which outlives the call.
    unsafe { _Unwind_Backtrace(frame, &mut walk as *mut Walk as *mut c_void) };
    walk
}

/// What the loader knows of a code address.
struct Place {
    module_base: usize,
    module: String,
    symbol: Option<(String, usize)>,
}

fn place(ip: usize) -> Option<Place> {
    // SAFETY: Dl_info is pointers and integers, valid when zero.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and writes `info`, which it may.
    if unsafe { libc::dladdr(ip as *const c_void, &mut info) } == 0 {
        return None;
    }
    let text = |p: *const libc::c_char| {
        // SAFETY: dladdr's strings are NUL-terminated and live as long as the module.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let module = match main_program() {
        Some((base, name)) if *base == info.dli_fbase as usize => name.clone(),
        _ => {
            let path = text(info.dli_fname).unwrap_or_default();
            path.rsplit('/').next().unwrap_or("").to_string()
        }
    };
    Some(Place {
        module_base: info.dli_fbase as usize,
        module,
        symbol: text(info.dli_sname).map(|s| (s, ip - info.dli_saddr as usize)),
    })
}

/// The main program's load address and file name. glibc's `dladdr` names the main program by
/// `argv[0]`, which a program may rewrite (redis-server puts its address and port there, so
/// its sections' names would change with the port): it is named by `/proc/self/exe` instead.
fn main_program() -> Option<&'static (usize, String)> {
    static MAIN: std::sync::OnceLock<Option<(usize, String)>> = std::sync::OnceLock::new();
    MAIN.get_or_init(|| {
        // SAFETY: getauxval reads the auxiliary vector the kernel passed; it has no
        // preconditions.
        let entry = unsafe { libc::getauxval(libc::AT_ENTRY) } as usize;
        // SAFETY: Dl_info is pointers and integers, valid when zero.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables and writes `info`, which it may.
        if entry == 0 || unsafe { libc::dladdr(entry as *const c_void, &mut info) } == 0 {
            return None;
        }
        let exe = std::fs::read_link("/proc/self/exe").ok()?;
        let name = tidepool_pager::profile::exe_name(&exe);
        Some((info.dli_fbase as usize, name))
    })
    .as_ref()
}

/// This library's addresses, `[start, end)`: a frame there is ours, found without a lookup
/// (`dladdr` searches a module's whole symbol table, tens of microseconds in libpython's).
fn own_range() -> (usize, usize) {
    static RANGE: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
    if RANGE[1].load(Relaxed) == 0 {
        let base = place(own_range as *const () as usize).map_or(0, |p| p.module_base);
        let mut found = (base, 0usize);
        // SAFETY: the callback only reads the loader's description of each module and writes
        // `found`, which outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(module_end), &mut found as *mut _ as *mut c_void) };
        RANGE[0].store(found.0, Relaxed);
        RANGE[1].store(found.1.max(found.0 + 1), Relaxed);
    }
    (RANGE[0].load(Relaxed), RANGE[1].load(Relaxed))
}

/// `dl_iterate_phdr`'s callback: for the module loaded at `found.0`, the end of its last
/// loaded segment into `found.1`.
unsafe extern "C" fn module_end(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    found: *mut c_void,
) -> c_int {
    // SAFETY: the loader passes a valid description for the call; `found` is the tuple
    // `own_range` passed.
    let (info, found) = unsafe { (&*info, &mut *(found as *mut (usize, usize))) };
    if info.dlpi_addr as usize != found.0 || info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers of the module.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    for h in headers.iter().filter(|h| h.p_type == libc::PT_LOAD) {
        found.1 = found.1.max(found.0 + (h.p_vaddr + h.p_memsz) as usize);
    }
    1
}

/// The name of a call site: `module!symbol`, or `module+0xoffset` without a symbol; text
/// only (control characters become `?`), at most 80 characters.
fn site_name(ip: usize) -> Option<String> {
    let p = place(ip)?;
    let name = match p.symbol {
        Some((s, _)) => format!("{}!{s}", p.module),
        None => format!("{}+{:#x}", p.module, ip - p.module_base),
    };
    Some(
        name.chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .take(80)
            .collect(),
    )
}

thread_local! {
    /// This thread is walking its stack: an allocation the unwinder makes meanwhile (libgcc
    /// sorts the FDEs of frames registered at run time into a malloc'd array, under its own
    /// lock) must not walk again, or it would wait for that lock forever.
    static WALKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The first return address outside this library (the program's call), if the walk finds one.
fn caller() -> Option<usize> {
    if WALKING.with(|w| w.replace(true)) {
        return None;
    }
    let (start, end) = own_range();
    let walk = return_addresses();
    WALKING.with(|w| w.set(false));
    walk.ips[..walk.len]
        .iter()
        .copied()
        .find(|&ip| ip > 1 && !(start..end).contains(&ip))
}

static CACHE: Mutex<Option<HashMap<(usize, &'static str), SectionId>>> = Mutex::new(None);

/// The section for a range of kind `kind` handed to the code that called into this library.
pub(crate) fn caller_section(rt: &Runtime, kind: &'static str) -> SectionId {
    let Some(ip) = caller() else {
        return rt.pager.section(kind);
    };
    if let Some(cache) = CACHE.try_lock() {
        if let Some(id) = cache.as_ref().and_then(|c| c.get(&(ip, kind))) {
            return *id;
        }
    }
    // A return address points after the call: name the call itself.
    let name = match site_name(ip - 1) {
        Some(site) => format!("{kind} {site}"),
        None => kind.to_string(),
    };
    let id = rt.pager.section(&name);
    if let Some(mut cache) = CACHE.try_lock() {
        cache
            .get_or_insert_with(HashMap::new)
            .insert((ip, kind), id);
    }
    id
}
