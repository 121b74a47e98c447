//! Part (b), Midas Table 3: cooperative reclamation (the evacuator compacting segments at live
//! ratios 10-90%, net MiB/s given back) and direct reclamation (punching 2 MiB segments,
//! GiB/s).

use super::shared::arena;
use crate::harness::{median, Ctx};
use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use std::time::Instant;
use tidepool_soft::{ShmemHugePages, SoftPool, SEGMENT};

pub(super) const LIVE_RATIOS: [f64; 5] = [0.1, 0.3, 0.5, 0.7, 0.9];
/// Midas's published figures (NSDI'24, Table 3), MiB/s, for the verdict.
pub(super) const MIDAS_COOPERATIVE: [f64; 5] = [312.5, 243.1, 173.6, 104.2, 34.7];
pub(super) const MIDAS_DIRECT_MIB_S: f64 = 8268.5;

/// Net MiB/s given back by compacting segments of 64-byte objects, `live` of them alive.
fn cooperative(segments: usize, live: f64) -> Result<f64> {
    let arena = arena((2 * segments + 8) * SEGMENT)?;
    let pool = SoftPool::new(&arena, |_: ()| [0u8; 48]);
    let per_segment = SEGMENT / 64;
    let mut boxes: Vec<_> = (0..segments * per_segment)
        .map(|i| pool.new_box_with([i as u8; 48]))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    boxes.retain(|_| rng.gen_bool(live));
    let t = Instant::now();
    let r = arena.evacuate(usize::MAX, 1.0);
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(r.segments_freed > 0, "evacuation freed nothing: {r:?}");
    let net = (r.segments_freed as f64 * SEGMENT as f64 - r.bytes_moved as f64).max(0.0);
    drop(boxes);
    Ok(net / secs / (1 << 20) as f64)
}

/// The median GiB/s of three runs of [`direct`], and the most shmem huge-page memory seen
/// populated (KiB).
fn direct_median(bytes: usize) -> Result<(f64, u64)> {
    let mut v = Vec::new();
    let mut huge_kib = 0;
    for _ in 0..3 {
        let before = shmem_huge_kib();
        v.push(direct(bytes, &mut || {
            huge_kib = huge_kib.max(shmem_huge_kib().saturating_sub(before))
        })?);
    }
    Ok((median(&mut v), huge_kib))
}

/// GiB/s of punching populated segments; `probe` runs once they are populated.
fn direct(bytes: usize, probe: &mut dyn FnMut()) -> Result<f64> {
    let arena = arena(bytes + 8 * SEGMENT)?;
    let pool = SoftPool::new(&arena, |_: ()| [0u8; SEGMENT / 2]);
    let chunk: Box<[u8; SEGMENT / 2]> = vec![1u8; SEGMENT / 2]
        .into_boxed_slice()
        .try_into()
        .expect("half a segment");
    let mut boxes = Vec::new();
    while arena.usage() < bytes {
        let b = pool.new_box();
        b.write_from(&chunk)?;
        boxes.push(b);
    }
    probe();
    let t = Instant::now();
    let mut freed = 0;
    loop {
        let n = arena.punch_oldest();
        if n == 0 {
            break;
        }
        freed += n;
    }
    Ok(freed as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64)
}

const SHMEM_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// Turns shmem huge pages on for the duration; restores the setting on drop.
struct HugeShmem {
    before: String,
}

impl HugeShmem {
    fn enable() -> Result<HugeShmem> {
        let text = std::fs::read_to_string(SHMEM_ENABLED).context("reading shmem_enabled")?;
        let before = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
            .context("no [selected] value in shmem_enabled")?
            .to_string();
        std::fs::write(SHMEM_ENABLED, "within_size")
            .context("cannot switch shmem huge pages on (needs root)")?;
        Ok(HugeShmem { before })
    }
}

impl Drop for HugeShmem {
    fn drop(&mut self) {
        let _ = std::fs::write(SHMEM_ENABLED, &self.before);
    }
}

fn shmem_huge_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("ShmemHugePages:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Part (b): cooperative reclamation at each live ratio, then direct reclamation with 4 KiB
/// pages and, where shmem huge pages can be switched on, 2 MiB pages.
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let quick = ctx.opts.quick;
    let segments = if quick { 32 } else { 128 };
    for &live in &LIVE_RATIOS {
        ctx.step(format!(
            "cooperative reclamation at {:.0}% live",
            live * 100.0
        ));
        let mut v = Vec::new();
        for _ in 0..if quick { 1 } else { 3 } {
            v.push(cooperative(segments, live)?);
        }
        ctx.report.push(
            "tidepool-soft",
            "reclaim-cooperative",
            "mib_per_s",
            median(&mut v),
            "MiB/s",
            &[("live_ratio", live)],
        );
        ctx.advance();
    }
    let bytes = if quick { 512 << 20 } else { 2 << 30 };
    ctx.step("direct reclamation, 4 KiB pages");
    if ShmemHugePages::detect() == ShmemHugePages::Enabled {
        ctx.note("shmem huge pages are on on this machine: the 4 KiB-page figure uses them too");
    }
    let push = |ctx: &mut Ctx, gib_s: f64, huge: f64| {
        ctx.report.push(
            "tidepool-soft",
            "reclaim-direct",
            "gib_per_s",
            gib_s,
            "GiB/s",
            &[("huge_pages", huge)],
        )
    };
    let (gib_s, _) = direct_median(bytes)?;
    push(ctx, gib_s, 0.0);
    ctx.advance();
    ctx.step("direct reclamation, 2 MiB shmem pages");
    match HugeShmem::enable() {
        Ok(_on) => {
            let (gib_s, huge_kib) = direct_median(bytes)?;
            if huge_kib == 0 {
                ctx.note("shmem huge pages were switched on, but no segment got one");
            }
            push(ctx, gib_s, 1.0);
        }
        Err(e) => ctx.note(format!(
            "direct reclamation with huge pages not measured: {e:#}"
        )),
    }
    ctx.advance();
    Ok(())
}
