//! Queries and gathers over far vectors stored on a real memory node on loopback: offloaded,
//! computed here, and against plain loops over the same data.

use std::sync::Arc;
use tidepool_far::{Buckets, Structure};
use tidepool_far::{Cmp, Far, FarError, FarVec, Offload, Query, Ran, Section, SectionConfig};
use tidepool_node::{NodeConfig, Server};

fn node() -> (Server, Far) {
    let server = Server::start(NodeConfig::new("127.0.0.1:0", 64 << 20)).expect("node starts");
    let store = tidepool_store::open(&format!("node://far@{}", server.local_addr())).unwrap();
    (server, Far::new(store))
}

/// A section of 8 lines of 512 B: far smaller than the columns below.
fn small() -> std::rc::Rc<Section> {
    Section::new(SectionConfig::new(
        Structure::SetAssociative(2),
        512,
        8 * 512,
    ))
    .unwrap()
}

const ROWS: usize = 10_000;

fn columns(far: &Far) -> (FarVec<u32>, FarVec<u32>, FarVec<f64>) {
    let sec = small();
    let region: Vec<u32> = (0..ROWS as u32).map(|i| (i * 7919) % 5).collect();
    let qty: Vec<u32> = (0..ROWS as u32).map(|i| (i * 31) % 100).collect();
    let price: Vec<f64> = (0..ROWS).map(|i| (i % 977) as f64 * 0.5 - 100.0).collect();
    // Different element sizes give different elements per line: price gets its own
    // section with lines twice as long, so every column has 128 per line.
    let wide = Section::new(SectionConfig::new(
        Structure::SetAssociative(2),
        1024,
        8 * 1024,
    ))
    .unwrap();
    (
        FarVec::from_slice(far, &sec, &region).unwrap(),
        FarVec::from_slice(far, &sec, &qty).unwrap(),
        FarVec::from_slice(far, &wide, &price).unwrap(),
    )
}

/// (sum, min, max, count, histogram of price over [-100, 400) in 5) per region, of rows with
/// qty > 40, by a plain loop.
type Row = (f64, f64, f64, u64, Vec<u64>);

fn plain(region: &[u32], qty: &[u32], price: &[f64]) -> Vec<Row> {
    let mut out = vec![(0.0, f64::INFINITY, f64::NEG_INFINITY, 0, vec![0; 5]); 5];
    for i in 0..region.len() {
        if qty[i] > 40 {
            let g = &mut out[region[i] as usize];
            g.0 += price[i];
            g.1 = g.1.min(price[i]);
            g.2 = g.2.max(price[i]);
            g.3 += 1;
            if (-100.0..400.0).contains(&price[i]) {
                g.4[((price[i] + 100.0) / 100.0) as usize] += 1;
            }
        }
    }
    out
}

fn query(
    region: &FarVec<u32>,
    qty: &FarVec<u32>,
    price: &FarVec<f64>,
    how: Offload,
) -> Result<(Vec<Row>, Ran), FarError> {
    let mut q = Query::new();
    let (r, n, p) = (q.column(region)?, q.column(qty)?, q.column(price)?);
    q.filter(n, Cmp::Gt, 40).group_by(r, 5);
    let (sum, min, max, count, hist) = (
        q.sum(p),
        q.min(p),
        q.max(p),
        q.count(),
        q.histogram(p, -100.0, 400.0, 5),
    );
    let a = q.run(how)?;
    let rows = (0..a.groups())
        .map(|g| {
            let Buckets(h) = a.get(g, &hist);
            (
                a.get(g, &sum),
                a.get(g, &min),
                a.get(g, &max),
                a.get(g, &count),
                h,
            )
        })
        .collect();
    Ok((rows, a.ran))
}

#[test]
fn offloaded_and_local_queries_match_a_plain_loop() {
    let (server, far) = node();
    let (region, qty, price) = columns(&far);
    let want = plain(
        &region.to_vec().unwrap(),
        &qty.to_vec().unwrap(),
        &price.to_vec().unwrap(),
    );
    let (node, ran) = query(&region, &qty, &price, Offload::Always).unwrap();
    assert_eq!(ran, Ran::Node);
    assert_eq!(node, want);
    let (here, ran) = query(&region, &qty, &price, Offload::Never).unwrap();
    assert_eq!(ran, Ran::Local);
    assert_eq!(here, want);
    // Most lines are not resident and the node answers: Auto goes there.
    assert_eq!(
        query(&region, &qty, &price, Offload::Auto).unwrap().1,
        Ran::Node
    );
    server.shutdown();
}

