//! The few system calls Tidepool makes by hand, each behind a safe function.
//!
//! [`set_affinity`], [`pin_process`]: CPU placement, which on small VMs decides latency more
//! than code does (a wake-up across vCPUs costs tens of microseconds). [`fork_exec`] and
//! [`reap_child`]: a program started so that its peak RSS is its own, and that peak, which the
//! standard library's `wait` drops.
//!
//! [`vm`]: address space: reservations ([`map_noreserve`], [`vm::Mapping`]), fixed mappings,
//! protections, discards and what the page tables hold (memory-node arena, pager).
//!
//! [`uffd`]: userfaultfd: the object with its features negotiated ([`userfaultfd`]) and its
//! ioctls ([`uffd::Uffd`], the pager's page server).
//!
//! [`memfd`]: a memfd mapped shared whose holes raise SIGBUS ([`memfd::SigbusMap`], soft
//! memory's arenas), populated and punched with fallocate.
//!
//! [`rseq`]: where another thread of the process runs, read from its restartable-sequences
//! area with one load (the pager follows the program's CPU fault by fault).
//!
//! Every userfaultfd, memfd and mmap wrapper of the workspace is here: the pager and soft
//! memory share them.
//!
//! [`raw`]: system calls made with the instruction inline ([`syscall!`]), never through libc's
//! `syscall()`, which `tidepool run` interposes.
//!
//! [`exec_static`]: a statically linked program mapped into this process and entered, as
//! `execve` would start it, so that it runs beside the pager.
//!
//! [`seccomp`]: a filter that holds a program's own memory system calls for a listening thread
//! (statically linked programs under `tidepool run`).
//!
//! [`recv_into`]: socket reads straight into the unused capacity of a receive buffer, so
//! received bytes are neither zero-filled first nor copied afterwards (decoded payloads are
//! slices of this buffer). The standard library offers no stable way to read into
//! uninitialised memory.

pub mod exec_static;
pub mod interrupts;
pub mod memfd;
pub mod probe;
pub mod raw;
pub mod rseq;
pub mod seccomp;
pub mod seqpacket;
pub mod size;
pub mod supervise;
pub mod uffd;
pub mod vm;

pub use uffd::{userfaultfd, FaultsFrom};
pub use vm::map_noreserve;

/// Bytes in a page (x86-64 and arm64 with 4 KiB pages; the pager checks the kernel's at
/// startup).
pub const PAGE: usize = 4096;

use bytes::BytesMut;
use std::io;
use std::os::fd::AsRawFd;

/// Receives at most the buffer's spare capacity; returns the bytes received (0: peer closed).
pub fn recv_into(stream: &impl AsRawFd, buf: &mut BytesMut) -> io::Result<usize> {
    recv_into_with(stream, buf, 0)
}

/// [`recv_into`] without blocking: `WouldBlock` when nothing has arrived.
pub fn recv_into_now(stream: &impl AsRawFd, buf: &mut BytesMut) -> io::Result<usize> {
    recv_into_with(stream, buf, libc::MSG_DONTWAIT)
}

fn recv_into_with(
    stream: &impl AsRawFd,
    buf: &mut BytesMut,
    flags: libc::c_int,
) -> io::Result<usize> {
    if buf.capacity() == buf.len() {
        buf.reserve(16 << 10);
    }
    let spare = buf.spare_capacity_mut();
    loop {
        // SAFETY: `spare` is writable memory owned by `buf`, valid for `spare.len()` bytes;
        // recv writes at most that many and does not read them.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                flags,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        // SAFETY: recv initialised exactly the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        return Ok(n);
    }
}

/// Restricts thread `tid` (0: the calling thread) to `cpus`.
pub fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cpu out of range",
            ));
        }
        // SAFETY: `c` is below CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel only reads it.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Restricts every thread of process `pid` to `cpus` (threads it starts later inherit the
/// placement of the thread that starts them).
pub fn pin_process(pid: u32, cpus: &[usize]) -> io::Result<()> {
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let tid: i32 = entry?
            .file_name()
            .to_string_lossy()
            .parse()
            .map_err(|_| io::Error::other("odd task id"))?;
        match set_affinity(tid, cpus) {
            // A thread that exited meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            r => r?,
        }
    }
    Ok(())
}

