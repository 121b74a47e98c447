//! Running a statically linked program inside this process, in place of `execve`.
//!
//! A statically linked program never reads LD_PRELOAD, and `execve` gives it a new address
//! space, where no userfaultfd object of ours exists. So `tidepool run` starts a process of its
//! own with the preload library (whose constructor starts the pager), and that process maps
//! the program's segments as the kernel would ([`map`]), builds the initial stack the kernel
//! would (arguments, environment, auxiliary vector; [`enter`]) and jumps to the program's
//! entry point. The program then runs with this process's address space, the pager's
//! regions and threads included; its own memory system calls reach the pager through the
//! seccomp listener (`seccomp.rs`).
//!
//! What differs from `execve`: `/proc/self/exe` names `tidepool`; the process's first thread
//! keeps the restartable-sequences area glibc registered for it (a C library's own attempt
//! fails, which glibc tolerates: it runs without one); the break (`brk`) is the pager's.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;
const PT_PHDR: u32 = 6;
const PT_NOTE: u32 = 4;
/// A note of type NT_GNU_BUILD_ID, named "GNU", holds the linker's build id.
const NT_GNU_BUILD_ID: u32 = 3;
const PF_X: u32 = 1;
const PF_W: u32 = 2;
const PF_R: u32 = 4;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = 62;
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = 183;

const PAGE: u64 = 4096;

fn down(x: u64) -> u64 {
    x & !(PAGE - 1)
}

fn up(x: u64) -> u64 {
    x.next_multiple_of(PAGE)
}

/// A program header: the fields used here.
#[derive(Clone, Copy, Debug)]
struct Segment {
    kind: u32,
    flags: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
    memsz: u64,
}

/// A program mapped into this process, ready to enter ([`Image::enter`], once).
#[derive(Debug)]
pub struct Image {
    pub entry: u64,
    /// Where its program headers lie in memory, and how many.
    pub phdr: u64,
    pub phnum: u64,
    /// The span of its executable segments, `[start, end)`.
    pub text: (u64, u64),
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The ELF header's type, entry, and program headers of the file, checked to be a 64-bit
/// little-endian executable for this machine.
fn headers(file: &std::fs::File) -> io::Result<(u16, u64, u64, Vec<Segment>)> {
    let mut eh = [0u8; 64];
    file.read_exact_at(&mut eh, 0)?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let (kind, machine) = (u16_at(&eh, 16), u16_at(&eh, 18));
    if machine != MACHINE {
        return Err(bad("an ELF file for another machine"));
    }
    if kind != ET_EXEC && kind != ET_DYN {
        return Err(bad("an ELF file that is not a program"));
    }
    let (entry, phoff) = (u64_at(&eh, 24), u64_at(&eh, 32));
    let (phentsize, phnum) = (u16_at(&eh, 54) as usize, u16_at(&eh, 56) as usize);
    if phentsize != 56 || phnum == 0 || phnum > 256 {
        return Err(bad("malformed program headers"));
    }
    let mut ph = vec![0u8; phentsize * phnum];
    file.read_exact_at(&mut ph, phoff)?;
    let segs = ph
        .chunks_exact(phentsize)
        .map(|p| Segment {
            kind: u32_at(p, 0),
            flags: u32_at(p, 4),
            offset: u64_at(p, 8),
            vaddr: u64_at(p, 16),
            filesz: u64_at(p, 32),
            memsz: u64_at(p, 40),
        })
        .collect();
    Ok((kind, entry, phoff, segs))
}

/// The build id the linker wrote into the ELF program `path` (`.note.gnu.build-id`), if it
/// has one: what tells two builds of a program with the same name apart.
pub fn build_id(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let file = std::fs::File::open(path)?;
    let (_, _, _, segs) = headers(&file)?;
    for seg in segs
        .iter()
        .filter(|s| s.kind == PT_NOTE && s.filesz <= 1 << 16)
    {
        let mut notes = vec![0u8; seg.filesz as usize];
        file.read_exact_at(&mut notes, seg.offset)?;
        let mut at = 0usize;
        // Each note: name size, description size, type, then the name and the description,
        // each padded to 4 bytes.
        while at + 12 <= notes.len() {
            let (namesz, descsz) = (u32_at(&notes, at) as usize, u32_at(&notes, at + 4) as usize);
            let kind = u32_at(&notes, at + 8);
            let name_at = at + 12;
            let desc_at = name_at + namesz.next_multiple_of(4);
            let end = desc_at + descsz.next_multiple_of(4);
            if end > notes.len() {
                break;
            }
            if kind == NT_GNU_BUILD_ID && &notes[name_at..name_at + namesz] == b"GNU\0" {
                return Ok(Some(notes[desc_at..desc_at + descsz].to_vec()));
            }
            at = end;
        }
    }
    Ok(None)
}

/// Whether the program in `path` is a statically linked ELF program (no interpreter), which
/// [`map`] can load.
pub fn is_static(path: &Path) -> bool {
    std::fs::File::open(path)
        .ok()
        .and_then(|f| headers(&f).ok())
        .is_some_and(|(_, _, _, segs)| !segs.iter().any(|s| s.kind == PT_INTERP))
}

fn prot_of(flags: u32) -> i32 {
    (if flags & PF_R != 0 {
        libc::PROT_READ
    } else {
        0
    }) | (if flags & PF_W != 0 {
        libc::PROT_WRITE
    } else {
        0
    }) | (if flags & PF_X != 0 {
        libc::PROT_EXEC
    } else {
        0
    })
}

fn check_map(r: libc::c_long, what: &str) -> io::Result<u64> {
    if r == -1 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("mapping {what}: {e}")));
    }
    Ok(r as u64)
}

