//! The calling thread's arena table: Memento's hardware object table, in software.
//!
//! It lives in `tp_thread_table`, an initial-exec TLS variable defined by the C shim
//! (`shim/thread_table.c`). Its address is the thread pointer plus a load-time constant read from
//! the GOT: two instructions, no call, and nothing that could allocate.

use crate::classes::CLASSES;

/// The current arena of one class and the list of its free slots, as this thread holds them.
/// Both on one cache line's half, so a free's "is it my current arena?" test and its push touch
/// one line.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Hot {
    /// Address of the current arena (zero: none).
    pub arena: usize,
    /// First free slot of the current arena (each free slot's first word links the next).
    pub free: usize,
}

/// Per-thread state. All zeroes is a valid, empty table (see [`crate::heap`]).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ThreadTable {
    /// Current arena and its free list, per class: Memento's object table.
    pub hot: [Hot; CLASSES],
    /// The small-object region, copied here when the thread registers, so that `free` finds a
    /// pointer's class without loading globals (zero length: check the globals).
    pub region_base: usize,
    pub region_len: usize,
    /// log2 of a class span's length: a region pointer's class is its offset shifted by this.
    pub span_shift: u32,
    /// Whether this thread's exit destructor is armed.
    pub registered: u32,
    /// Non-zero: this thread allocates only from the kernel, never from the region or the page
    /// source (see [`crate::set_thread_unpaged`]). It never gets an arena, so its every
    /// allocation takes the slow path, where this is checked.
    pub unpaged: u32,
    /// Slow-path refills, counted to space out the periodic trim.
    pub refills: u32,
    /// This thread's full arenas per class (a list through the arena headers).
    pub full: [usize; CLASSES],
    /// Where the next look for frees into full arenas starts.
    pub full_cursor: [usize; CLASSES],
    /// This thread's arenas with room that are not current, per class, newest first.
    pub partial: [usize; CLASSES],
    /// The oldest of them: refills take it, as it has had the longest to gather frees.
    pub partial_tail: [usize; CLASSES],
}

/// Whether the calling thread allocates only from the kernel.
#[inline]
pub fn unpaged() -> bool {
    // SAFETY: the calling thread's own table.
    unsafe { (*table()).unpaged != 0 }
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