/// Reaps child process `pid`, waiting for it to exit if it has not, and returns how it ended
/// and its peak resident set in KiB (`ru_maxrss` of `wait4`): the one measure of a child's
/// memory the kernel still holds once it has exited, for programs that do not report their own.
pub fn reap_child(pid: u32) -> io::Result<(std::process::ExitStatus, u64)> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are writable and of the types wait4 fills.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok((
        std::process::ExitStatus::from_raw(status),
        u64::try_from(usage.ru_maxrss).unwrap_or(0),
    ))
}

/// Starts `program` (a path) with `argv` (its name first) and the whole environment `envp`
/// (`NAME=value`) in directory `cwd`, standard streams from the three descriptors, in a child
/// made by `fork`; returns its pid (reap it with [`reap_child`]).
///
/// Why `fork` rather than `std::process::Command` (posix_spawn, a vfork): the kernel carries a
/// process's peak RSS across `execve`, so a program started from the caller's own address space
/// reports the caller's peak as its own floor. A forked child's copy holds only the caller's
/// anonymous pages, so a small caller (a fresh worker process) measures the program alone.
///
/// The child calls only async-signal-safe functions (chdir, dup2, fcntl, execve, write,
/// _exit), so a multithreaded caller is safe too.
pub fn fork_exec(
    program: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    envp: &[std::ffi::CString],
    cwd: &std::ffi::CStr,
    stdio: [std::os::fd::BorrowedFd<'_>; 3],
) -> io::Result<u32> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // Everything the child needs is built before the fork: it must not allocate.
    let pointers = |v: &[std::ffi::CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let (argv, envp) = (pointers(argv), pointers(envp));
    let fds = stdio.map(|f| f.as_raw_fd());
    // The child reports a failure to exec as its errno on this pipe, closed on a successful
    // exec (close-on-exec), as std does.
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: `pipe` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fork has no memory-safety preconditions; the child below only calls
    // async-signal-safe functions on data prepared above and leaves by execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child: every pointer was built before the fork and stays valid; on any
        // failure the errno goes to the pipe and the child exits without unwinding.
        unsafe {
            let fail = |fd: libc::c_int| -> ! {
                let errno = *libc::__errno_location();
                libc::write(fd, (&errno as *const libc::c_int).cast(), 4);
                libc::_exit(127)
            };
            if libc::chdir(cwd.as_ptr()) != 0 {
                fail(pipe[1]);
            }
            for (target, &fd) in fds.iter().enumerate() {
                let target = target as libc::c_int;
                let r = if fd == target {
                    libc::fcntl(fd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, target)
                };
                if r < 0 {
                    fail(pipe[1]);
                }
            }
            libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
            fail(pipe[1]);
        }
    }
    // SAFETY: both ends are ours; the write end is closed here so the read below ends when
    // the child execs (or exits).
    let mut reader = unsafe {
        libc::close(pipe[1]);
        std::fs::File::from_raw_fd(pipe[0])
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut errno = [0u8; 4];
    match reader.read(&mut errno)? {
        0 => Ok(pid as u32),
        _ => {
            let _ = reap_child(pid as u32);
            Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
        }
    }
}

/// CPUs online on the machine, whatever this thread's affinity allows.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// Sets a socket's send buffer size (`SO_SNDBUF`). The kernel doubles the value and caps it at
/// `net.core.wmem_max`; setting it also turns off the kernel's automatic tuning for this socket.
pub fn set_send_buffer(sock: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    set_int_option(sock, libc::SO_SNDBUF, bytes)
}

fn set_int_option(sock: &impl AsRawFd, option: libc::c_int, value: usize) -> io::Result<()> {
    let v: libc::c_int = value.min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: passes a valid c_int and its size; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A thread made with `pthread_create` directly, whose first instruction is the caller's.
///
/// `std::thread::spawn` runs code of its own on the new thread before the closure (spawn
/// hooks, whose thread-local registers a destructor through glibc, which calls malloc). A
/// pager serving the heap that malloc uses must mark its threads before anything on them
/// allocates, so its threads start here. Joined on [`RawThread::join`]; detached if dropped.
///
/// Each thread runs on a stack of its own mapping, made with the raw system call, never one of
/// glibc's cached stacks: reusing a cached stack clears the thread-local vector of its last
/// owner, which the program's malloc allocated, and that memory may be paged out; in a forked
/// child whose pager is not running yet the touch would wait forever.
///
/// Every signal that can be blocked is blocked on the new thread from its first instruction:
/// a signal meant for the program must never run the program's handler on a thread of ours
/// (the handler may touch memory only such a thread can bring back, or the alternate signal
/// stack the program set up, which this thread does not have).
#[derive(Debug)]
pub struct RawThread {
    id: libc::pthread_t,
    joined: bool,
    /// The thread's stack mapping (address, length), unmapped after a join.
    stack: (usize, usize),
}

/// The calling thread's kernel id (what userfaultfd names a faulting thread by).
pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// The CPU time the calling thread has used, in nanoseconds (a system call, not the vDSO).
pub fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `t` is; this clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The CPU the calling thread runs on (none if the kernel will not say).
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes nothing.
    let c = unsafe { libc::sched_getcpu() };
    (c >= 0).then_some(c as usize)
}

/// This process's RLIMIT_NICE (the lowest nice value it may set is 20 minus it).
pub fn nice_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `r` is.
    (unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut r) } == 0).then_some(r.rlim_cur)
}