/// Maps the statically linked program in `path` into this process as `execve` would (at its
/// own addresses, or anywhere for a static PIE) and returns where to enter it. The mappings
/// are the kernel's, made with raw system calls: the program's code and data are not paged.
pub fn map(path: &Path) -> io::Result<Image> {
    let file = std::fs::File::open(path)?;
    let (kind, entry, phoff, segs) = headers(&file)?;
    let loads = loadable(&segs)?;
    let lo = loads.iter().map(|s| down(s.vaddr)).min().unwrap();
    let hi = loads.iter().map(|s| up(s.vaddr + s.memsz)).max().unwrap();
    let base = reserve(kind, lo, hi)?;
    let mut phdr = segs.iter().find(|s| s.kind == PT_PHDR).map(|s| s.vaddr);
    let mut text = (u64::MAX, 0u64);
    for s in &loads {
        // SAFETY: every loadable segment lies in `[lo, hi)`, which `reserve` just reserved at
        // `base` for the program alone.
        unsafe { map_segment(&file, base, s)? };
        if phdr.is_none() && phoff >= s.offset && phoff < s.offset + s.filesz {
            phdr = Some(s.vaddr + (phoff - s.offset));
        }
        if s.flags & PF_X != 0 {
            let start = down(s.vaddr);
            let file_end = s.vaddr + s.filesz;
            text = (text.0.min(base + start), text.1.max(base + up(file_end)));
        }
    }
    let phdr = phdr.ok_or_else(|| bad("program headers outside the loaded segments"))?;
    if text.0 >= text.1 {
        return Err(bad("no executable segment"));
    }
    Ok(Image {
        entry: base + entry,
        phdr: base + phdr,
        phnum: segs.len() as u64,
        text,
    })
}

/// The program's loadable segments, refused if it has an interpreter or nothing to load.
fn loadable(segs: &[Segment]) -> io::Result<Vec<Segment>> {
    if segs.iter().any(|s| s.kind == PT_INTERP) {
        return Err(bad("a dynamically linked program"));
    }
    let loads: Vec<Segment> = segs.iter().copied().filter(|s| s.kind == PT_LOAD).collect();
    if loads.is_empty() {
        return Err(bad("no loadable segment"));
    }
    Ok(loads)
}

