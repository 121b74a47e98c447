//! The allocators the suite compares, each with the library to preload for it, and how a
//! process's memory map shows which one it really runs with.

use crate::harness::{Ctx, System};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// The peer allocators as benchmarks.md names them: library file, Debian's package, Fedora's.
const PEERS: [(&str, &str, &str, &str); 3] = [
    ("jemalloc", "libjemalloc.so.2", "libjemalloc2", "jemalloc"),
    (
        "tcmalloc",
        "libtcmalloc_minimal.so.4",
        "libtcmalloc-minimal4",
        "gperftools-libs",
    ),
    ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0", "mimalloc"),
];

/// The peers' names, in report order.
pub(super) const PEER_NAMES: [&str; 4] = ["glibc", "jemalloc", "tcmalloc", "mimalloc"];

/// An allocator, and the library to preload for it (none: glibc's own malloc).
#[derive(Debug, Clone)]
pub(super) struct Allocator {
    pub(super) name: &'static str,
    pub(super) lib: Option<PathBuf>,
}

impl System for Allocator {
    fn name(&self) -> &'static str {
        self.name
    }
}

/// Systems in report order, each with the library to preload (None: glibc itself).
pub(super) fn systems(ctx: &mut Ctx) -> Result<Vec<Allocator>> {
    let mut systems = vec![
        Allocator {
            name: "tidepool",
            lib: Some(tidepool_library()?),
        },
        Allocator {
            name: "glibc",
            lib: None,
        },
    ];
    for (name, file, debian, fedora) in PEERS {
        match tidepool_peers::shared_library(file) {
            Some(path) => systems.push(Allocator {
                name,
                lib: Some(path),
            }),
            None => ctx.note(format!(
                "{name} skipped: {file} is not installed (package {debian} on Debian, \
                 {fedora} on Fedora; scripts/setup installs it)"
            )),
        }
    }
    Ok(systems)
}

/// libtidepool_malloc.so from the `malloc` profile beside this executable's (or next to it), built
/// first under `cargo run`.
pub fn tidepool_library() -> Result<PathBuf> {
    crate::libs::next_to_exe("tidepool-malloc", "libtidepool_malloc.so")
}

/// The malloc library mapped in a process, given its `/proc/PID/maps`: the first shared
/// library whose name says malloc (empty: glibc's own). Only libraries count: programs such as
/// `xmalloc-test` say malloc in their own names.
pub(super) fn allocator_in_maps(maps: &str) -> &str {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            let file = path.rsplit('/').next().unwrap_or(path);
            file.starts_with("lib") && file.contains(".so") && file.contains("malloc")
        })
        .unwrap_or("")
}

/// Whether `mapped` (from [`allocator_in_maps`]) is the allocator `lib` asks for; `Err` names
/// what was wrong. The mapped file may be the library's versioned target
/// (`libtcmalloc_minimal.so.4` -> `libtcmalloc_minimal.so.4.5.16`).
pub(super) fn check_mapped(mapped: &str, lib: Option<&Path>) -> Result<(), String> {
    match lib {
        Some(lib) => {
            let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if mapped.contains(name) {
                Ok(())
            } else {
                Err(format!(
                    "LD_PRELOAD={} was not live (mapped: '{mapped}')",
                    lib.display()
                ))
            }
        }
        None if !mapped.is_empty() => Err(format!(
            "an allocator was preloaded into the glibc run: {mapped}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapped_allocator_is_a_library_never_the_program() {
        let maps = "\
5581e0000000-5581e0001000 r--p 00000000 fd:01 12 /work/mb/out/bench/xmalloc-test
7f0000000000-7f0000001000 r--p 00000000 fd:01 13 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.16
7f0000100000-7f0000101000 r--p 00000000 fd:01 14 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]";
        let mapped = allocator_in_maps(maps);
        assert!(
            mapped.ends_with("libtcmalloc_minimal.so.4.5.16"),
            "{mapped}"
        );
        let lib = Path::new("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4");
        assert!(check_mapped(mapped, Some(lib)).is_ok());
        assert!(check_mapped(mapped, None).is_err());
        let glibc_only = maps.replace("libtcmalloc_minimal.so.4.5.16", "libm.so.6");
        assert_eq!(allocator_in_maps(&glibc_only), "");
        assert!(check_mapped("", None).is_ok());
        assert!(check_mapped("", Some(lib)).is_err());
    }
}