/// Puts thread `tid` (0: the calling thread) at SCHED_IDLE priority (`idle`), or back at the
/// normal policy: an idle-priority thread runs only on a CPU nothing else wants, and the
/// scheduler counts its CPU as idle when it places a thread it wakes.
pub fn set_idle_priority(tid: i32, idle: bool) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: sched_setscheduler reads one sched_param, which `param` is.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes the calling thread's thread-locals that have destructors now, while it holds no lock
/// and serves no fault: the first time a thread parks on a contended parking_lot lock, its
/// parking data registers a destructor, and glibc's `__cxa_thread_atexit_impl` takes the
/// loader's lock to do it. A pager thread doing that while it served a fault of a program
/// thread that held the loader's lock waited for ever: CPython at exit, in `_dl_fini`, walking
/// link maps its malloc had placed in paged memory, against a handler parking on the store's
/// lock to drop the page's far copy (1 run in 80 of a 400k-entry dict at 8 MiB).
pub fn prime_thread_locals() {
    static KEY: u8 = 0;
    // SAFETY: parks on the address of a static nothing else parks on, and the validation
    // fails, so `park` only takes this thread's parking data (making it) and returns
    // `Invalid` without sleeping; no callback touches anything.
    let _ = unsafe {
        parking_lot_core::park(
            &KEY as *const u8 as usize,
            || false,
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            None,
        )
    };
    // std's handle of the current thread is a thread-local with a destructor too.
    let _ = std::thread::current();
}

/// Stack of a raw thread.
const RAW_STACK: usize = 2 << 20;

type ThreadMain = Box<dyn FnOnce() + Send + 'static>;

