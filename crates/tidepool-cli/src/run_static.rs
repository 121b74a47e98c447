//! Statically linked programs under `tidepool run` (issue 56).
//!
//! ```text
//! tidepool run (supervisor) ──spawn, LD_PRELOAD──► tidepool __exec-static PATH ARGV0 ARGS
//!   │                                                preload constructor: the pager
//!   │                                                map PATH's segments (exec_static::map)
//!   │                                                thread tp-memcalls ◄─ seccomp listener
//!   │◄── listener (dup) + tp-memcalls' pidfd ───────  filter on this thread, then enter PATH
//!   │                                                  program's mmap/munmap/mremap/mprotect/
//!   │                                                  madvise/brk ─► held ─► tp-memcalls ─►
//!   │                                                  syscall() (the preload's: paged)
//!   │                                                  its exit_group ─► held ─► with --stats
//!   │                                                  exit() (the preload's figures)
//!   waits for the program; once tp-memcalls is gone (the program exec'd) it lets every held
//!   call run, and after the program ends it stays in the background while anyone is left
//!   under the filter
//! ```
//!
//! The filter holds only calls made from the program's own code; the pager's threads were
//! started before it and are not filtered. It stays on across exec, and a program exec'd
//! there has no listener thread of its own: the supervisor's copy of the listener answers
//! for it (lets its calls run, unpaged), so a call is never left waiting or failed with
//! ENOSYS for want of a listener. One window is left: a call of another process (a vfork
//! child) that `tp-memcalls` has received but not answered when the program exec's is lost
//! with the thread, and its caller waits.

use anyhow::{Context, Result};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use tidepool_sys::exec_static;
use tidepool_sys::seccomp::{install_memory_filter, Listener};
use tidepool_sys::seqpacket::Channel;
use tidepool_sys::supervise;

/// The hidden command that becomes the program.
const ENTRY: &str = "__exec-static";
/// The descriptor of the loader's end of the supervisor's socket.
const SUPERVISOR_FD: &str = "TIDEPOOL_SUPERVISOR_FD";

/// The command that runs the statically linked program at `path` (`argv0` its name as given)
/// inside a `tidepool` process; the caller adds the arguments and environment, then
/// [`supervise`]s it.
pub fn loader_command(path: &Path, argv0: &OsStr) -> Result<Command> {
    let me = std::env::current_exe().context("finding the tidepool binary")?;
    let mut cmd = Command::new(me);
    cmd.arg(ENTRY).arg(path).arg(argv0);
    Ok(cmd)
}

/// In `tidepool __exec-static PATH ARGV0 ARGS...`: maps and enters the program; never
/// returns. Elsewhere: returns at once.
pub fn enter_if_asked() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(ENTRY)) {
        return;
    }
    let (Some(path), argv) = (args.next(), args.collect::<Vec<_>>()) else {
        eprintln!("tidepool: {ENTRY} needs a program");
        std::process::exit(127);
    };
    let path = PathBuf::from(path);
    if let Err(e) = load(&path, &argv) {
        eprintln!("tidepool run: cannot run {}: {e:#}", path.display());
        std::process::exit(127);
    }
}

fn cstring(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes()).with_context(|| format!("{s:?} holds a NUL byte"))
}

fn load(path: &Path, argv: &[OsString]) -> Result<()> {
    let channel = supervise::inherited_fd(SUPERVISOR_FD).map(Channel::from_fd);
    let image = exec_static::map(path).context("loading it")?;
    let argv: Vec<CString> = argv.iter().map(|a| cstring(a)).collect::<Result<_>>()?;
    let envp: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != SUPERVISOR_FD)
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect::<Result<_>>()?;
    let execfn = cstring(path.as_os_str())?;
    let name = argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The thread that answers the program's memory calls, started before the filter exists
    // so that it is not filtered itself.
    let (give, take) = std::sync::mpsc::channel::<Listener>();
    let (tell_tid, tid) = std::sync::mpsc::channel::<i32>();
    std::thread::Builder::new()
        .name("tp-memcalls".into())
        .spawn(move || {
            let _ = tell_tid.send(rustix::thread::gettid().as_raw_nonzero().get());
            if let Ok(listener) = take.recv() {
                serve(&listener, &name);
            }
        })
        .context("starting the thread that serves its memory calls")?;
    let tid = tid.recv().context("the memory-call thread did not start")?;
    let listener = install_memory_filter(image.text).context(
        "installing the seccomp filter that hands its memory calls to the pager (a kernel \
         without seccomp user notification, 5.0 or later, cannot run it paged)",
    )?;
    if let Some(channel) = channel {
        let thread = supervise::pidfd_open(tid, true).context("a descriptor for the thread")?;
        channel.send_with_fd(b"listener", listener.fd().as_fd())?;
        channel.send_with_fd(b"thread", thread.as_fd())?;
        // Closed here: the program must not inherit it (entering never returns to drop it).
        drop(channel);
    }
    give.send(listener)
        .ok()
        .context("the memory-call thread is gone")?;
    image.enter(&argv, &envp, &execfn)
}

