//! The Rust face: this test binary runs entirely on `TidepoolAlloc`, std and the test harness
//! included.

use std::collections::{BTreeMap, HashMap};
use tidepool_alloc::TidepoolAlloc;

#[global_allocator]
static ALLOC: TidepoolAlloc = TidepoolAlloc;

#[test]
fn collections_work_on_it() {
    let mut m: HashMap<String, Vec<u64>> = HashMap::new();
    for i in 0..100_000u64 {
        m.entry(format!("key-{}", i % 5000)).or_default().push(i);
    }
    assert_eq!(m.len(), 5000);
    assert_eq!(m["key-42"].len(), 20);
    let b: BTreeMap<u64, Box<[u8]>> = (0..10_000)
        .map(|i| (i, vec![i as u8; (i % 700) as usize].into()))
        .collect();
    assert!(b.iter().all(|(k, v)| v.iter().all(|&x| x == *k as u8)));
}

#[test]
fn over_aligned_layouts() {
    #[repr(align(4096))]
    struct Page([u8; 4096]);
    #[repr(align(128))]
    struct Line([u8; 100]);
    let pages: Vec<Box<Page>> = (0..50).map(|i| Box::new(Page([i as u8; 4096]))).collect();
    let lines: Vec<Line> = (0..1000).map(|i| Line([i as u8; 100])).collect();
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(&**p as *const Page as usize % 4096, 0);
        assert!(p.0.iter().all(|&x| x == i as u8));
    }
    assert_eq!(lines.as_ptr() as usize % 128, 0);
    let mut grow: Vec<Line> = Vec::new();
    for i in 0..5000 {
        grow.push(Line([i as u8; 100]));
    }
    assert_eq!(grow.as_ptr() as usize % 128, 0);
    assert!(grow.iter().enumerate().all(|(i, l)| l.0[99] == i as u8));
    let zeroed = vec![0u64; 1 << 20];
    assert!(zeroed.iter().all(|&x| x == 0));
}

#[test]
fn many_threads_sharing_boxes() {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Box<[u32]>>(64);
    let producers: Vec<_> = (0..4)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..20_000u32 {
                    tx.send(vec![t * 1_000_000 + i; (i % 64) as usize + 1].into())
                        .unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let mut n = 0;
    for b in rx {
        assert!(b.iter().all(|&x| x == b[0]));
        n += 1;
    }
    producers.into_iter().for_each(|p| p.join().unwrap());
    assert_eq!(n, 80_000);
}
