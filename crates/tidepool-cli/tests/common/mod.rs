//! What the integration tests share: a real `tidepool node` process, the preload library
//! `tidepool run` loads, C test programs, seeded payloads.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// `libtidepool_preload.so`, built once per test binary.
pub fn preload() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("preload-build");
        tidepool_bench::libs::build_into(
            &target,
            Path::new(env!("CARGO_MANIFEST_DIR")),
            "tidepool-preload",
            "libtidepool_preload.so",
        )
        .expect("libtidepool_preload.so")
    })
    .clone()
}

/// The system's python3 (a pyenv shim would add processes of its own to every run).
pub fn python3() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// The address of the dashboard a coordinator announced in its first line
/// (`... http://ADDR/ ...`).
pub fn dashboard_addr(line: &str) -> String {
    line.split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("the coordinator announced no dashboard: {line:?}"))
        .to_string()
}

/// A finished program's standard output and error, as text.
/// The arguments of the verification program (`tidepool bench-worker` with a verify job) over
/// `bytes` of heap, two threads, `rounds` rounds; with `wait`, it waits for a line on standard
/// input after the first.
pub fn verify_job(bytes: usize, rounds: u64, wait: bool) -> [String; 2] {
    tidepool_bench::job::Job::Verify(tidepool_bench::job::VerifyJob {
        bytes,
        threads: 2,
        rounds,
        wait,
    })
    .args()
}

pub fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tests/c/NAME.c` compiled with -O2 and `libs` (after the source), once per test binary.
pub fn c_program(name: &str, libs: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(out) = built.get(name) {
        return out.clone();
    }
    // One copy per source and flags, compiled under a name of this process's and linked into
    // place only if no copy is there yet: tests run as processes side by side (nextest), and
    // none may find the program half written, still open for writing (ETXTBSY), or replaced
    // under it while it runs (its mappings would read "(deleted)").
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::fs::read(&src)
            .expect("the test program's source")
            .hash(&mut h);
        libs.hash(&mut h);
        h.finish()
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = dir.join(format!("{name}-{key:016x}"));
    if !out.exists() {
        let partial = dir.join(format!("{name}-{key:016x}.{}", std::process::id()));
        let status = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&partial)
            .arg(&src)
            .args(libs)
            .status()
            .expect("cc (the C compiler scripts/setup installs)");
        assert!(status.success(), "compiling {}", src.display());
        match std::fs::hard_link(&partial, &out) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("{}: {e}", out.display()),
        }
        let _ = std::fs::remove_file(&partial);
    }
    built.insert(name.to_string(), out.clone());
    out
}

pub struct NodeProc {
    child: Child,
    pub addr: String,
    /// The node's first line of output (address, capacity, mode, metrics address).
    pub announced: String,
}

impl NodeProc {
    /// Starts `tidepool node --listen 127.0.0.1:0` with extra arguments and waits until it says
    /// where it listens.
    pub fn start(args: &[&str]) -> NodeProc {
        NodeProc::start_server("node", args)
    }

    /// Starts `tidepool SERVER --listen 127.0.0.1:0` (`node`, `cache`) with extra arguments and
    /// waits until it says where it listens.
    pub fn start_server(server: &str, args: &[&str]) -> NodeProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args([server, "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tidepool node");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("{server} did not announce its address: {line:?}"))
            .to_string();
        NodeProc {
            child,
            addr,
            announced: line,
        }
    }

    /// `http://ADDR/metrics`, for a node started with `--metrics`.
    pub fn metrics_url(&self) -> String {
        self.announced
            .split_whitespace()
            .find(|w| w.starts_with("http://") && w.ends_with("/metrics"))
            .unwrap_or_else(|| panic!("node announced no metrics: {:?}", self.announced))
            .to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Kills the server (SIGKILL, as a crash would) and waits for it to go.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident set size now, and at its peak, in bytes.
    pub fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap()
                * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes that depend on a seed, so any mix-up between objects shows. Made a word at a time:
/// the tests verify over a gigabyte of these in debug builds.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Every process below `pid` (children, grandchildren...), from /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // "pid (name) state ppid ...": the name may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|&&(_, pp)| pp == p)
                .map(|&(c, _)| c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Each thread of `pid` and of its descendants: name, state and where it sleeps in the kernel.
pub fn where_threads_are(pid: u32) -> String {
    let mut out = String::new();
    for p in std::iter::once(pid).chain(descendants(pid)) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let tid = t.file_name().to_string_lossy().into_owned();
            let read = |f: &str| {
                std::fs::read_to_string(format!("/proc/{p}/task/{tid}/{f}"))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            let stat = read("stat");
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
                .unwrap_or_default();
            out.push_str(&format!(
                "  process {p} thread {tid} ({}): {state} in {}\n",
                read("comm"),
                read("wchan")
            ));
        }
    }
    out
}

/// Kills `pid` and everything below it with SIGKILL.
pub fn kill_tree(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut all = descendants(pid);
    all.push(pid);
    for p in all {
        let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
}

/// Runs `cmd` to its end and returns what it printed, or, if it has not ended after `limit`,
/// kills it and everything it started and fails the test with where their threads were: a hang
/// fails the test that found it, never the suite.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> std::process::Output {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    // Drained on threads, so that a program printing much never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let threads = where_threads_are(child.id());
            kill_tree(child.id());
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            let (out, err) = (out.join().unwrap(), err.join().unwrap());
            panic!(
                "{what} did not end within {limit:?}: it hangs. Its threads were:\n{threads}\
                 stdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Processes the program left behind (an orphan still printing) hold the pipes open until
    // they end; they are in its process group, which is killed if they outlive the deadline.
    while !(out.is_finished() && err.is_finished()) {
        if started.elapsed() > limit {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{what} ended, but what it left running did not end within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}
