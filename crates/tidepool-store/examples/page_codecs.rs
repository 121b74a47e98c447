//! How the pages of a running program compress: the measurement behind the in-process
//! store's codec. Reads every private anonymous writable page of process PID (root, or the
//! same user with ptrace rights) and reports, per codec, the bytes it would keep and the time
//! it takes to compress and decompress a page.
//!
//! `cargo run --release -p tidepool-store --example page_codecs -- PID`

use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;

const PAGE: usize = 4096;

fn pages_of(pid: u32) -> std::io::Result<Vec<Vec<u8>>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut pages = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Anonymous (no path, or [heap]) and writable.
        if f.len() < 5 || !f[1].starts_with("rw") || (f.len() > 5 && f[5] != "[heap]") {
            continue;
        }
        let (a, b) = f[0].split_once('-').expect("range");
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        let mut at = a;
        while at < b {
            let mut page = vec![0u8; PAGE];
            if mem.seek(SeekFrom::Start(at as u64)).is_ok() && mem.read_exact(&mut page).is_ok() {
                pages.push(page);
            }
            at += PAGE;
        }
    }
    Ok(pages)
}

fn main() {
    let pid: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .expect("usage: page_codecs PID");
    let pages = pages_of(pid).expect("reading the process's memory");
    let same = pages
        .iter()
        .filter(|p| p.chunks_exact(8).all(|w| w == &p[..8]))
        .count();
    println!(
        "{} pages ({} MiB), {} same-filled",
        pages.len(),
        (pages.len() * PAGE) >> 20,
        same
    );
    let rest: Vec<&Vec<u8>> = pages
        .iter()
        .filter(|p| !p.chunks_exact(8).all(|w| w == &p[..8]))
        .collect();
    type Codec<'a> = (
        &'static str,
        Box<dyn Fn(&[u8]) -> Vec<u8> + 'a>,
        Box<dyn Fn(&[u8], &mut [u8]) + 'a>,
    );
    // One context per codec, reused as a store would.
    let zfast = std::cell::RefCell::new(zstd::bulk::Compressor::new(-1).unwrap());
    let z1 = std::cell::RefCell::new(zstd::bulk::Compressor::new(1).unwrap());
    let zd = std::cell::RefCell::new(zstd::bulk::Decompressor::new().unwrap());
    let codecs: Vec<Codec<'_>> = vec![
        (
            "lz4",
            Box::new(lz4_flex::block::compress),
            Box::new(|c, out| {
                lz4_flex::block::decompress_into(c, out).unwrap();
            }),
        ),
        (
            "zstd:-1",
            Box::new(|p| zfast.borrow_mut().compress(p).unwrap()),
            Box::new(|c, out| {
                zd.borrow_mut().decompress_to_buffer(c, out).unwrap();
            }),
        ),
        (
            "zstd:1",
            Box::new(|p| z1.borrow_mut().compress(p).unwrap()),
            Box::new(|c, out| {
                zd.borrow_mut().decompress_to_buffer(c, out).unwrap();
            }),
        ),
    ];
    for (name, compress, decompress) in &codecs {
        let t = Instant::now();
        let packed: Vec<Vec<u8>> = rest.iter().map(|p| compress(p)).collect();
        let c_ns = t.elapsed().as_nanos() as f64 / rest.len().max(1) as f64;
        let mut out = vec![0u8; PAGE];
        let t = Instant::now();
        for (c, p) in packed.iter().zip(&rest) {
            if c.len() < PAGE {
                decompress(c, &mut out);
                debug_assert_eq!(&out[..], &p[..]);
            }
        }
        let d_ns = t.elapsed().as_nanos() as f64 / rest.len().max(1) as f64;
        // What a store keeping raw pages that do not compress below 7/8 would hold.
        let kept: usize = packed
            .iter()
            .map(|c| {
                if c.len() > PAGE * 7 / 8 {
                    PAGE
                } else {
                    c.len()
                }
            })
            .sum();
        let raw = packed.iter().filter(|c| c.len() > PAGE * 7 / 8).count();
        println!(
            "{name:10} keeps {:6.1} MiB ({:.3} of the non-same pages; {raw} kept raw); compress \
             {c_ns:.0} ns/page, decompress {d_ns:.0} ns/page",
            kept as f64 / (1 << 20) as f64,
            kept as f64 / (rest.len().max(1) * PAGE) as f64
        );
    }
}
