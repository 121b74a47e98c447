//! The worker side of the far suite's graph traversal: `tidepool bench-worker`'s `far-graph` job,
//! the same walk over plain vectors or far vectors.

use crate::data::splitmix64;
use crate::job::{GraphJob, GraphSystem};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_far::{Config, Far, FarVec, Section, SectionConfig, Structure};

/// One edge of the graph: the two nodes it adds to.
#[derive(
    Clone,
    Copy,
    Default,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
struct Edge {
    from: u32,
    to: u32,
}

/// Edge `i` of a graph of `nodes` nodes: both ends uniformly random (SplitMix64 of `i`), so
/// every system can make the same graph in any order without storing it first.
fn edge(i: u64, nodes: u64) -> Edge {
    let z = splitmix64(i.wrapping_add(1));
    Edge {
        from: ((z & 0xFFFF_FFFF) % nodes) as u32,
        to: ((z >> 32) % nodes) as u32,
    }
}

/// Edges between looks at the clock.
const CHECK_EVERY: u64 = 1 << 14;

/// Builds the graph, then walks its edges (over and over) for the job's seconds, and prints
/// `{"value": edges/s, ...}`.
pub fn graph_worker(job: GraphJob) -> Result<()> {
    let GraphJob {
        system,
        nodes,
        edges,
        seconds,
        local,
    } = job;
    if nodes == 0 || nodes > u32::MAX as u64 || edges == 0 {
        bail!("a graph has 1 to 2^32 nodes and at least one edge, not {nodes} and {edges}");
    }
    let run_for = Duration::from_secs_f64(seconds);
    let (done, secs, checksum, extra) = match system {
        GraphSystem::Native => graph_native(nodes, edges, run_for),
        GraphSystem::Far {
            config,
            profile_out,
        } => {
            let text = std::fs::read_to_string(&config).with_context(|| {
                format!("reading the section configuration {}", config.display())
            })?;
            let config = Config::from_toml(&text)?;
            graph_far(
                nodes,
                edges,
                run_for,
                local as usize,
                Some(&config),
                profile_out,
            )?
        }
        GraphSystem::FarSwap => graph_far(nodes, edges, run_for, local as usize, None, None)?,
    };
    println!(
        "{{\"value\": {}, \"edges\": {done}, \"checksum\": {checksum}{extra}}}",
        done as f64 / secs
    );
    Ok(())
}

