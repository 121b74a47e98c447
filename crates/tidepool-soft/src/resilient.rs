//! The resilient copy: the only code that touches soft memory.
//!
//! A page of the arena may be revoked (its hole punched) at any moment, by this process or by a
//! coordinator holding the memfd; touching it then raises SIGBUS. [`copy`] is written in
//! assembly; the fixup table is its code range: the SIGBUS handler checks that the faulting
//! address lies in a registered arena and that the instruction is in that range, and if so
//! resumes at the fixup, which returns "lost". Any other
//! SIGBUS goes to the handler installed before ours (Rust's own, by default), so a genuine
//! crash stays a crash.
//!
//! The handler is async-signal-safe: it reads atomics and one saved `sigaction`, and writes
//! the interrupted thread's saved instruction pointer. It is installed once per process and
//! never removed.

use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Once;

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("tidepool-soft's resilient copy is written for x86-64 Linux");

// The fixup table is one range: any fault on an instruction between tidepool_soft_begin and
// tidepool_soft_end resumes at tidepool_soft_fixup, which returns 1. The routines in the range
// are leaf functions that push nothing, so one fixup serves them all.
//
// tidepool_soft_copy(dst: rdi, src: rsi, len: rdx) -> eax: 0 copied, 1 a page was revoked.
// Under 64 bytes it moves qwords, then bytes (a `rep movsb` costs tens of cycles to start);
// from 64 bytes on, `rep movsb` (fast on CPUs with ERMS/FSRM).
std::arch::global_asm!(
    ".pushsection .text.tidepool_soft,\"ax\",@progbits",
    ".p2align 4",
    ".globl tidepool_soft_begin",
    "tidepool_soft_begin:",
    ".globl tidepool_soft_copy",
    ".type tidepool_soft_copy,@function",
    "tidepool_soft_copy:",
    "    cmp rdx, 64",
    "    jae 3f",
    "1:  cmp rdx, 8",
    "    jb 2f",
    "    mov rax, [rsi]",
    "    mov [rdi], rax",
    "    add rsi, 8",
    "    add rdi, 8",
    "    sub rdx, 8",
    "    jmp 1b",
    "2:  test rdx, rdx",
    "    jz 4f",
    "    mov al, [rsi]",
    "    mov [rdi], al",
    "    inc rsi",
    "    inc rdi",
    "    dec rdx",
    "    jmp 2b",
    "3:  mov rcx, rdx",
    "    rep movsb",
    "4:  xor eax, eax",
    "    ret",
    ".size tidepool_soft_copy, . - tidepool_soft_copy",
    ".globl tidepool_soft_end",
    "tidepool_soft_end:",
    ".globl tidepool_soft_fixup",
    "tidepool_soft_fixup:",
    "    mov eax, 1",
    "    ret",
    ".popsection",
);

extern "C" {
    fn tidepool_soft_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
    static tidepool_soft_begin: u8;
    static tidepool_soft_end: u8;
    static tidepool_soft_fixup: u8;
}

/// A page the copy touched had been revoked: what was there is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

/// Copies `len` bytes from `src` to `dst`, either of which may be soft memory; `Err(Lost)` if
/// a page of soft memory on either side had been revoked (the destination may then hold part
/// of the bytes).
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, except that pages of a
/// registered arena ([`register_arena`]) may be revoked. The ranges must not overlap. Bytes
/// read from soft memory may be torn by concurrent writers: callers validate before use.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Lost> {
    // SAFETY: the caller's contract; faults on revoked arena pages return 1 through the
    // handler installed by `register_arena` (which every arena calls before its first copy).
    match unsafe { tidepool_soft_copy(dst, src, len) } {
        0 => Ok(()),
        _ => Err(Lost),
    }
}

/// Arenas whose faults the handler turns into [`Lost`]: (start, end) pairs, 0 when unused.
const MAX_ARENAS: usize = 64;
static ARENAS: [(AtomicUsize, AtomicUsize); MAX_ARENAS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_ARENAS];

