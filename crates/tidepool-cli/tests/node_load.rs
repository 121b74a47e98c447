//! Load: 16 concurrent clients, 100,000 mixed operations each, every payload verified, no error
//! allowed; the node's memory stays within its capacity plus a fixed overhead.

mod common;

use bytes::Bytes;
use common::{payload, NodeProc};
use rand::{Rng, SeedableRng};
use tidepool_proto::Handle;
use tidepool_store::NodeClient;

const CLIENTS: usize = 16;
const OPS: usize = 100_000;
const MAX_LIVE: usize = 300;
const CAPACITY: u64 = 128 << 20;
/// Metadata, buffers, stacks and the binary itself: independent of how much data flows.
const OVERHEAD: u64 = 64 << 20;

struct Live {
    handle: Handle,
    seed: u64,
    len: usize,
    /// Bytes the block can hold: writes up to this size are in place.
    room: usize,
}

fn size(rng: &mut impl Rng) -> usize {
    match rng.gen_range(0..100) {
        0 => rng.gen_range(256 << 10..600 << 10), // large path
        1..=20 => rng.gen_range(0..256),
        21..=80 => 4096,
        _ => rng.gen_range(256..32 << 10),
    }
}

fn check(got: &[u8], o: &Live, what: &str) {
    assert!(
        got == payload(o.seed, o.len).as_slice(),
        "{what}: object {:?} ({} bytes) came back wrong",
        o.handle,
        o.len
    );
}

fn client(addr: String, id: usize) -> u64 {
    let c = NodeClient::connect(&addr, &format!("load{id}"), "").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(id as u64);
    let mut live: Vec<Live> = vec![];
    let mut next_seed = (id as u64) << 40;
    let mut verified = 0u64;
    for _ in 0..OPS {
        let roll = rng.gen_range(0..100);
        let pick = |rng: &mut rand::rngs::StdRng, n: usize| rng.gen_range(0..n);
        match roll {
            0..=24 if live.len() < MAX_LIVE => {
                let len = size(&mut rng);
                next_seed += 1;
                let h = c.put(Bytes::from(payload(next_seed, len))).unwrap();
                live.push(Live {
                    handle: h,
                    seed: next_seed,
                    len,
                    room: tidepool_node::spans::footprint(len) as usize,
                });
            }
            25..=29 if live.len() + 8 <= MAX_LIVE => {
                let n = rng.gen_range(1..=8);
                let seeds: Vec<(u64, usize)> = (0..n)
                    .map(|_| {
                        next_seed += 1;
                        (next_seed, size(&mut rng))
                    })
                    .collect();
                let items = seeds
                    .iter()
                    .map(|&(s, l)| Bytes::from(payload(s, l)))
                    .collect();
                for (r, (seed, len)) in c.put_many(items).unwrap().into_iter().zip(seeds) {
                    live.push(Live {
                        handle: r.unwrap(),
                        seed,
                        len,
                        room: tidepool_node::spans::footprint(len) as usize,
                    });
                }
            }
            _ if live.is_empty() => {}
            30..=54 => {
                let o = &live[pick(&mut rng, live.len())];
                check(&c.get(o.handle).unwrap(), o, "get");
                verified += 1;
            }
            55..=64 => {
                let idx: Vec<usize> = (0..rng.gen_range(1..=8))
                    .map(|_| pick(&mut rng, live.len()))
                    .collect();
                let got = c
                    .get_many(idx.iter().map(|&i| live[i].handle).collect())
                    .unwrap();
                for (g, &i) in got.iter().zip(&idx) {
                    check(g.as_ref().unwrap(), &live[i], "get-many");
                    verified += 1;
                }
            }
            65..=74 => {
                let i = pick(&mut rng, live.len());
                next_seed += 1;
                let len = rng.gen_range(0..=live[i].room);
                c.write(live[i].handle, Bytes::from(payload(next_seed, len)))
                    .unwrap();
                live[i].seed = next_seed;
                live[i].len = len;
            }
            75..=84 => {
                let o = live.swap_remove(pick(&mut rng, live.len()));
                check(&c.take(o.handle).unwrap(), &o, "take");
                verified += 1;
            }
            85..=94 => {
                let o = live.swap_remove(pick(&mut rng, live.len()));
                c.free(o.handle).unwrap();
            }
            95..=97 => {
                let n = rng.gen_range(1..=4).min(live.len());
                let gone: Vec<Live> = (0..n)
                    .map(|_| live.swap_remove(pick(&mut rng, live.len())))
                    .collect();
                let got = c
                    .take_many(gone.iter().map(|o| o.handle).collect())
                    .unwrap();
                for (g, o) in got.iter().zip(&gone) {
                    check(g.as_ref().unwrap(), o, "take-many");
                    verified += 1;
                }
            }
            _ => {
                let stats = c.stats().unwrap();
                let objects = stats.iter().find(|(k, _)| k == "tenant.objects").unwrap().1;
                assert_eq!(
                    objects,
                    live.len() as u64,
                    "the node's count of this tenant's objects"
                );
            }
        }
    }
    // Everything left is read back once more, then freed; the tenant ends empty.
    for o in &live {
        check(&c.get(o.handle).unwrap(), o, "final get");
        verified += 1;
    }
    let frees = c
        .free_many(live.iter().map(|o| o.handle).collect())
        .unwrap();
    assert!(frees.iter().all(Result::is_ok));
    let stats = c.stats().unwrap();
    let get = |name: &str| stats.iter().find(|(k, _)| k == name).unwrap().1;
    assert_eq!(get("tenant.objects"), 0);
    assert_eq!(get("tenant.bytes_allocated"), 0);
    assert_eq!(get("tenant.errors"), 0);
    verified
}

#[test]
fn sixteen_clients_100k_mixed_ops_each_all_verified() {
    let mut node = NodeProc::start(&["--capacity", &CAPACITY.to_string()]);
    let addr = node.addr.clone();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || client(addr, i))
        })
        .collect();
    let verified: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("a client failed"))
        .sum();
    assert!(node.alive());
    let (rss, peak) = node.rss();
    eprintln!(
        "{CLIENTS} clients x {OPS} ops: {verified} payloads verified; node RSS {} MiB, peak {} MiB \
         (capacity {} MiB)",
        rss >> 20,
        peak >> 20,
        CAPACITY >> 20
    );
    assert!(
        peak <= CAPACITY + OVERHEAD,
        "node peak RSS {} MiB exceeds capacity {} MiB + {} MiB overhead",
        peak >> 20,
        CAPACITY >> 20,
        OVERHEAD >> 20
    );
}