fn graph_native(nodes: u64, edges: u64, run_for: Duration) -> (u64, f64, u64, String) {
    let e: Vec<Edge> = (0..edges).map(|i| edge(i, nodes)).collect();
    let mut n = vec![0u64; nodes as usize];
    // Touched before the clock starts, as the far systems load their sections first.
    n.fill(0);
    std::hint::black_box(&mut n);
    let start = Instant::now();
    let (mut i, mut done) = (0usize, 0u64);
    loop {
        for _ in 0..CHECK_EVERY {
            let x = e[i];
            n[x.from as usize] += i as u64;
            n[x.to as usize] += 1;
            i += 1;
            if i == e.len() {
                i = 0;
            }
        }
        done += CHECK_EVERY;
        if start.elapsed() >= run_for {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    (done, secs, n.iter().sum(), String::new())
}

/// Bytes of a far vector's line table: local memory it uses besides its section.
fn table_bytes(bytes: u64, line: u64) -> u64 {
    bytes.div_ceil(line) * 4
}

/// The edges' and the nodes' sections, whether the nodes fit theirs whole, and how many lines
/// the edges fetch ahead: `config`'s, or, without one, swap-like: one fully associative
/// section of pages for both, in `local` bytes less the line tables.
fn sections(
    config: Option<&Config>,
    node_bytes: u64,
    edge_bytes: u64,
    local: usize,
) -> Result<(Rc<Section>, Rc<Section>, bool, usize)> {
    const PAGE: u64 = 4096;
    Ok(match config {
        None => {
            let tables = table_bytes(node_bytes, PAGE) + table_bytes(edge_bytes, PAGE);
            let cap = (local as u64).saturating_sub(tables).max(2 * PAGE);
            let s = Section::new(SectionConfig::new(
                Structure::Full,
                PAGE as usize,
                cap as usize,
            ))?;
            (s.clone(), s, false, 8)
        }
        Some(c) => {
            let site = |name: &str| {
                c.site
                    .get(name)
                    .with_context(|| format!("the configuration has no section for {name}"))
            };
            let (e, n) = (site("graph.edges")?, site("graph.nodes")?);
            let whole = n.structure()? == Structure::Direct && n.capacity as u64 >= node_bytes;
            (e.section()?, n.section()?, whole, e.prefetch)
        }
    })
}

/// After the walk: the nodes' checksum (0 in a profiling run: the profile is of the walk, not
/// of a check after it), the sections' misses and fetches as extra JSON fields, and the
/// profile written to `profile` if asked for.
fn after_walk(
    far: &Far,
    ev: FarVec<Edge>,
    nv: FarVec<u64>,
    (es, ns): (&Section, &Section),
    profile: Option<PathBuf>,
) -> Result<(u64, String)> {
    let checksum = if profile.is_some() {
        0
    } else {
        nv.iter().try_fold(0u64, |a, x| x.map(|x| a + x))?
    };
    let (e, n) = (es.stats(), ns.stats());
    let extra = format!(
        ", \"node_misses\": {}, \"node_fetches\": {}, \"edge_misses\": {}",
        n.misses, n.fetches, e.misses
    );
    if let Some(path) = profile {
        drop((ev, nv));
        std::fs::write(&path, far.profile().to_json())
            .with_context(|| format!("writing the profile {}", path.display()))?;
    }
    Ok((checksum, extra))
}

/// The graph over far vectors: in `config`'s sections (profiling into `profile` if given),
/// or, without one, swap-like: one fully associative section, element by element.
fn graph_far(
    nodes: u64,
    edges: u64,
    run_for: Duration,
    local: usize,
    config: Option<&Config>,
    profile: Option<PathBuf>,
) -> Result<(u64, f64, u64, String)> {
    let far = Far::new(Arc::new(tidepool_store::LocalStore::new()));
    if profile.is_some() {
        far.enable_profiling();
    }
    let swap_like = config.is_none();
    let (es, ns, nodes_local, ahead) = sections(config, nodes * 8, edges * 8, local)?;
    let ev: FarVec<Edge> = FarVec::named(&far, &es, edges as usize, "graph.edges")?;
    // Written a line at a time through the section (no fetch: whole lines), never all local.
    ev.fill_with(|i| edge(i as u64, nodes))?;
    let per = ev.per_line();
    ev.set_prefetch(ahead);
    let nv: FarVec<u64> = FarVec::named(&far, &ns, nodes as usize, "graph.nodes")?;
    if nodes_local {
        nv.load_all()?;
    }
    let start = Instant::now();
    let mut done = 0u64;
    let mut wanted = Vec::with_capacity(2 * per);
    'walk: loop {
        if swap_like {
            // Element by element, as a program on swap would.
            let mut i = 0u64;
            for x in ev.iter() {
                let x = x?;
                nv.update(x.from as usize, |n| *n += i)?;
                nv.update(x.to as usize, |n| *n += 1)?;
                i += 1;
                if i.is_multiple_of(CHECK_EVERY) && start.elapsed() >= run_for {
                    done += i;
                    break 'walk;
                }
            }
            done += i;
        } else if let Some(mut n) = nv.local_mut() {
            let mut i = 0u64;
            for line in ev.line_iter() {
                for x in line?.iter() {
                    n[x.from as usize] += i;
                    n[x.to as usize] += 1;
                    i += 1;
                }
                if start.elapsed() >= run_for {
                    done += i;
                    break 'walk;
                }
            }
            done += i;
        } else {
            let mut i = 0u64;
            for line in ev.line_iter() {
                let line = line?;
                // Split phase: the node lines of this line of edges, in one round trip.
                wanted.clear();
                wanted.extend(line.iter().flat_map(|x| [x.from as usize, x.to as usize]));
                nv.request(&wanted)?;
                for x in line.iter() {
                    nv.update(x.from as usize, |n| *n += i)?;
                    nv.update(x.to as usize, |n| *n += 1)?;
                    i += 1;
                }
                if start.elapsed() >= run_for {
                    done += i;
                    break 'walk;
                }
            }
            done += i;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let (checksum, extra) = after_walk(&far, ev, nv, (&es, &ns), profile)?;
    Ok((done, secs, checksum, extra))
}
