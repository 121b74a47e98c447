//! Part (a), Midas Table 2: a SoftBox against a `Box` copy, read and write latency for 32 B,
//! 4 KiB and 4 MiB objects.

use super::shared::arena;
use crate::harness::{Ctx, Matrix, Sample, System, Workload};
use anyhow::{Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Instant;
use tidepool_soft::{SoftPool, SEGMENT};

/// Object sizes measured.
pub(super) const SIZES: [usize; 3] = [32, 4096, 4 << 20];

/// A `Box` and a SoftBox, timed side by side in one measurement (their reads take turns, a
/// slice at a time, so a slow spell of the machine weighs on both alike): the Box's figures
/// are `native`'s, the SoftBox's `tidepool-soft`'s.
#[derive(Debug, Clone, Copy)]
struct BoxAndSoftBox;

impl System for BoxAndSoftBox {
    fn name(&self) -> &'static str {
        "native"
    }
}

/// Objects of one size.
#[derive(Debug, Clone, Copy)]
struct Objects(usize);

impl Workload for Objects {
    fn name(&self) -> &str {
        "latency"
    }

    fn on(&self, _system: &str) -> String {
        format!("latency, {} B objects", self.0)
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![("object_bytes", self.0 as f64)]
    }
}

/// Part (a): per object size, (Box, SoftBox) microseconds per read, then per write; the
/// median of the rounds.
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let quick = ctx.opts.quick;
    let ws = if quick { 128 << 20 } else { 512 << 20 };
    let workloads = SIZES.map(Objects);
    let samples =
        Matrix::new(&[BoxAndSoftBox], &workloads, ctx.opts.rounds()).run(ctx, |_, _, w, _| {
            let r = match w.0 {
                32 => chained::<4>(ws / 48, if quick { 1 << 20 } else { 4 << 20 })?,
                4096 => chained::<512>(ws / 4112, if quick { 1 << 16 } else { 1 << 18 })?,
                _ => large(if quick { 16 } else { 48 })?,
            };
            let mut sample = Sample::new();
            for (workload, (boxed, soft)) in ["read-latency", "write-latency"].into_iter().zip(r) {
                sample = sample
                    .median("mean_us", "us", boxed / 1e3)
                    .in_workload(workload)
                    .median("mean_us", "us", soft / 1e3)
                    .in_workload(workload)
                    .of("tidepool-soft");
            }
            Ok(sample)
        })?;
    samples.report(ctx);
    Ok(())
}

/// Per-read and per-write nanoseconds, Box then SoftBox, for objects of `W` words.
fn chained<const W: usize>(count: usize, steps: usize) -> Result<[(f64, f64); 2]> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(W as u64);
    let mut order: Vec<usize> = (0..count).collect();
    order.shuffle(&mut rng);
    let mut next = vec![0u64; count];
    for k in 0..count {
        next[order[k]] = order[(k + 1) % count] as u64;
    }
    let value = |i: usize| {
        let mut v = [i as u64; W];
        v[0] = next[i];
        v
    };
    let boxes: Vec<Box<[u64; W]>> = (0..count).map(|i| Box::new(value(i))).collect();
    let arena = arena((count * (W * 8 + 16)).next_multiple_of(SEGMENT) * 2 + 16 * SEGMENT)?;
    let pool = SoftPool::new(&arena, move |_: ()| [0u64; W]);
    let soft = (0..count)
        .map(|i| pool.new_box_with(value(i)))
        .collect::<Result<Vec<_>, _>>()?;
    let writes: Vec<usize> = (0..steps).map(|_| rng.gen_range(0..count)).collect();
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / steps as f64;
    // Reads: a chain, so each is one dependent access. The two chains take turns, a slice
    // at a time, so that a slow spell of the machine weighs on both alike.
    const SLICES: usize = 8;
    let (mut box_nanos, mut soft_nanos) = (0u128, 0u128);
    let (mut i, mut j) = (0, 0);
    for _ in 0..SLICES {
        let t = Instant::now();
        for _ in 0..steps / SLICES {
            i = black_box(&boxes[i])[0] as usize;
        }
        box_nanos += t.elapsed().as_nanos();
        let t = Instant::now();
        for _ in 0..steps / SLICES {
            j = soft[j]
                .get()
                .context("a soft object vanished with memory to spare")?[0]
                as usize;
        }
        soft_nanos += t.elapsed().as_nanos();
    }
    let chain_steps = (steps / SLICES * SLICES) as f64;
    let box_read = box_nanos as f64 / chain_steps;
    let soft_read = soft_nanos as f64 / chain_steps;
    black_box((i, j));
    // Writes to random objects (keeping each object's link).
    let mut boxes = boxes;
    let t = Instant::now();
    for &k in &writes {
        let mut v = [k as u64; W];
        v[0] = next[k];
        *boxes[k] = black_box(v);
    }
    let box_write = per(t);
    let t = Instant::now();
    for &k in &writes {
        let mut v = [k as u64; W];
        v[0] = next[k];
        soft[k].write(black_box(v))?;
    }
    let soft_write = per(t);
    Ok([(box_read, soft_read), (box_write, soft_write)])
}

/// Microseconds per read and per write of 4 MiB objects, Box then SoftBox.
fn large(count: usize) -> Result<[(f64, f64); 2]> {
    const BIG: usize = 4 << 20;
    let make = |fill: u8| -> Box<[u8; BIG]> {
        vec![fill; BIG]
            .into_boxed_slice()
            .try_into()
            .expect("BIG bytes")
    };
    let boxes: Vec<_> = (0..count).map(|i| make(i as u8)).collect();
    let arena = arena((count + 4) * 3 * SEGMENT)?;
    let pool = SoftPool::new(&arena, |_: ()| [0u8; BIG]);
    let soft: Vec<_> = (0..count).map(|_| pool.new_box()).collect();
    for (b, s) in boxes.iter().zip(&soft) {
        s.write_from(b)?;
    }
    let mut out = make(0);
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / count as f64;
    let t = Instant::now();
    for b in &boxes {
        out.copy_from_slice(&b[..]);
        black_box(&out);
    }
    let box_read = per(t);
    let t = Instant::now();
    for s in &soft {
        anyhow::ensure!(s.get_into(&mut out), "a 4 MiB soft object vanished");
        black_box(&out);
    }
    let soft_read = per(t);
    let mut boxes = boxes;
    let t = Instant::now();
    for b in boxes.iter_mut() {
        b.copy_from_slice(&out[..]);
        black_box(&b);
    }
    let box_write = per(t);
    let t = Instant::now();
    for s in &soft {
        s.write_from(&out)?;
    }
    let soft_write = per(t);
    Ok([(box_read, soft_read), (box_write, soft_write)])
}