/// Reserves the program's whole span `[lo, hi)`, inaccessible, to be replaced segment by
/// segment, and returns the load bias: anywhere for a PIE; at its own addresses otherwise,
/// refused if anything of this process lies there.
fn reserve(kind: u16, lo: u64, hi: u64) -> io::Result<u64> {
    let (at, placed) = match kind {
        ET_DYN => (0, 0),
        _ => (lo, libc::MAP_FIXED_NOREPLACE),
    };
    // SAFETY: a fresh reservation, over nothing (MAP_FIXED_NOREPLACE fails rather than
    // replace).
    let r = unsafe {
        crate::syscall!(
            libc::SYS_mmap,
            at,
            hi - lo,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | placed,
            -1,
            0
        )
    };
    let base = check_map(r, "the program's address range")? - lo;
    if kind != ET_DYN && base != 0 {
        // A kernel without MAP_FIXED_NOREPLACE (before 4.17) takes the address as a hint.
        return Err(bad("the program's own addresses are taken in this process"));
    }
    Ok(base)
}

/// Maps one loadable segment at `base` plus its address: its file part, then the zero-filled
/// rest.
///
/// # Safety
///
/// The segment's span at `base` must lie in the program's own reservation ([`reserve`]): the
/// mappings are made with MAP_FIXED and replace whatever lies there.
unsafe fn map_segment(file: &std::fs::File, base: u64, s: &Segment) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let prot = prot_of(s.flags);
    let start = down(s.vaddr);
    let file_end = s.vaddr + s.filesz;
    let mem_end = up(s.vaddr + s.memsz);
    let offset = s.offset - (s.vaddr - start);
    if s.filesz > 0 {
        // SAFETY: MAP_FIXED inside the program's own reservation (the caller's promise).
        let r = unsafe {
            crate::syscall!(
                libc::SYS_mmap,
                base + start,
                up(file_end) - start,
                prot | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                file.as_raw_fd(),
                offset
            )
        };
        check_map(r, "the program's segments")?;
        // The rest of the last file page belongs to the zero-filled part.
        let tail = up(file_end) - file_end;
        if s.memsz > s.filesz && tail > 0 {
            // SAFETY: inside the writable mapping just made.
            unsafe { std::ptr::write_bytes((base + file_end) as *mut u8, 0, tail as usize) };
        }
        // SAFETY: the mapping just made.
        unsafe { crate::syscall!(libc::SYS_mprotect, base + start, up(file_end) - start, prot) };
    }
    let anon_from = if s.filesz > 0 { up(file_end) } else { start };
    if mem_end > anon_from {
        // SAFETY: as above, for the zero-filled rest.
        let r = unsafe {
            crate::syscall!(
                libc::SYS_mmap,
                base + anon_from,
                mem_end - anon_from,
                prot,
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_ANONYMOUS,
                -1,
                0
            )
        };
        check_map(r, "the program's zero-filled data")?;
    }
    Ok(())
}

const AT_NULL: u64 = 0;
const AT_PHDR: u64 = 3;
const AT_PHENT: u64 = 4;
const AT_PHNUM: u64 = 5;
const AT_BASE: u64 = 7;
const AT_ENTRY: u64 = 9;
const AT_EXECFN: u64 = 31;

/// The stack a program starts on: its size (the stack limit, as the kernel allows the first
/// thread's stack to grow, from 8 MiB to 1 GiB).
fn stack_size() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes one rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) };
    (lim.rlim_cur as usize).clamp(8 << 20, 1 << 30)
}

impl Image {
    /// Builds the program's initial stack (`argv`, `envp`, this process's auxiliary vector
    /// with the program's own entries), puts signal handling back as `execve` leaves it,
    /// names the process after the program, and jumps to the program's entry point: this
    /// thread becomes the program's first thread and never comes back. The rest of this
    /// process (the pager's threads) goes on beside it, as it would beside an `execve`d
    /// program loaded with the preload library.
    pub fn enter(self, argv: &[CString], envp: &[CString], execfn: &CStr) -> ! {
        enter(&self, argv, envp, execfn)
    }
}