/// Whether thread `tid` belongs to this process.
fn ours(tid: u32) -> bool {
    Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// Answers the program's held memory calls with the preload's `syscall()` (paged memory);
/// lets those of other processes (children exec'd under the filter) run as they are. The
/// program's `exit_group` becomes `exit` here when the preload has something to do at exit
/// (which a static program's own exit never runs): `--stats`' figures, the sections
/// `tidepool tune` reads, a profile's message.
fn serve(listener: &Listener, name: &str) {
    let set = |v: &str| std::env::var_os(v).is_some_and(|v| !v.is_empty() && v != "0");
    use tidepool_pager::run_env::{PROFILE_PID, SECTIONS_OUT, STATS};
    let stats = set(STATS) || set(SECTIONS_OUT) || set(PROFILE_PID);
    let mut told = false;
    loop {
        let n = match listener.recv() {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("tidepool run: {name}: the thread serving its memory calls stopped: {e}");
                return;
            }
        };
        let answered = if !ours(n.tid) {
            listener.let_run(n.id)
        } else if let Some(status) = n.exit_status() {
            if stats {
                // The exit a dynamic program takes, with the preload's exit handler at its end;
                // the program's thread stays held until the process is gone.
                std::process::exit(status);
            }
            listener.let_run(n.id)
        } else if n.is_fork() {
            if !told {
                told = true;
                eprintln!(
                    "tidepool run: {name} forked without exec, which a statically linked program \
                     under tidepool run cannot do yet (its child would not be paged): the fork \
                     failed with ENOSYS"
                );
            }
            listener.refuse(n.id)
        } else {
            // Through the preload's syscall(): paged memory, each call's meaning kept.
            listener.answer_by_making(&n)
        };
        if let Err(e) = answered {
            eprintln!("tidepool run: {name}: answering a memory call failed: {e}");
        }
    }
}

/// Starts the loader `cmd` and watches over it until the program ends, then leaves with its
/// exit status; see the module documentation. Returns only on failure to start it.
pub fn supervise(mut cmd: Command, name: &OsStr) -> Result<()> {
    let (ours, theirs) = Channel::pair()?;
    rustix::io::fcntl_setfd(theirs.fd(), rustix::io::FdFlags::empty())?;
    cmd.env(SUPERVISOR_FD, theirs.fd().as_raw_fd().to_string());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", name.to_string_lossy()))?;
    drop(theirs);
    let pid = child.id() as i32;
    supervise::pass_signals_to(pid);
    let process = supervise::pidfd_open(pid, false)?;
    // The listener and the thread serving it, unless the loader failed first.
    let mut buf = [0u8; 16];
    let mut next_fd = || {
        ours.recv(&mut buf, None)
            .ok()
            .flatten()
            .and_then(|(_, fd)| fd)
    };
    let listener = next_fd().map(Listener::from_fd);
    let mut thread = next_fd();
    drop(ours);
    loop {
        let mut fds = vec![process.as_fd()];
        if let Some(t) = &thread {
            fds.push(t.as_fd());
        } else if let Some(l) = &listener {
            fds.push(l.fd().as_fd());
        }
        let ready = supervise::wait_any(&fds)?;
        if ready[0] {
            break;
        }
        if ready.get(1) == Some(&true) {
            match (&thread, &listener) {
                // The serving thread is gone (the program exec'd): answer from here.
                (Some(_), _) => thread = None,
                (None, Some(l)) => let_all_run(l),
                (None, None) => {}
            }
        }
    }
    let status = child.wait().context("waiting for the program")?;
    if let Some(l) = listener.filter(|l| !supervise::hung_up(l.fd().as_fd())) {
        linger(l);
    }
    supervise::exit_like(status)
}

/// Lets the held calls run that are waiting now.
fn let_all_run(listener: &Listener) {
    if let Ok(Some(n)) = listener.recv() {
        let _ = listener.let_run(n.id);
    }
}

/// Someone the program left behind is still under its filter: a process in the background
/// answers for them until none is left.
fn linger(listener: Listener) {
    let served = supervise::in_background(|| {
        while !supervise::hung_up(listener.fd().as_fd()) {
            if supervise::wait_any(&[listener.fd().as_fd()]).is_err() {
                break;
            }
            let_all_run(&listener);
        }
    });
    if let Err(e) = served {
        eprintln!("tidepool run: processes the program left behind may wait in memory calls: {e}");
    }
}
