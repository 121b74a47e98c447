//! libtidepool_malloc.so under real programs: a C test of the whole malloc family through its C
//! symbols, and programs found on the machine (python3, sqlite3, git, sort) whose output must be
//! identical to their runs on glibc's malloc.

use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The preload library, built in its `malloc` profile into a target directory of its own
/// (cargo builds only the rlib of this package for its tests).
fn library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("preload-build");
        tidepool_peers::libs::build_malloc_into(&target, Path::new(env!("CARGO_MANIFEST_DIR")))
            .expect("libtidepool_malloc.so")
    })
    .clone()
}

/// The system's python3 (not a pyenv shim, which would run several processes per call).
fn python3() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Runs `cmd` twice, on glibc and under the preload library (with statistics on, which also
/// proves the library was live), and compares status and stdout.
fn same_output(mut make: impl FnMut() -> Command, what: &str) -> Result<()> {
    let native: Output = make().output().with_context(|| format!("running {what}"))?;
    ensure!(
        native.status.success(),
        "{what} fails even on glibc: {}",
        String::from_utf8_lossy(&native.stderr)
    );
    // Statistics to a file: some programs (coreutils) close stderr before libraries unload.
    let stats = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{what}.stats"));
    let _ = std::fs::remove_file(&stats);
    let preloaded = make()
        .env("LD_PRELOAD", library())
        .env("TIDEPOOL_ALLOC_STATS", &stats)
        .output()?;
    let stderr = String::from_utf8_lossy(&preloaded.stderr);
    ensure!(
        preloaded.status.success(),
        "{what} failed under libtidepool_malloc.so ({}): {stderr}",
        preloaded.status
    );
    let report = std::fs::read_to_string(&stats).unwrap_or_default();
    ensure!(
        report.contains("tidepool-alloc statistics"),
        "{what}: the preload was not live (no report in {})",
        stats.display()
    );
    ensure!(
        native.stdout == preloaded.stdout,
        "{what}: output differs under libtidepool_malloc.so ({} vs {} bytes)",
        native.stdout.len(),
        preloaded.stdout.len()
    );
    ensure!(
        !native.stdout.is_empty(),
        "{what} printed nothing to compare"
    );
    Ok(())
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles `tests/c/NAME.c` into a scratch directory.
fn compile_c(name: &str) -> Result<PathBuf> {
    let dir = scratch(&format!("c-{name}"));
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .context("compiling the C test (is a C compiler installed?)")?;
    ensure!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    Ok(exe)
}

/// The library a program loads carries no std: no libgcc_s beside it and a code mapping of
/// tens of KiB, not the 300 KiB that std's panic and backtrace code made it (most of which the
/// kernel's fault-around mapped into every process). The `malloc` profile gives this.
#[test]
fn no_std_in_the_loaded_library() -> Result<()> {
    let out = Command::new("cat")
        .arg("/proc/self/maps")
        .env("LD_PRELOAD", library())
        .output()?;
    ensure!(
        out.status.success(),
        "cat under the library failed: {out:?}"
    );
    let maps = String::from_utf8(out.stdout)?;
    ensure!(
        !maps.contains("libgcc_s"),
        "libgcc_s was loaded with the library:\n{maps}"
    );
    let code: u64 = maps
        .lines()
        .filter(|l| l.ends_with("libtidepool_malloc.so") && l.contains(" r-x"))
        .map(|l| {
            let (from, to) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            u64::from_str_radix(to, 16).unwrap() - u64::from_str_radix(from, 16).unwrap()
        })
        .sum();
    ensure!(code > 0, "the library's code is not mapped:\n{maps}");
    ensure!(
        code <= 128 << 10,
        "the library maps {} KiB of code; std is back in it?",
        code >> 10
    );
    Ok(())
}

#[test]
fn c_malloc_family() -> Result<()> {
    let exe = compile_c("malloc_family")?;
    // Also in debug mode, where every small block goes through the checked bitmap path.
    for debug in ["0", "1"] {
        let out = Command::new(&exe)
            .env("LD_PRELOAD", library())
            .env("TIDEPOOL_ALLOC_DEBUG", debug)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "C test failed (TIDEPOOL_ALLOC_DEBUG={debug}, {}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in ["api edges ok", "aliases ok", "threads ok", "fork ok"] {
            ensure!(stdout.contains(line), "missing '{line}' in:\n{stdout}");
        }
    }
    Ok(())
}

#[test]
fn debug_mode_aborts_on_double_and_interior_frees() -> Result<()> {
    use std::os::unix::process::ExitStatusExt;
    let exe = compile_c("bad_free")?;
    let run = |how: &str| {
        Command::new(&exe)
            .arg(how)
            .env("LD_PRELOAD", library())
            .env("TIDEPOOL_ALLOC_DEBUG", "1")
            .output()
    };
    for (how, message) in [
        ("double", "free(): double free detected"),
        ("interior", "free(): invalid pointer"),
    ] {
        let out = run(how)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.signal() == Some(libc::SIGABRT) && stderr.contains(message),
            "{how}: expected SIGABRT with '{message}', got {} and: {stderr}",
            out.status
        );
    }
    let out = run("ok")?;
    ensure!(
        out.status.success() && out.stdout == b"done\n",
        "a correct program failed in debug mode: {}",
        out.status
    );
    Ok(())
}