fn enter(image: &Image, argv: &[CString], envp: &[CString], execfn: &CStr) -> ! {
    let size = stack_size();
    // SAFETY: a fresh private mapping; its top is the program's stack.
    let stack = unsafe {
        crate::syscall!(
            libc::SYS_mmap,
            0usize,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0
        )
    };
    if stack == -1 {
        let msg = b"tidepool: no memory for the program's stack\n";
        // SAFETY: a write of a static buffer, then the end of the process.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    }
    let mut sp = stack as usize + size;
    let mut push = |bytes: &[u8]| -> usize {
        sp -= bytes.len();
        // SAFETY: inside the stack mapping, below what was pushed before.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), sp as *mut u8, bytes.len()) };
        sp
    };
    let execfn = push(execfn.to_bytes_with_nul());
    let args: Vec<usize> = argv.iter().map(|a| push(a.to_bytes_with_nul())).collect();
    let envs: Vec<usize> = envp.iter().map(|e| push(e.to_bytes_with_nul())).collect();
    let mut aux: Vec<(u64, u64)> = std::fs::read("/proc/self/auxv")
        .unwrap_or_default()
        .chunks_exact(16)
        .map(|c| (u64_at(c, 0), u64_at(c, 8)))
        .take_while(|&(k, _)| k != AT_NULL)
        .filter(|&(k, _)| ![AT_PHDR, AT_PHENT, AT_PHNUM, AT_BASE, AT_ENTRY, AT_EXECFN].contains(&k))
        .collect();
    aux.extend([
        (AT_PHDR, image.phdr),
        (AT_PHENT, 56),
        (AT_PHNUM, image.phnum),
        (AT_BASE, 0),
        (AT_ENTRY, image.entry),
        (AT_EXECFN, execfn as u64),
        (AT_NULL, 0),
    ]);
    let mut words: Vec<u64> = Vec::with_capacity(3 + args.len() + envs.len() + 2 * aux.len());
    words.push(args.len() as u64);
    words.extend(args.iter().map(|&a| a as u64));
    words.push(0);
    words.extend(envs.iter().map(|&e| e as u64));
    words.push(0);
    for (k, v) in aux {
        words.extend([k, v]);
    }
    let top = (sp - words.len() * 8) & !15;
    // SAFETY: inside the stack mapping, below the strings.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), top as *mut u64, words.len()) };
    reset_signals();
    if let Some(name) = Path::new(std::ffi::OsStr::from_bytes(execfn_name(argv)))
        .file_name()
        .and_then(|n| CString::new(n.as_encoded_bytes()).ok())
    {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string (the kernel keeps 15 bytes).
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    }
    // SAFETY: the image was mapped by `map` and is entered once (`Image::enter` takes it);
    // the stack is the program's, set up as the kernel would; the jump never returns. rdx
    // (x0) is the finaliser a C library's _start registers: none.
    unsafe { jump(top, image.entry) }
}

use std::os::unix::ffi::OsStrExt;

fn execfn_name(argv: &[CString]) -> &[u8] {
    argv.first().map_or(b"program", |a| a.to_bytes())
}

/// Signal handling as `execve` from `tidepool run` leaves it: the dispositions this process's
/// runtime changed (Rust's: SIGPIPE ignored, SIGSEGV and SIGBUS caught on an alternate stack)
/// back to the defaults, no alternate stack, nothing blocked (`tidepool run` starts the process
/// with an empty mask, and `execve` keeps a mask).
fn reset_signals() {
    for sig in [libc::SIGPIPE, libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: restoring a default disposition.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    let off = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: libc::SS_DISABLE,
        ss_size: 0,
    };
    // SAFETY: disabling this thread's alternate signal stack.
    unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) };
    // SAFETY: an empty set, applied to this thread.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// # Safety
/// See [`enter`].
#[cfg(target_arch = "x86_64")]
unsafe fn jump(sp: usize, entry: u64) -> ! {
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!(
            "mov rsp, {sp}",
            "xor edx, edx",
            "jmp {entry}",
            sp = in(reg) sp,
            entry = in(reg) entry,
            options(noreturn),
        )
    }
}

/// # Safety
/// See [`enter`].
#[cfg(target_arch = "aarch64")]
unsafe fn jump(sp: usize, entry: u64) -> ! {
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!(
            "mov sp, {sp}",
            "mov x0, xzr",
            "br {entry}",
            sp = in(reg) sp,
            entry = in(reg) entry,
            options(noreturn),
        )
    }
}
