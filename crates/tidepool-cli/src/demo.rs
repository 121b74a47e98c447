//! `tidepool demo`: move data through far stores, verify every byte, report the speed; then
//! keep values in soft memory, take pages of it back behind its back, and check every value
//! comes back right (cached, or rebuilt).

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::time::Instant;
use tidepool_node::{format_size, NodeConfig, Server};
use tidepool_store::{FarStore, Key};

const PAGE: usize = 4096;

/// One way of bringing pages back: read (keep the far copies) or take.
type Fetch<'a> =
    &'a dyn Fn(&[Key]) -> Result<Vec<Option<bytes::Bytes>>, tidepool_store::StoreError>;
const BATCH: usize = 64;

pub fn run(backend: Option<&str>, size: u64) -> Result<()> {
    let pages = (size / PAGE as u64).max(BATCH as u64);
    match backend {
        Some(url) => exercise(&tidepool_store::open(url)?, pages),
        None => {
            exercise(&tidepool_store::open("local:")?, pages)?;
            // A real memory node on loopback, inside this process.
            let node = Server::start(NodeConfig::new("127.0.0.1:0", pages * PAGE as u64 * 2))?;
            let url = format!("node://demo@{}", node.local_addr());
            let r = exercise(&tidepool_store::open(&url)?, pages);
            node.shutdown();
            r?;
            soft(pages)
        }
    }
}

/// Soft memory: values twice the budget in a SoftMap, a third of its segments punched behind
/// its back, every value read and checked.
fn soft(pages: u64) -> Result<()> {
    use tidepool_soft::{ArenaConfig, SoftMap, SoftRuntime, SEGMENT};
    let values = pages / 2;
    let budget = (values as usize * PAGE / 2).max(8 * SEGMENT);
    println!(
        "soft memory  ({} of values in a budget of {})",
        format_size(values * PAGE as u64),
        format_size(budget as u64)
    );
    let arena = SoftRuntime::from_env(ArenaConfig::default().budget(budget).max_bytes(4 * budget))?;
    arena.start_evacuator(0.02, 0.05)?;
    let noise = noise();
    let rebuild = {
        let noise = noise.clone();
        move |k: &Key| page(&noise, *k)
    };
    let map: SoftMap<Key, Vec<u8>> = SoftMap::with_reconstructor(&arena, rebuild);
    let t = Instant::now();
    for k in 0..values {
        map.insert(k, &page(&noise, k))?;
    }
    // A coordinator under pressure takes segments back without asking.
    let mut punched = 0;
    for seg in (0..arena.usage() / SEGMENT).step_by(3) {
        arena.punch_behind_back(seg * SEGMENT, SEGMENT)?;
        punched += 1;
    }
    // Newest first: those are the ones still cached, unless their page was taken.
    for k in (0..values).rev() {
        if map.get_or_reconstruct(k).as_deref() != Some(page(&noise, k).as_slice()) {
            bail!("soft memory: value {k} came back wrong");
        }
    }
    let s = map.stats();
    println!(
        "  {punched} segments of 2 MiB revoked behind its back; {values} values read in {:.2} s, \
         every one right: {} from soft memory, {} rebuilt",
        t.elapsed().as_secs_f64(),
        s.hits,
        s.reconstructions
    );
    Ok(())
}

/// Random bytes, made once: pages are this noise tagged with their key, so they cannot be
/// compressed away and making them costs little next to moving them.
fn noise() -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..PAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn page(noise: &[u8], key: Key) -> Vec<u8> {
    let mut p = noise.to_vec();
    p[..8].copy_from_slice(&key.to_le_bytes());
    p
}

fn exercise(store: &Arc<dyn FarStore>, pages: u64) -> Result<()> {
    let name = store.describe();
    let bytes = pages * PAGE as u64;
    println!("{name}  ({} in {pages} pages of 4 KiB)", format_size(bytes));
    let bar = ProgressBar::new(pages * 3);
    bar.set_style(ProgressStyle::with_template("  {msg:8} {bar:40} {percent}%").expect("template"));
    let noise = noise();
    let batches: Vec<Vec<Key>> = (0..pages)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(<[Key]>::to_vec)
        .collect();

    bar.set_message("write");
    let t = Instant::now();
    for keys in &batches {
        let vals: Vec<Vec<u8>> = keys.iter().map(|&k| page(&noise, k)).collect();
        let items: Vec<(Key, &[u8])> = keys
            .iter()
            .copied()
            .zip(vals.iter().map(|v| v.as_slice()))
            .collect();
        store.write_many(&items)?;
        bar.inc(keys.len() as u64);
    }
    let write_s = t.elapsed().as_secs_f64();

    // Read back keeping the far copies, then take them (unique copy): every page verified.
    let fetch_all = |what: &str, fetch: Fetch<'_>| -> Result<f64> {
        bar.set_message(what.to_string());
        let t = Instant::now();
        for keys in &batches {
            for (k, g) in keys.iter().zip(fetch(keys)?) {
                if g.as_deref() != Some(page(&noise, *k).as_slice()) {
                    bail!("{name}: page {k} came back wrong on {what}");
                }
            }
            bar.inc(keys.len() as u64);
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let read_s = fetch_all("read", &|keys| store.read_many(keys))?;
    let take_s = fetch_all("take", &|keys| store.take_many(keys))?;
    bar.finish_and_clear();
    if store.read_many(&batches[0])?.iter().any(Option::is_some) {
        bail!("{name}: taken pages are still stored");
    }
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    println!(
        "  write {:.2} GB/s, read {:.2} GB/s, take {:.2} GB/s; every byte verified",
        gbs(write_s),
        gbs(read_s),
        gbs(take_s)
    );
    Ok(())
}
