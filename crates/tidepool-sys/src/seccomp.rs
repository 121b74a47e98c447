//! Seccomp user notification: the memory system calls a program makes with the instruction
//! inline (a statically linked C library, Go's runtime) handed to a thread of ours.
//!
//! [`install_memory_filter`] puts a filter on the calling thread (and every thread and child it
//! makes after): mmap, munmap, mremap, mprotect, pkey_mprotect, madvise and brk made from the
//! program's code
//! (`text`, its executable segments), its `exit_group` (so that the process's own exit path
//! can run first, which prints the pager's statistics), and fork-like clones, wait until a
//! [`Listener`] answers them; clone3 fails with ENOSYS, so that C libraries fall back to
//! clone, whose flags the filter can read; everything else runs. A thread made before the
//! filter (the pager's, the listener) is not filtered. The filter stays on across exec: a new program whose code lies
//! where the old one's did has its calls held for the listener too, so whoever holds the
//! listener must answer (let them run) until nobody is left to call.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const IP_LO: u32 = 8;
const IP_HI: u32 = 12;
const ARG0_LO: u32 = 16;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// A BPF program under construction, with forward jumps to labels resolved at the end.
struct Bpf {
    insns: Vec<(u16, u32, Target, Target)>,
    labels: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
enum Target {
    Next,
    Label(usize),
}

impl Bpf {
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn here(&mut self, l: usize) {
        self.labels[l] = Some(self.insns.len());
    }
    fn load(&mut self, offset: u32) {
        self.insns.push((
            (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            offset,
            Target::Next,
            Target::Next,
        ));
    }
    fn ret(&mut self, k: u32) {
        self.insns.push((
            (libc::BPF_RET | libc::BPF_K) as u16,
            k,
            Target::Next,
            Target::Next,
        ));
    }
    fn jump(&mut self, op: u32, k: u32, yes: Target, no: Target) {
        self.insns
            .push(((libc::BPF_JMP | op | libc::BPF_K) as u16, k, yes, no));
    }
    fn finish(self) -> Vec<libc::sock_filter> {
        let at = |t: Target, i: usize| -> u8 {
            match t {
                Target::Next => 0,
                Target::Label(l) => {
                    let to = self.labels[l].expect("every label placed");
                    u8::try_from(to - i - 1).expect("a short filter")
                }
            }
        };
        self.insns
            .iter()
            .enumerate()
            .map(|(i, &(code, k, yes, no))| libc::sock_filter {
                code,
                jt: at(yes, i),
                jf: at(no, i),
                k,
            })
            .collect()
    }
}

/// The filter's program; see the module documentation. `text` is `[start, end)`.
fn memory_filter(text: (u64, u64)) -> Vec<libc::sock_filter> {
    use Target::*;
    let mut b = Bpf {
        insns: Vec::new(),
        labels: Vec::new(),
    };
    let (allow, notify, enosys, ip, clone, above_start) = (
        b.label(),
        b.label(),
        b.label(),
        b.label(),
        b.label(),
        b.label(),
    );
    b.load(ARCH);
    b.jump(libc::BPF_JEQ, AUDIT_ARCH, Next, Label(allow));
    b.load(NR);
    b.jump(libc::BPF_JEQ, libc::SYS_clone3 as u32, Label(enosys), Next);
    b.jump(libc::BPF_JEQ, libc::SYS_clone as u32, Label(clone), Next);
    for nr in [
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_mprotect,
        libc::SYS_pkey_mprotect,
        libc::SYS_madvise,
        libc::SYS_brk,
        libc::SYS_exit_group,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_fork,
    ] {
        b.jump(libc::BPF_JEQ, nr as u32, Label(ip), Next);
    }
    b.ret(RET_ALLOW);
    // A clone that shares the address space (a thread, vfork) runs; a fork is held.
    b.here(clone);
    b.load(ARG0_LO);
    b.jump(
        libc::BPF_JSET,
        libc::CLONE_VM as u32,
        Label(allow),
        Label(ip),
    );
    // The 64-bit instruction pointer against [start, end), a 32-bit half at a time.
    let (start, end) = text;
    let (s_hi, s_lo, e_hi, e_lo) = (
        (start >> 32) as u32,
        start as u32,
        (end >> 32) as u32,
        end as u32,
    );
    b.here(ip);
    b.load(IP_HI);
    b.jump(libc::BPF_JGT, s_hi, Label(above_start), Next);
    b.jump(libc::BPF_JEQ, s_hi, Next, Label(allow));
    b.load(IP_LO);
    b.jump(libc::BPF_JGE, s_lo, Next, Label(allow));
    b.here(above_start);
    b.load(IP_HI);
    b.jump(libc::BPF_JGT, e_hi, Label(allow), Next);
    b.jump(libc::BPF_JEQ, e_hi, Next, Label(notify));
    b.load(IP_LO);
    b.jump(libc::BPF_JGE, e_lo, Label(allow), Label(notify));
    b.here(notify);
    b.ret(RET_NOTIFY);
    b.here(allow);
    b.ret(RET_ALLOW);
    b.here(enosys);
    b.ret(RET_ENOSYS);
    b.finish()
}

/// Puts the memory filter (see the module documentation) on the calling thread, for calls
/// made from `text` (`[start, end)`), and returns its listener. Sets no-new-privileges first
/// (required without CAP_SYS_ADMIN): programs the filtered ones execute gain no privileges
/// from set-user-ID bits.
pub fn install_memory_filter(text: (u64, u64)) -> io::Result<Listener> {
    let filter = memory_filter(text);
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `filter`, alive across the call, which copies it.
    let fd = unsafe {
        crate::syscall!(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    Ok(Listener { fd })
}

/// A held system call.
#[derive(Debug, Clone, Copy)]
pub struct Notice {
    /// The notification's id, for the answer.
    pub id: u64,
    /// The calling thread, as this process's PID namespace sees it.
    pub tid: u32,
    pub nr: i64,
    pub args: [u64; 6],
}

impl Notice {
    /// Whether the call makes a new process with a copy of the address space (the filter
    /// holds only those clones: threads and vforks share it and run).
    pub fn is_fork(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.nr == libc::SYS_fork {
            return true;
        }
        self.nr == libc::SYS_clone
    }

    /// The exit status if the call ends the whole process (`exit_group`).
    pub fn exit_status(&self) -> Option<i32> {
        (self.nr == libc::SYS_exit_group).then_some(self.args[0] as i32)
    }
}

/// The listening end of a filter: held calls come out of [`Listener::recv`] and wait for an
/// answer.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// A listener on `fd`, received from the process that installed the filter.
    pub fn from_fd(fd: OwnedFd) -> Listener {
        Listener { fd }
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The next held call; waits for one. `Ok(None)` if it was withdrawn meanwhile (its
    /// thread was killed), or a signal interrupted the wait.
    pub fn recv(&self) -> io::Result<Option<Notice>> {
        // SAFETY: all-zero is a valid seccomp_notif, and RECV requires it zeroed.
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: RECV writes one seccomp_notif into `n`.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &mut n as *mut libc::seccomp_notif,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(Notice {
            id: n.id,
            tid: n.pid,
            nr: n.data.nr as i64,
            args: n.data.args,
        }))
    }

    /// Answers `id`: the call returns `value`, or fails with `errno` if that is not 0.
    pub fn answer(&self, id: u64, value: i64, errno: i32) -> io::Result<()> {
        self.send(libc::seccomp_notif_resp {
            id,
            val: value,
            error: -errno,
            flags: 0,
        })
    }

    /// Makes the held call `n`, of a thread of this process, here instead, through whatever
    /// `syscall()` this process has (under `tidepool run`, the preload's, which serves memory
    /// calls from the pager's regions), and answers it with the outcome.
    ///
    /// Only the memory calls the filter holds come here; the program asked for them, with
    /// these arguments, on its own address space, which is this thread's too.
    pub fn answer_by_making(&self, n: &Notice) -> io::Result<()> {
        let a = n.args.map(|a| a as libc::c_long);
        // SAFETY: the program's own call with its own arguments, on the address space it
        // shares with this thread; what it may break is what it would break on its own.
        let r = unsafe { libc::syscall(n.nr as libc::c_long, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if r == -1 {
            let errno = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM);
            self.answer(n.id, 0, errno)
        } else {
            self.answer(n.id, r, 0)
        }
    }

    /// Fails the call `id` with ENOSYS: not something that can be done here.
    pub fn refuse(&self, id: u64) -> io::Result<()> {
        self.answer(id, 0, libc::ENOSYS)
    }

    /// Lets the call `id` run, as if it had never been held.
    pub fn let_run(&self, id: u64) -> io::Result<()> {
        self.send(libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        })
    }

    fn send(&self, mut resp: libc::seccomp_notif_resp) -> io::Result<()> {
        // SAFETY: SEND reads one seccomp_notif_resp.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &mut resp as *mut libc::seccomp_notif_resp,
            )
        };
        match r {
            0 => Ok(()),
            // The caller was killed meanwhile: nobody waits for the answer.
            _ if io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter's program on one call, as the kernel would.
    fn run(filter: &[libc::sock_filter], nr: i64, ip: u64, arg0: u64) -> u32 {
        let mut data = [0u32; 16];
        data[0] = nr as u32;
        data[1] = AUDIT_ARCH;
        data[2] = ip as u32;
        data[3] = (ip >> 32) as u32;
        data[4] = arg0 as u32;
        data[5] = (arg0 >> 32) as u32;
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let f = filter[pc];
            let class = f.code as u32 & 0x07;
            match class {
                c if c == libc::BPF_LD => acc = data[f.k as usize / 4],
                c if c == libc::BPF_RET => return f.k,
                _ => {
                    let taken = match f.code as u32 & 0xf0 {
                        op if op == libc::BPF_JEQ => acc == f.k,
                        op if op == libc::BPF_JGT => acc > f.k,
                        op if op == libc::BPF_JGE => acc >= f.k,
                        op if op == libc::BPF_JSET => acc & f.k != 0,
                        op => panic!("op {op:#x}"),
                    };
                    pc += if taken { f.jt } else { f.jf } as usize;
                }
            }
            pc += 1;
        }
    }

    #[test]
    fn the_programs_memory_calls_are_held_and_everything_else_runs() {
        for text in [(0x40_1000, 0x48_0000), (0x7f12_3456_0000, 0x7f12_3480_0000)] {
            let f = memory_filter(text);
            let inside = text.0 + 0x10;
            for nr in [
                libc::SYS_mmap,
                libc::SYS_munmap,
                libc::SYS_mprotect,
                libc::SYS_pkey_mprotect,
                libc::SYS_madvise,
                libc::SYS_brk,
                libc::SYS_exit_group,
            ] {
                assert_eq!(run(&f, nr, inside, 0), RET_NOTIFY);
                assert_eq!(run(&f, nr, text.0, 0), RET_NOTIFY, "the first byte");
                assert_eq!(run(&f, nr, text.1, 0), RET_ALLOW, "past the end");
                assert_eq!(run(&f, nr, text.0 - 1, 0), RET_ALLOW, "below");
                assert_eq!(run(&f, nr, text.0 + (1 << 32), 0), RET_ALLOW, "4 GiB above");
                if let Some(below) = text.1.checked_sub(1 << 32) {
                    assert_eq!(run(&f, nr, below, 0), RET_ALLOW, "4 GiB below");
                }
            }
            assert_eq!(run(&f, libc::SYS_read, inside, 0), RET_ALLOW);
            assert_eq!(run(&f, libc::SYS_clone3, inside, 0), RET_ENOSYS);
            let thread = (libc::CLONE_VM | libc::CLONE_THREAD) as u64;
            assert_eq!(run(&f, libc::SYS_clone, inside, thread), RET_ALLOW);
            let fork = libc::SIGCHLD as u64;
            assert_eq!(run(&f, libc::SYS_clone, inside, fork), RET_NOTIFY);
        }
    }
}