#[test]
fn dirty_lines_reach_the_node_before_it_computes() {
    let (server, far) = node();
    let (region, qty, price) = columns(&far);
    // Changes that live only in the cache until the query writes them back.
    for i in [0, 1, 2, 5000, ROWS - 1] {
        qty.set(i, 99).unwrap();
        price.set(i, 1000.0).unwrap();
        region.set(i, 4).unwrap();
    }
    let want = plain(
        &region.to_vec().unwrap(),
        &qty.to_vec().unwrap(),
        &price.to_vec().unwrap(),
    );
    assert_eq!(want[4].2, 1000.0);
    let (node, _) = query(&region, &qty, &price, Offload::Always).unwrap();
    assert_eq!(node, want);
    server.shutdown();
}

#[test]
fn whole_vector_helpers_and_gather_match_on_the_node() {
    let (server, far) = node();
    let (_, qty, price) = columns(&far);
    let q = qty.to_vec().unwrap();
    let p = price.to_vec().unwrap();
    assert_eq!(qty.sum().unwrap(), q.iter().map(|&x| x as u64).sum::<u64>());
    assert_eq!(price.min().unwrap(), p.iter().copied().reduce(f64::min));
    assert_eq!(qty.max().unwrap(), q.iter().copied().max());
    assert_eq!(
        qty.count_where(Cmp::Le, 10).unwrap(),
        q.iter().filter(|&&x| x <= 10).count() as u64
    );
    let mut h = vec![0u64; 4];
    for &x in &q {
        if x < 80 {
            h[(x / 20) as usize] += 1;
        }
    }
    assert_eq!(qty.histogram(0, 80, 4).unwrap(), h);
    let idx: Vec<usize> = (0..500).map(|i| (i * 7907) % ROWS).collect();
    let want: Vec<f64> = idx.iter().map(|&i| p[i]).collect();
    assert_eq!(price.gather(&idx, Offload::Always).unwrap(), want);
    assert_eq!(price.gather(&idx, Offload::Never).unwrap(), want);
    price.set(idx[3], -1.5).unwrap();
    assert_eq!(price.gather(&idx, Offload::Auto).unwrap()[3], -1.5);
    assert!(matches!(
        price.gather(&[ROWS], Offload::Always),
        Err(FarError::OutOfBounds { .. })
    ));
    server.shutdown();
}

#[test]
fn a_bad_query_is_refused_and_loses_nothing() {
    let (server, far) = node();
    let (region, qty, price) = columns(&far);
    qty.set(7, 1234).unwrap();
    let mut q = Query::new();
    let (n, p) = (q.column(&qty).unwrap(), q.column(&price).unwrap());
    // Group keys up to 99 do not fit 10 groups.
    q.group_by(n, 10);
    q.sum(p);
    let err = q.run(Offload::Always).unwrap_err().to_string();
    assert!(err.contains("group key"), "{err}");
    let err = q.run(Offload::Never).unwrap_err().to_string();
    assert!(err.contains("group key"), "{err}");
    assert_eq!(qty.get(7).unwrap(), 1234);
    // Columns of different shapes do not make a query.
    let short: FarVec<u32> = FarVec::new(&far, region.section(), 10).unwrap();
    let mut q = Query::new();
    q.column(&region).unwrap();
    let err = q.column(&short).unwrap_err().to_string();
    assert!(err.contains("same length"), "{err}");
    server.shutdown();
}

#[test]
fn a_store_that_cannot_compute_runs_queries_here() {
    let far = Far::new(Arc::new(tidepool_store::LocalStore::new()));
    let (region, qty, price) = columns(&far);
    let want = plain(
        &region.to_vec().unwrap(),
        &qty.to_vec().unwrap(),
        &price.to_vec().unwrap(),
    );
    let (got, ran) = query(&region, &qty, &price, Offload::Auto).unwrap();
    assert_eq!((got, ran), (want, Ran::Local));
    let err = query(&region, &qty, &price, Offload::Always).unwrap_err();
    assert!(matches!(err, FarError::NoOffload(_)), "{err}");
    let idx = [3, 9999, 5000];
    let p = price.to_vec().unwrap();
    assert_eq!(
        price.gather(&idx, Offload::Auto).unwrap(),
        vec![p[3], p[9999], p[5000]]
    );
}
