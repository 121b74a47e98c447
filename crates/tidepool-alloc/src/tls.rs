//! The calling thread's arena table: Memento's hardware object table, in software.
//!
//! It lives in `tp_thread_table`, an initial-exec TLS variable defined by the C shim
//! (`shim/thread_table.c`). Its address is the thread pointer plus a load-time constant read from
//! the GOT: two instructions, no call, and nothing that could allocate.

use crate::classes::CLASSES;

/// Per-thread state. All zeroes is a valid, empty table (see [`crate::heap`]).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ThreadTable {
    /// Current arena per class, as an offset from the static empty arena (zero: the empty arena).
    pub cur: [usize; CLASSES],
    /// Allocations per class since the last flush into the global statistics.
    pub allocs: [u32; CLASSES],
    /// Frees by this thread into its own arenas, per class, since the last flush.
    pub frees: [u32; CLASSES],
    /// This thread's full arenas per class (a list through the arena headers).
    pub full: [usize; CLASSES],
    /// Where the next look for frees into full arenas starts.
    pub full_cursor: [usize; CLASSES],
    /// This thread's arenas with room that are not current, per class.
    pub partial: [usize; CLASSES],
    /// The small-object region, copied here when the thread registers, so that `free` tells
    /// small pointers from large ones without loading globals (zero length: check the globals).
    pub region_base: usize,
    pub region_len: usize,
    /// Whether this thread's exit destructor is armed.
    pub registered: u32,
    /// Non-zero: this thread allocates only from the kernel, never from the region or the page
    /// source (see [`crate::set_thread_unpaged`]). It never gets an arena, so its every
    /// allocation takes the slow path, where this is checked.
    pub unpaged: u32,
}

/// Whether the calling thread allocates only from the kernel.
#[inline]
pub fn unpaged() -> bool {
    // SAFETY: the calling thread's own table.
    unsafe { (*table()).unpaged != 0 }
}

/// Offset of the thread's empty sentinel arena from its table (see the C shim).
pub const SENTINEL_OFFSET: usize = include!("table_bytes.rs");

/// Address of the calling thread's empty sentinel arena.
#[inline(always)]
pub fn sentinel(tbl: *mut ThreadTable) -> usize {
    tbl as usize + SENTINEL_OFFSET
}

const _: () = assert!(core::mem::size_of::<ThreadTable>() <= include!("table_bytes.rs"));

#[cfg(target_arch = "x86_64")]
extern "C" {
    // Only its address is used, through the GOTTPOFF sequence below.
    #[allow(dead_code)]
    static tp_thread_table: u8;
}

/// The calling thread's table.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn table() -> *mut ThreadTable {
    let addr: usize;
    // SAFETY: the x86-64 initial-exec TLS sequence: %fs:0 holds the thread pointer and the GOT
    // entry the linker fills for `tp_thread_table@GOTTPOFF` holds the variable's offset from it.
    // The shim defines the variable in this same link unit, so the entry always exists. Reads
    // only, and the result is the same for the life of the thread.
    unsafe {
        core::arch::asm!(
            "mov {addr}, qword ptr fs:[0]",
            "add {addr}, qword ptr [rip + {table}@GOTTPOFF]",
            addr = out(reg) addr,
            table = sym tp_thread_table,
            options(pure, readonly, nostack),
        );
    }
    addr as *mut ThreadTable
}

#[cfg(not(target_arch = "x86_64"))]
compile_error!("tidepool-alloc reaches its thread table with x86-64 TLS code; port tls.rs first");