extern "C" fn raw_thread_entry(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `spawn_raw` passes a `Box<ThreadMain>` it leaked for this thread alone.
    let f = unsafe { Box::from_raw(arg.cast::<ThreadMain>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        // The panic message is printed already; unwinding out of a C entry point is not
        // allowed, and a pager missing a thread would hang its program instead of failing.
        std::process::abort();
    }
    std::ptr::null_mut()
}

/// Starts `f` on a new thread named `name` (cut to the kernel's 15 bytes).
pub fn spawn_raw(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<RawThread> {
    // SAFETY: a fresh private mapping from the kernel (the raw system call: a preloaded
    // library may interpose mmap), with a guard page at its low end.
    let stack = unsafe {
        let p = crate::syscall!(
            libc::SYS_mmap,
            std::ptr::null_mut::<libc::c_void>(),
            RAW_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p < 0 {
            return Err(io::Error::last_os_error());
        }
        crate::syscall!(libc::SYS_mprotect, p, 4096, libc::PROT_NONE);
        p as usize
    };
    let unmap_stack = || {
        // SAFETY: the mapping made above, which no thread runs on.
        unsafe { crate::syscall!(libc::SYS_munmap, stack, RAW_STACK) };
    };
    // SAFETY: plain data, initialised by pthread_attr_init before any other use.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `attr` is writable; the stack is a mapping of ours of the size given.
    unsafe {
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstack(&mut attr, stack as *mut libc::c_void, RAW_STACK);
    }
    let arg = Box::into_raw(Box::new(Box::new(f) as ThreadMain));
    let mut id: libc::pthread_t = 0;
    // A new thread starts with its creator's signal mask: everything blocked for the moment of
    // the creation, so that no signal can reach the new thread before its first instruction.
    // SAFETY: sigset_t is plain data; sigfillset initialises it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `old` receives the current mask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid signal sets; the kernel leaves SIGKILL and SIGSTOP unblockable.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: `id` and `attr` are valid; the entry point takes ownership of `arg` exactly
    // once, and only if the thread is created.
    let rc = unsafe { libc::pthread_create(&mut id, &attr, raw_thread_entry, arg.cast()) };
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    // SAFETY: initialised above, no longer needed.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if rc != 0 {
        // SAFETY: the thread was not created, so `arg` is still ours.
        drop(unsafe { Box::from_raw(arg) });
        unmap_stack();
        return Err(io::Error::from_raw_os_error(rc));
    }
    let mut cname = [0u8; 16];
    let n = name.len().min(15);
    cname[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: a live thread of ours and a NUL-terminated name of at most 16 bytes.
    unsafe { libc::pthread_setname_np(id, cname.as_ptr().cast()) };
    Ok(RawThread {
        id,
        joined: false,
        stack: (stack, RAW_STACK),
    })
}

impl RawThread {
    /// Waits for the thread to finish.
    pub fn join(mut self) {
        self.joined = true;
        // SAFETY: a joinable thread of ours, joined once (`joined` keeps Drop from detaching).
        unsafe { libc::pthread_join(self.id, std::ptr::null_mut()) };
        // SAFETY: the thread has ended; glibc does not free stacks it was given.
        unsafe { crate::syscall!(libc::SYS_munmap, self.stack.0, self.stack.1) };
    }
}

impl Drop for RawThread {
    /// Detaches the thread; its stack stays mapped (it may still be running on it).
    fn drop(&mut self) {
        if !self.joined {
            // SAFETY: a joinable thread of ours that nobody will join.
            unsafe { libc::pthread_detach(self.id) };
        }
    }
}

/// SIGTERM and SIGINT, the signals that ask a server to stop.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it, sigaddset adds valid signals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Blocks SIGTERM and SIGINT in this thread and in every thread it starts from now on, so that
/// [`wait_for_stop`] receives them instead of their killing the process. A server calls it
/// before starting its threads. (Not for a process that execs a program: the mask would pass.)
pub fn block_stop_signals() -> io::Result<()> {
    let set = stop_signals();
    // SAFETY: a valid signal set; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits until SIGTERM or SIGINT arrives (blocked beforehand with [`block_stop_signals`]) and
/// names it.
pub fn wait_for_stop() -> io::Result<&'static str> {
    let set = stop_signals();
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: a valid signal set and a writable int for the signal number.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        match rc {
            0 if sig == libc::SIGTERM => return Ok("SIGTERM"),
            0 => return Ok("SIGINT"),
            libc::EINTR => continue,
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    // The child is reaped by the function under test, which clippy cannot see.
    #[allow(clippy::zombie_processes)]
    fn reap_child_gives_the_exit_status_and_a_peak_rss() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .expect("sh runs");
        let (status, peak_kib) = super::reap_child(child.id()).expect("our child");
        assert_eq!(status.code(), Some(3));
        assert!(peak_kib > 0, "a process that ran held some memory");
        // Reaped: a second wait finds no such child.
        assert!(super::reap_child(child.id()).is_err());
    }

    #[test]
    fn fork_exec_runs_a_program_with_its_streams_directory_and_environment() {
        use std::ffi::CString;
        use std::io::Read;
        use std::os::fd::AsFd;
        let c = |s: &str| CString::new(s).unwrap();
        let (mut out, out_w) = std::io::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let pid = super::fork_exec(
            &c("/bin/sh"),
            &[c("sh"), c("-c"), c("echo $GREETING; pwd; exit 4")],
            &[c("GREETING=hello")],
            &c("/tmp"),
            [null.as_fd(), out_w.as_fd(), out_w.as_fd()],
        )
        .unwrap();
        drop(out_w);
        let mut text = String::new();
        out.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello\n/tmp\n");
        let (status, _) = super::reap_child(pid).unwrap();
        assert_eq!(status.code(), Some(4));

        let err = super::fork_exec(
            &c("/nonexistent/program"),
            &[c("program")],
            &[],
            &c("/"),
            [null.as_fd(), null.as_fd(), null.as_fd()],
        )
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
