//! The garbage-collected runtimes (issue 56): Go's map, a JVM's HashMap, V8's Map, each a
//! program whose collector walks a heap larger than its local memory. Each prints its answer
//! (an entry count and a checksum), which must be native's; its time is the whole run's, as a
//! user waits for it (the JVM's start included). Under linux-zram a runtime that stops itself
//! for want of memory (V8 sizes its heap from the memory cgroup's limit) counts as OOM-killed.

use super::launch::{Launcher, System};
use super::programs::{Outcome, Ran};
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `go-map`: a Go map of N strings (default build: statically linked).
pub const GO_MAP: &str = include_str!("runtimes/gomap.go");
/// `jvm-hashmap`: a HashMap of N entries and 200 long arrays.
pub const JVM_MAP: &str = include_str!("runtimes/JvmMap.java");
/// `node-map`: a Map of N strings and 100 Buffers.
pub const NODE_MAP: &str = include_str!("runtimes/nodemap.js");

/// The JVM's options: a 2 GiB heap, the parallel collector (the program).
pub const JVM_OPTIONS: [&str; 2] = ["-Xmx2g", "-XX:+UseParallelGC"];

/// The first of `names` that runs with `arg`.
fn tool(names: &[&str], arg: &str) -> Option<PathBuf> {
    names
        .iter()
        .find(|n| {
            Command::new(n)
                .arg(arg)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(PathBuf::from)
}

/// Go's toolchain, from PATH or where its tarball and Debian put it.
pub fn go() -> Option<PathBuf> {
    tool(
        &["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"],
        "version",
    )
}

/// `GO_MAP` built with default flags into `dir`; the binary.
pub fn build_go_map(dir: &Path) -> Result<PathBuf> {
    build_go(dir, "gomap", None)
}

/// A file that makes a Go program use cgo: it is then linked dynamically against the C
/// library, and Go's runtime maps its heap through the C library's `mmap`.
const CGO_FILE: &str =
    "package main\n\n// #include <stdlib.h>\nimport \"C\"\n\nfunc init() { C.free(C.malloc(16)) }\n";

/// `GO_MAP` built with cgo (as `go build` does for a program importing `net` where a C
/// compiler is installed) into `dir`; the binary.
pub fn build_go_map_cgo(dir: &Path) -> Result<PathBuf> {
    build_go(dir, "gomap-cgo", Some(CGO_FILE))
}

fn build_go(dir: &Path, name: &str, cgo: Option<&str>) -> Result<PathBuf> {
    let go = go().context("Go is not installed (scripts/setup installs it)")?;
    let src = dir.join(format!("{name}-src"));
    std::fs::create_dir_all(&src)?;
    std::fs::write(src.join("main.go"), GO_MAP)?;
    std::fs::write(src.join("go.mod"), "module gomap\n\ngo 1.18\n")?;
    let mut go = Command::new(go);
    if let Some(file) = cgo {
        std::fs::write(src.join("cgo.go"), file)?;
        go.env("CGO_ENABLED", "1");
    }
    let out = dir.join(name);
    go.args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src);
    build(go, &format!("go build of {name}"))?;
    Ok(out)
}

/// Runs the build command `cmd`; its error output if it fails.
fn build(mut cmd: Command, what: &str) -> Result<()> {
    let built = cmd.output().with_context(|| format!("running {what}"))?;
    if !built.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&built.stderr).trim()
        );
    }
    Ok(())
}

/// `JVM_MAP` compiled into `dir`; the class path.
pub fn build_jvm_map(dir: &Path) -> Result<PathBuf> {
    let javac = tool(&["javac"], "-version").context("javac is not installed")?;
    let classes = dir.join("jvmmap");
    std::fs::create_dir_all(&classes)?;
    let src = classes.join("JvmMap.java");
    std::fs::write(&src, JVM_MAP)?;
    let mut javac = Command::new(javac);
    javac.arg("-d").arg(&classes).arg(&src);
    build(javac, "javac of the jvm-hashmap program")?;
    Ok(classes)
}

/// `NODE_MAP` written into `dir`; the script.
pub fn write_node_map(dir: &Path) -> Result<PathBuf> {
    tool(&["node"], "--version").context("Node.js is not installed")?;
    let script = dir.join("nodemap.js");
    std::fs::write(&script, NODE_MAP)?;
    Ok(script)
}

/// The command line of workload `workload` with `entries`, its program prepared in `dir`.
pub fn argv(workload: &str, dir: &Path, entries: u64) -> Result<Vec<OsString>> {
    let n = entries.to_string().into();
    Ok(match workload {
        "go-map" => vec![build_go_map(dir)?.into(), n],
        "jvm-hashmap" => {
            let mut v: Vec<OsString> = vec!["java".into()];
            v.extend(JVM_OPTIONS.iter().map(OsString::from));
            v.extend(["-cp".into(), build_jvm_map(dir)?.into(), "JvmMap".into(), n]);
            v
        }
        "node-map" => vec!["node".into(), write_node_map(dir)?.into(), n],
        other => bail!("no runtime workload {other}"),
    })
}

/// Runs `argv` under `system` with `local` bytes to its end: its time and answer.
pub fn run(
    l: &Launcher,
    system: System,
    local: u64,
    workload: &str,
    argv: &[OsString],
) -> Result<Ran> {
    let ended = l.run_to_end(system, l.command_anywhere(system, local, argv)?)?;
    if ended.oom_killed() || out_of_memory_under_zram(system, &ended.stderr) {
        return Ok(Ran::of(Outcome::OomKilled, ended));
    }
    if !ended.status.success() {
        bail!(
            "{workload} failed under {} ({}): {}",
            system.name(),
            ended.status,
            ended.stderr.trim()
        );
    }
    let outcome = Outcome::Done {
        seconds: ended.seconds,
        answer: ended.stdout.trim().to_string(),
    };
    Ok(Ran::of(outcome, ended))
}

/// Whether a runtime under linux-zram stopped itself for want of memory: V8 sizes its heap
/// from the memory cgroup's limit (the local size), and a JVM may throw before the kernel
/// kills it. Counted as killed for want of memory, as the kernel's OOM kill is.
fn out_of_memory_under_zram(system: System, stderr: &str) -> bool {
    system == System::LinuxZram
        && (stderr.contains("JavaScript heap out of memory")
            || stderr.contains("java.lang.OutOfMemoryError"))
}