/// Makes faults on `[start, end)` inside [`copy`] recoverable; returns the registration's
/// index for [`unregister_arena`], or `None` when all slots are taken.
pub fn register_arena(start: usize, end: usize) -> Option<usize> {
    install_handler();
    for (i, (s, e)) in ARENAS.iter().enumerate() {
        if s.compare_exchange(0, start, AcqRel, Relaxed).is_ok() {
            e.store(end, Release);
            return Some(i);
        }
    }
    None
}

/// Forgets an arena (before it is unmapped).
pub fn unregister_arena(index: usize) {
    let (s, e) = &ARENAS[index];
    e.store(0, Release);
    s.store(0, Release);
}

fn in_arena(addr: usize) -> bool {
    ARENAS.iter().any(|(s, e)| {
        let start = s.load(Acquire);
        start != 0 && addr >= start && addr < e.load(Acquire)
    })
}

/// The handlers that were there before ours (SIGBUS, SIGSEGV), each written once before ours
/// is installed.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 2] = [
    std::mem::MaybeUninit::uninit(),
    std::mem::MaybeUninit::uninit(),
];

/// Forks this process has been through (counted in the child). Arenas made before a fork are
/// not mapped in the child (MADV_DONTFORK): it writes nothing to them, reads find nothing,
/// and values are rebuilt, uncached. Arenas it makes itself work as usual.
static FORKS: AtomicUsize = AtomicUsize::new(0);

/// How many forks this process is from the one that started counting.
pub fn forks() -> usize {
    FORKS.load(Relaxed)
}

extern "C" fn on_fork_child() {
    FORKS.fetch_add(1, Relaxed);
    // The arenas' address ranges are empty in the child: reserve them, inaccessible, so that
    // nothing else is mapped where a stale handle could look (a touch raises SIGSEGV, which
    // the handler turns into "lost").
    for (s, e) in ARENAS.iter() {
        let (start, end) = (s.load(Acquire), e.load(Acquire));
        if start != 0 && end > start {
            // Fork left the range unmapped here; reserving it is async-signal-safe, as code
            // run after fork must be.
            tidepool_sys::vm::reserve_inaccessible_at(start, end - start);
        }
    }
}
static INSTALL: Once = Once::new();

fn install_handler() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction is plain data; all-zero is a valid value to fill in.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_fault;
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: an empty signal set in our own struct.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // A revoked page raises SIGBUS; in a forked child the arena is not mapped at all, and
        // touching it raises SIGSEGV.
        for (i, sig) in [libc::SIGBUS, libc::SIGSEGV].into_iter().enumerate() {
            // SAFETY: PREVIOUS[i] is written here, once, before the handler that reads it
            // exists; sigaction fills it with the old action.
            let rc = unsafe {
                libc::sigaction(
                    sig,
                    &action,
                    (&raw mut PREVIOUS[i]).cast::<libc::sigaction>(),
                )
            };
            assert_eq!(
                rc,
                0,
                "sigaction({sig}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: registers a plain function, run in the child after fork.
        unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) };
    });
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    unsafe {
        let addr = (*info).si_addr() as usize;
        let uc = ctx.cast::<libc::ucontext_t>();
        let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
        let pc = *rip as usize;
        if in_arena(addr)
            && pc >= &raw const tidepool_soft_begin as usize
            && pc < &raw const tidepool_soft_end as usize
        {
            *rip = &raw const tidepool_soft_fixup as i64;
            return;
        }
        chain(sig, info, ctx);
    }
}

/// Hands a fault that is not ours to the previous handler; with none, restores the default
/// action so that the faulting instruction, run again on return, kills the process as it
/// would have without us.
///
/// # Safety
///
/// Called from the signal handler with its arguments.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let i = if sig == libc::SIGBUS { 0 } else { 1 };
    // SAFETY: PREVIOUS was filled before our handler was installed and is never written again.
    let prev: &libc::sigaction = unsafe { &*(&raw const PREVIOUS[i]).cast::<libc::sigaction>() };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: a default action in our own struct; sigaction is async-signal-safe.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it takes these.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler takes the signal number.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_copies_every_length() {
        let src: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 300] {
            let mut dst = vec![0u8; len];
            // SAFETY: both buffers hold `len` bytes.
            unsafe { copy(dst.as_mut_ptr(), src.as_ptr(), len) }.unwrap();
            assert_eq!(dst, src[..len]);
        }
    }
}