#[test]
fn python3_identical() -> Result<()> {
    if !have("python3") {
        eprintln!("python3 not installed; skipped");
        return Ok(());
    }
    let script = r#"
import json, re, collections, hashlib, threading
data = [{"id": i, "name": "item-%d" % i, "tags": ["t%d" % (i % 7), "u%d" % (i % 11)]} for i in range(20000)]
text = json.dumps(data, sort_keys=True)
back = json.loads(text)
counts = collections.Counter(t for d in back for t in d["tags"])
words = re.findall(r"item-(\d+)", text)
def work(k, out):
    out[k] = sorted(((x * 7919) % 10007 for x in range(50000)), reverse=True)[:5]
out = {}
ts = [threading.Thread(target=work, args=(k, out)) for k in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(len(text), hashlib.sha256(text.encode()).hexdigest())
print(sorted(counts.items())[:5], len(words), sorted(out.items()))
"#;
    same_output(
        || {
            let mut c = Command::new(python3());
            c.args(["-c", script])
                .env("PYTHONMALLOC", "malloc")
                .env("PYTHONHASHSEED", "0");
            c
        },
        "python3",
    )
}

#[test]
fn sqlite3_identical() -> Result<()> {
    if !have("sqlite3") {
        eprintln!("sqlite3 not installed; skipped");
        return Ok(());
    }
    let dir = scratch("sqlite3");
    let mut sql = String::from("CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v REAL);\nBEGIN;\n");
    for i in 0..20_000 {
        sql.push_str(&format!(
            "INSERT INTO t(k, v) VALUES ('key{}', {});\n",
            i % 997,
            (i * 37 % 1000) as f64 / 7.0
        ));
    }
    sql.push_str("COMMIT;\nCREATE INDEX tk ON t(k);\n");
    let query = "SELECT k, count(*), round(sum(v), 3), max(id) FROM t GROUP BY k ORDER BY 3 DESC LIMIT 25; \
                 SELECT count(DISTINCT k), round(avg(v), 6) FROM t WHERE v > 50; \
                 WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000) SELECT sum(x * x) FROM c;";
    // Each run loads its own database from the same script, then queries it.
    let mut run = 0;
    same_output(
        || {
            run += 1;
            let db = dir.join(format!("db{run}.sqlite"));
            let _ = std::fs::remove_file(&db);
            std::fs::write(dir.join("load.sql"), &sql).unwrap();
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!(
                "sqlite3 {db} < {load} && sqlite3 {db} \"{query}\"",
                db = db.display(),
                load = dir.join("load.sql").display(),
            ));
            c
        },
        "sqlite3",
    )
}

