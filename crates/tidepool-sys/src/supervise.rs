//! What a parent that watches over a program needs beyond `std::process`: process and thread
//! descriptors to wait on, signals passed on to the program, and leaving with the program's
//! own exit status (its signal included).

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering::*};

/// `PIDFD_THREAD` (Linux 6.9): a descriptor for one thread, readable once it has exited.
const PIDFD_THREAD: u32 = libc::O_EXCL as u32;

/// A descriptor for process `pid`, or (with `thread`) for thread `pid` of this process's
/// PID namespace: readable once it has exited.
pub fn pidfd_open(pid: i32, thread: bool) -> io::Result<OwnedFd> {
    let flags = if thread { PIDFD_THREAD } else { 0 };
    // SAFETY: integer arguments; a new descriptor on success.
    let fd = unsafe { crate::syscall!(libc::SYS_pidfd_open, pid, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the new descriptor is ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The descriptor whose number the environment variable `var` holds, left open for this
/// process by its parent, taken over (once: the variable is read, not removed, so callers
/// keep it out of programs they start).
pub fn inherited_fd(var: &str) -> Option<OwnedFd> {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let fd: i32 = std::env::var(var).ok()?.parse().ok()?;
    if fd < 3 || TAKEN.swap(true, SeqCst) {
        return None;
    }
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: open (checked), left for this process by its parent, and taken once.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits until one of `fds` is readable or hung up; returns which, in order. A signal's
/// interruption returns none.
pub fn wait_any(fds: &[BorrowedFd<'_>]) -> io::Result<Vec<bool>> {
    use rustix::event::{PollFd, PollFlags};
    let mut polls: Vec<PollFd> = fds
        .iter()
        .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
        .collect();
    match rustix::event::poll(&mut polls, None) {
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Ok(vec![false; fds.len()]),
        Err(e) => return Err(e.into()),
    }
    Ok(polls.iter().map(|p| !p.revents().is_empty()).collect())
}

/// Whether `fd` is hung up now (a seccomp listener whose filter nobody uses any more).
pub fn hung_up(fd: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags};
    let mut polls = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut polls, Some(&zero)).is_ok()
        && polls[0].revents().contains(PollFlags::HUP)
}

/// The program signals are passed on to; 0 before it exists.
static PROGRAM: AtomicI32 = AtomicI32::new(0);

extern "C" fn pass_on(sig: libc::c_int) {
    let pid = PROGRAM.load(Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// From now on, the signals someone sends this process to stop or poke it (TERM, HUP, USR1,
/// USR2, WINCH, CONT) go to `pid` instead; INT and QUIT, which a terminal sends to the whole
/// foreground group (the program included), are ignored here.
pub fn pass_signals_to(pid: i32) {
    PROGRAM.store(pid, Relaxed);
    for sig in [
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGWINCH,
        libc::SIGCONT,
    ] {
        // SAFETY: the handler only loads an atomic and calls kill.
        unsafe { libc::signal(sig, pass_on as *const () as libc::sighandler_t) };
    }
    for sig in [libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: ignoring a signal.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Leaves as the program did: with its exit code, or killed by its signal (core dumps
/// aside). Never returns.
pub fn exit_like(status: std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        // SAFETY: the default disposition, then the signal to ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
    }
    std::process::exit(status.code().unwrap_or(128 + status.signal().unwrap_or(0)))
}

/// Runs `work` in a child process of its own session (away from the terminal's signals),
/// which then exits; this process goes on at once. Refused unless this process has one
/// thread: a child forked from several has only the forking one, and locks others held stay
/// held in it.
pub fn in_background(work: impl FnOnce()) -> io::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    if status.lines().find(|l| l.starts_with("Threads:")) != Some("Threads:\t1") {
        return Err(io::Error::other("more than one thread here"));
    }
    // SAFETY: one thread (checked), so the child's copy of every lock is free.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: a new session for this child alone.
            unsafe { libc::setsid() };
            work();
            // SAFETY: leaving without the parent's exit handlers and buffers.
            unsafe { libc::_exit(0) }
        }
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}