#[test]
fn git_identical() -> Result<()> {
    if !have("git") {
        eprintln!("git not installed; skipped");
        return Ok(());
    }
    let dir = scratch("git-repo");
    let git = |args: &[&str]| -> Result<()> {
        let o = Command::new("git")
            .args(args)
            .current_dir(&dir)
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
            .output()?;
        ensure!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(())
    };
    git(&["init", "-q", "-b", "main"])?;
    git(&["config", "user.email", "test@tidepool.invalid"])?;
    git(&["config", "user.name", "Tidepool Test"])?;
    for commit in 0..30 {
        for f in 0..10 {
            let body: String = (0..200)
                .map(|l| {
                    format!(
                        "line {l} of file {f} at commit {}\n",
                        commit - commit % (f + 1)
                    )
                })
                .collect();
            std::fs::write(dir.join(format!("f{f}.txt")), body)?;
        }
        git(&["add", "-A"])?;
        git(&["commit", "-q", "-m", &format!("commit {commit}")])?;
    }
    let d = dir.clone();
    same_output(
        || {
            let mut c = Command::new("sh");
            // A fresh clone per run, so that gc in one run cannot change what the next sees.
            c.current_dir(&d).arg("-c").arg(
                "rm -rf ../git-clone && git clone -q . ../git-clone && cd ../git-clone \
                 && git log --stat --format='%H %s' && git log -p -n 5 && git rev-list --objects --all | sort \
                 && git gc -q && git fsck --full 2>&1 && git count-objects -v | grep -v size",
            );
            c
        },
        "git",
    )
}

#[test]
fn sort_identical() -> Result<()> {
    let dir = scratch("sort");
    let input = dir.join("in.txt");
    let text: String = (0..200_000u64)
        .map(|i| format!("{:x} {}\n", i.wrapping_mul(0x9E3779B97F4A7C15) >> 40, i))
        .collect();
    std::fs::write(&input, text)?;
    same_output(
        || {
            let mut c = Command::new("sort");
            c.args(["-k1,1", "-S", "8M"]).arg(&input).env("LC_ALL", "C");
            c
        },
        "sort",
    )
}

/// "Nothing on a malloc path panics": no function of the allocator in the release library calls
/// into Rust's panic machinery (bounds checks and the like must all have been proven away).
#[test]
fn no_allocator_function_can_panic() -> Result<()> {
    if !have("objdump") {
        eprintln!("objdump not installed; skipped");
        return Ok(());
    }
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-C"])
        .arg(library())
        .output()?;
    ensure!(out.status.success(), "objdump failed");
    let text = String::from_utf8_lossy(&out.stdout);
    const EXPORTS: [&str; 13] = [
        "malloc",
        "free",
        "calloc",
        "realloc",
        "reallocarray",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "malloc_usable_size",
        "free_sized",
        "malloc_trim",
    ];
    const PANICS: [&str; 5] = [
        "panic",
        "unwrap_failed",
        "expect_failed",
        "slice_index",
        "slice_end_index",
    ];
    let is_allocator = |header: &str| {
        let name = header
            .split_once('<')
            .map_or("", |(_, n)| n)
            .trim_end_matches(">:");
        name.starts_with("tidepool_alloc::")
            || name.starts_with("tidepool_malloc::")
            || EXPORTS.contains(&name)
    };
    let mut function = "";
    let mut checked = 0;
    let mut offenders = std::collections::BTreeSet::new();
    for line in text.lines() {
        if line.ends_with(">:") {
            function = line;
            checked += usize::from(is_allocator(function));
        } else if (line.contains("call") || line.contains("jmp"))
            && PANICS.iter().any(|p| line.contains(p))
            && is_allocator(function)
        {
            offenders.insert(function.to_string());
        }
    }
    ensure!(
        checked >= EXPORTS.len(),
        "found only {checked} allocator functions to check"
    );
    ensure!(
        offenders.is_empty(),
        "allocator functions with panic paths: {offenders:#?}"
    );
    Ok(())
}
