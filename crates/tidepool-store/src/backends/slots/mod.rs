//! Size classes for the packed in-process store's values, after zram's zsmalloc: a value of
//! `n` bytes (at most [`MAX`]) takes a slot of `n` rounded up to [`GRAIN`] bytes, cut from a
//! chunk of [`CHUNK`] bytes that holds slots of that one class. A compressed page of 1000 bytes
//! so costs 1024, where a general-purpose allocator's size classes (a quarter of a power of two
//! apart) would round it up to 1280 and add a header.
//!
//! Chunks come from one reservation of address space made with the raw system call (never
//! through the program's allocator or an interposed `mmap`, so a pager never sees them). A
//! chunk whose last slot is freed goes back to the kernel (`MADV_DONTNEED`) and can serve any
//! class next; a few are kept ready to avoid refaulting them. A class allocates from the
//! chunk it freed into last, so slots gather in fewer chunks.
//!
//! Values come and go in any order, so chunks fill with holes: measured on go-map at half its
//! peak local, 102.6 MiB of chunks held 77.8 MiB of slots. As zsmalloc does, the map compacts
//! ([`SlotMap::compact`]) when the holes pass 4 MiB and a 32nd of what the slots hold: in each
//! class, the sparsest chunks whose slots fit in the others' holes are drained (their values
//! move, each under its shard's lock) and go back to the kernel.
//!
//! [`SlotMap`] maps keys to values kept that way, and is the store's only unsafe code: a slot
//! is named by exactly one map entry; its bytes are read only under the lock of the shard
//! holding that entry, and it is freed only after the entry left the map (or, when it moves,
//! was pointed at its new slot) under that lock, so no read can overlap its reuse.
#![allow(unsafe_code)]

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Slot sizes are multiples of this.
pub(crate) const GRAIN: usize = 32;
/// The largest value a slot holds: a page.
pub(crate) const MAX: usize = 4096;
const CLASSES: usize = MAX / GRAIN;
/// Each class allocates memory in chunks this big.
const CHUNK: usize = 32 << 10;
/// Address space reserved for chunks: far more than any machine's memory compressed.
const RESERVE: usize = 256 << 30;
const MAX_CHUNKS: usize = RESERVE / CHUNK;
/// Empty chunks kept mapped for reuse rather than given back at once.
const SPARE_CHUNKS: usize = 16;
/// Holes in chunks worth a compaction: at least this many bytes, and a 32nd of the bytes
/// in slots. A compaction leaves less than a chunk of holes per class (at most 4 MiB).
const COMPACT_MIN_HOLES: u64 = 4 << 20;
/// Inserts between two looks at the holes.
const COMPACT_EVERY: u64 = 1024;
/// No next free slot (the end of a chunk's free list).
const NONE: u16 = u16::MAX;

/// Where a value lives: the address of its slot and the slot's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    addr: usize,
    class: u8,
}

impl Slot {
    /// The bytes this slot takes.
    fn size(self) -> usize {
        class_size(self.class as usize)
    }
}

fn class_of(len: usize) -> usize {
    len.max(1).div_ceil(GRAIN) - 1
}

fn class_size(class: usize) -> usize {
    (class + 1) * GRAIN
}

fn slots_per_chunk(class: usize) -> u16 {
    (CHUNK / class_size(class)) as u16
}

/// The bytes at the end of a chunk of `class` that no slot fits in (3104 for the class of
/// 3296-byte slots): not a hole a compaction could fill.
fn chunk_tail(class: usize) -> u64 {
    (CHUNK - slots_per_chunk(class) as usize * class_size(class)) as u64
}

/// One chunk's bookkeeping, kept apart from the chunk (a header inside would cost a slot of
/// the largest classes): changed only under the lock of the class that owns the chunk.
#[derive(Debug, Clone, Copy, Default)]
struct ChunkState {
    /// Slots in use.
    live: u16,
    /// Slots never handed out: those from `fresh` on.
    fresh: u16,
    /// The first freed slot; each freed slot's first two bytes name the next.
    free: u16,
    /// Its place in its class's list of chunks with room, plus one (0: not there).
    listed: u32,
    /// Being emptied by a compaction: no slot is handed out from it, and it goes back to
    /// the kernel when its last slot is freed.
    draining: bool,
}

/// A class: the chunks of its slots that have room.
#[derive(Debug, Default)]
struct Class {
    with_room: Vec<u32>,
}

/// Raw memory: the chunks, and their states.
#[derive(Debug)]
struct Reservation {
    base: usize,
    states: *mut ChunkState,
}

// SAFETY: the reservation is plain memory; who touches which part is governed by the locks
// of `Slab` (a chunk and its state by its class's lock, the rest by `Chunks`).
unsafe impl Send for Reservation {}
// SAFETY: as above.
unsafe impl Sync for Reservation {}

/// A private anonymous mapping of `len` bytes that commits memory only as it is touched.
fn reserve(len: usize) -> usize {
    // SAFETY: a new mapping at an address the kernel picks; nothing else is affected. The
    // raw system call: an `mmap` the program (or a preload library) interposes must not
    // see the store's memory.
    let addr = unsafe {
        tidepool_sys::syscall!(
            libc::SYS_mmap,
            0usize,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1i32,
            0usize,
        )
    };
    if addr < 0 {
        // Nothing can be kept: the store must not pretend it kept a page.
        eprintln!(
            "tidepool: cannot reserve {} GiB of address space for the in-process store: {}",
            len >> 30,
            std::io::Error::last_os_error()
        );
        std::process::abort();
    }
    addr as usize
}

/// Chunks not owned by a class: never used (from `next` on), and emptied.
#[derive(Debug, Default)]
struct Chunks {
    next: u32,
    spare: Vec<u32>,
    given_back: Vec<u32>,
}

/// The slots of every class.
#[derive(Debug)]
struct Slab {
    mem: std::sync::OnceLock<Reservation>,
    classes: Box<[Mutex<Class>]>,
    chunks: Mutex<Chunks>,
    /// Bytes of chunks in use by a class (spare ones aside).
    held: AtomicU64,
    /// Bytes of slots in use.
    used: AtomicU64,
    /// Bytes of the classes' chunks past their last slot ([`chunk_tail`]).
    tails: AtomicU64,
}

impl Default for Slab {
    fn default() -> Slab {
        Slab {
            mem: std::sync::OnceLock::new(),
            classes: (0..CLASSES).map(|_| Mutex::default()).collect(),
            chunks: Mutex::default(),
            held: AtomicU64::new(0),
            used: AtomicU64::new(0),
            tails: AtomicU64::new(0),
        }
    }
}

impl Slab {
    fn mem(&self) -> &Reservation {
        self.mem.get_or_init(|| Reservation {
            base: reserve(RESERVE),
            states: reserve(MAX_CHUNKS * std::mem::size_of::<ChunkState>()) as *mut ChunkState,
        })
    }

    /// Chunk `c`'s state. Only under the lock of the class owning it, or of `chunks` while
    /// no class owns it.
    #[allow(clippy::mut_from_ref)]
    fn state(&self, c: u32) -> &mut ChunkState {
        assert!((c as usize) < MAX_CHUNKS);
        // SAFETY: within the states' mapping (checked above); exclusive by the locking rule
        // above, which every caller follows, and no caller keeps two states of one chunk.
        unsafe { &mut *self.mem().states.add(c as usize) }
    }

    fn slot_addr(&self, c: u32, class: usize, i: u16) -> usize {
        self.mem().base + c as usize * CHUNK + i as usize * class_size(class)
    }

    /// An empty chunk for `class`.
    fn take_chunk(&self, class: usize) -> u32 {
        self.tails.fetch_add(chunk_tail(class), Relaxed);
        let mut chunks = self.chunks.lock();
        if let Some(c) = chunks.spare.pop().or_else(|| chunks.given_back.pop()) {
            self.held.fetch_add(CHUNK as u64, Relaxed);
            return c;
        }
        let c = chunks.next;
        if c as usize >= MAX_CHUNKS {
            eprintln!(
                "tidepool: the in-process store is full ({} GiB of packed pages)",
                RESERVE >> 30
            );
            std::process::abort();
        }
        chunks.next += 1;
        self.held.fetch_add(CHUNK as u64, Relaxed);
        c
    }

    /// Takes back a chunk `class` no longer uses.
    fn give_chunk(&self, c: u32, class: usize) {
        self.tails.fetch_sub(chunk_tail(class), Relaxed);
        self.held.fetch_sub(CHUNK as u64, Relaxed);
        let mut chunks = self.chunks.lock();
        if chunks.spare.len() < SPARE_CHUNKS {
            chunks.spare.push(c);
            return;
        }
        let addr = self.mem().base + c as usize * CHUNK;
        // SAFETY: the chunk is ours and unused: its contents may go.
        unsafe { tidepool_sys::syscall!(libc::SYS_madvise, addr, CHUNK, libc::MADV_DONTNEED) };
        chunks.given_back.push(c);
    }

    /// A slot holding a copy of `bytes` (at most [`MAX`] bytes).
    fn store(&self, bytes: &[u8]) -> Slot {
        assert!(bytes.len() <= MAX, "a slab slot holds at most {MAX} bytes");
        let class = class_of(bytes.len());
        let per_chunk = slots_per_chunk(class);
        let addr = {
            let mut cl = self.classes[class].lock();
            let c = match cl.with_room.last() {
                Some(&c) => c,
                None => {
                    let c = self.take_chunk(class);
                    *self.state(c) = ChunkState {
                        live: 0,
                        fresh: 0,
                        free: NONE,
                        listed: cl.with_room.len() as u32 + 1,
                        draining: false,
                    };
                    cl.with_room.push(c);
                    c
                }
            };
            let st = self.state(c);
            let i = if st.free != NONE {
                let i = st.free;
                // SAFETY: a freed slot of this chunk holds the next one's index in its first
                // two bytes (written by `free`), and the class's lock is held.
                st.free = unsafe { (self.slot_addr(c, class, i) as *const u16).read_unaligned() };
                i
            } else {
                st.fresh += 1;
                st.fresh - 1
            };
            st.live += 1;
            if st.live == per_chunk {
                Self::unlist(&mut cl, self, c);
            }
            self.slot_addr(c, class, i)
        };
        self.used.fetch_add(class_size(class) as u64, Relaxed);
        // SAFETY: `addr` starts a slot of at least bytes.len() bytes in a mapped chunk, handed
        // to nobody else until it is freed.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        Slot {
            addr,
            class: class as u8,
        }
    }

    /// The chunk holding `slot`.
    fn chunk_of(&self, slot: Slot) -> u32 {
        ((slot.addr - self.mem().base) / CHUNK) as u32
    }

    /// Bytes of holes in chunks (mapped, not in a slot, spare chunks and chunks' tails
    /// aside).
    fn holes(&self) -> u64 {
        self.held
            .load(Relaxed)
            .saturating_sub(self.used.load(Relaxed) + self.tails.load(Relaxed))
    }

    /// Marks for draining the sparsest chunks of `class` whose slots fit in the holes of its
    /// other chunks, adding them to `drained`; how many.
    fn drain_sparsest(&self, class: usize, drained: &mut FxHashSet<u32>) -> usize {
        let per = slots_per_chunk(class) as usize;
        let mut cl = self.classes[class].lock();
        let mut chunks: Vec<(u16, u32)> = cl
            .with_room
            .iter()
            .map(|&c| (self.state(c).live, c))
            .collect();
        let mut room: usize = chunks.iter().map(|&(live, _)| per - live as usize).sum();
        if room < per {
            return 0;
        }
        chunks.sort_unstable();
        let (mut moving, mut taken) = (0, 0);
        for &(live, _) in &chunks {
            // Draining this chunk takes its holes away from the room and adds its slots to
            // what has to move.
            let left = room - (per - live as usize);
            if moving + live as usize > left {
                break;
            }
            (room, moving, taken) = (left, moving + live as usize, taken + 1);
        }
        for &(_, c) in &chunks[..taken] {
            Self::unlist(&mut cl, self, c);
            self.state(c).draining = true;
            drained.insert(c);
        }
        taken
    }

    /// Takes chunk `c` off its class's list of chunks with room.
    fn unlist(cl: &mut Class, slab: &Slab, c: u32) {
        let at = slab.state(c).listed as usize - 1;
        cl.with_room.swap_remove(at);
        if let Some(&moved) = cl.with_room.get(at) {
            slab.state(moved).listed = at as u32 + 1;
        }
        slab.state(c).listed = 0;
    }

    /// The first `len` bytes of `slot`.
    ///
    /// # Safety
    /// `slot` came from this slab, holds at least `len` bytes written by [`Slab::store`], and
    /// is not freed while the returned slice lives.
    unsafe fn bytes(&self, slot: Slot, len: usize) -> &[u8] {
        debug_assert!(len <= slot.size());
        // SAFETY: by the caller's promise the slot is live and initialized for `len` bytes,
        // and nobody writes it until it is freed.
        unsafe { std::slice::from_raw_parts(slot.addr as *const u8, len) }
    }

    /// Gives `slot` back for reuse.
    ///
    /// # Safety
    /// `slot` came from this slab, is freed once, and nobody reads it any more.
    unsafe fn free(&self, slot: Slot) {
        let class = slot.class as usize;
        let off = slot.addr - self.mem().base;
        let (c, i) = (
            (off / CHUNK) as u32,
            ((off % CHUNK) / class_size(class)) as u16,
        );
        self.used.fetch_sub(class_size(class) as u64, Relaxed);
        let mut cl = self.classes[class].lock();
        let st = self.state(c);
        // SAFETY: the slot is this chunk's, no longer used by anyone (the caller's promise),
        // and at least two bytes long; the class's lock is held.
        unsafe { (slot.addr as *mut u16).write_unaligned(st.free) };
        st.free = i;
        st.live -= 1;
        let emptied = st.live == 0;
        if st.draining {
            // Off every list until it is empty; then it goes back.
            if emptied {
                st.draining = false;
                drop(cl);
                self.give_chunk(c, class);
            }
            return;
        }
        if st.listed == 0 {
            cl.with_room.push(c);
            self.state(c).listed = cl.with_room.len() as u32;
        } else if !emptied {
            // Allocate from the chunk freed into last: it is the one just touched.
            let at = st.listed as usize - 1;
            let last = cl.with_room.len() - 1;
            cl.with_room.swap(at, last);
            let moved = cl.with_room[at];
            self.state(moved).listed = at as u32 + 1;
            self.state(c).listed = last as u32 + 1;
        }
        if emptied {
            Self::unlist(&mut cl, self, c);
            drop(cl);
            self.give_chunk(c, class);
        }
    }
}

/// What the caller keeps beside a value, opaque to the map (the store: its codec and the
/// value's length before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) tag: u8,
    pub(crate) len: u32,
}

/// A value as the map keeps it: bytes, or one word held in the entry itself (a same-filled
/// page costs no slot).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body<'a> {
    Bytes(&'a [u8]),
    Word(u64),
}

/// `Entry::class` of a word held in the entry.
const WORD: u8 = u8::MAX;

/// One key's value: 16 bytes.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The slot's address, or the word.
    at: u64,
    /// Bytes used in the slot.
    used: u16,
    class: u8,
    tag: u8,
    len: u32,
}

impl Entry {
    fn slot(&self) -> Option<Slot> {
        (self.class != WORD).then_some(Slot {
            addr: self.at as usize,
            class: self.class,
        })
    }

    fn meta(&self) -> Meta {
        Meta {
            tag: self.tag,
            len: self.len,
        }
    }
}

/// Values longer than [`MAX`] are kept as they are, beside the entries.
type Big = (Meta, Box<[u8]>);

#[derive(Debug, Default)]
struct Shard {
    entries: FxHashMap<u64, Entry>,
    big: FxHashMap<u64, Big>,
}

const SHARDS: usize = 64;

/// A sharded map from keys to values kept in slots.
#[derive(Debug)]
pub(crate) struct SlotMap {
    shards: Box<[Mutex<Shard>]>,
    slab: Slab,
    /// Bytes of slots in use, and of values kept as they are.
    used: AtomicU64,
    objects: AtomicU64,
    /// Inserts so far: every [`COMPACT_EVERY`]th looks at the holes.
    inserts: AtomicU64,
    /// Set while a compaction runs: one at a time.
    compacting: std::sync::atomic::AtomicBool,
    /// Bytes of chunks drained by compactions, and values moved.
    compacted: AtomicU64,
    moved: AtomicU64,
}

impl Default for SlotMap {
    fn default() -> SlotMap {
        SlotMap {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            slab: Slab::default(),
            used: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            compacting: std::sync::atomic::AtomicBool::new(false),
            compacted: AtomicU64::new(0),
            moved: AtomicU64::new(0),
        }
    }
}

/// The value a removed entry or big value held, its slot still allocated.
enum Removed {
    Entry(Entry),
    Big(Big),
}

impl SlotMap {
    fn shard(&self, key: u64) -> &Mutex<Shard> {
        // Fibonacci hashing spreads sequential page numbers over all shards.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// Keeps `body` under `key`; the meta of the value it replaced, if any.
    pub(crate) fn insert(&self, key: u64, meta: Meta, body: Body<'_>) -> Option<Meta> {
        let mut big = None;
        let entry = match body {
            Body::Word(w) => Some(Entry {
                at: w,
                used: 0,
                class: WORD,
                tag: meta.tag,
                len: meta.len,
            }),
            Body::Bytes(b) if b.len() <= MAX => {
                let slot = self.slab.store(b);
                self.used.fetch_add(slot.size() as u64, Relaxed);
                Some(Entry {
                    at: slot.addr as u64,
                    used: b.len() as u16,
                    class: slot.class,
                    tag: meta.tag,
                    len: meta.len,
                })
            }
            Body::Bytes(b) => {
                self.used.fetch_add(b.len() as u64, Relaxed);
                big = Some((meta, Box::from(b)));
                None
            }
        };
        self.objects.fetch_add(1, Relaxed);
        let old = {
            let mut shard = self.shard(key).lock();
            let (old_entry, old_big) = match (entry, big) {
                (Some(e), _) => (shard.entries.insert(key, e), shard.big.remove(&key)),
                (None, Some(b)) => (shard.entries.remove(&key), shard.big.insert(key, b)),
                (None, None) => unreachable!("a value is an entry or big"),
            };
            old_entry.map(Removed::Entry).or(old_big.map(Removed::Big))
        };
        let old = old.map(|old| self.release(old));
        if self.inserts.fetch_add(1, Relaxed) % COMPACT_EVERY == COMPACT_EVERY - 1 {
            let holes = self.slab.holes();
            if holes > COMPACT_MIN_HOLES.max(self.slab.used.load(Relaxed) / 32) {
                self.compact();
            }
        }
        old
    }

    /// Moves values out of each class's sparsest chunks into the holes of its others, and
    /// gives the emptied chunks back; how many chunks were drained (0 if another thread is
    /// compacting). Readers wait only for the shard being walked.
    pub(crate) fn compact(&self) -> usize {
        if self.compacting.swap(true, Acquire) {
            return 0;
        }
        let mut drained = FxHashSet::default();
        let taken: usize = (0..CLASSES)
            .map(|class| self.slab.drain_sparsest(class, &mut drained))
            .sum();
        if taken > 0 {
            let mut moved = 0;
            for shard in self.shards.iter() {
                let mut shard = shard.lock();
                for e in shard.entries.values_mut() {
                    let Some(slot) = e.slot() else { continue };
                    if !drained.contains(&self.slab.chunk_of(slot)) {
                        continue;
                    }
                    // SAFETY: the entry names the slot and the shard's lock is held: nobody
                    // frees it while it is copied.
                    let new = self
                        .slab
                        .store(unsafe { self.slab.bytes(slot, e.used as usize) });
                    debug_assert_eq!(new.class, slot.class);
                    e.at = new.addr as u64;
                    // SAFETY: the entry names the new slot now, under the shard's lock: any
                    // read of the old one held that lock and is over, and none can start.
                    unsafe { self.slab.free(slot) };
                    moved += 1;
                }
            }
            self.compacted.fetch_add((taken * CHUNK) as u64, Relaxed);
            self.moved.fetch_add(moved, Relaxed);
        }
        self.compacting.store(false, Release);
        taken
    }

    /// Bytes of chunks drained by compactions, and values they moved.
    pub(crate) fn compactions(&self) -> (u64, u64) {
        (self.compacted.load(Relaxed), self.moved.load(Relaxed))
    }

    /// Calls `f` with the meta and body of `key`'s value, if there is one.
    pub(crate) fn get<R>(&self, key: u64, f: impl FnOnce(Meta, Body<'_>) -> R) -> Option<R> {
        let shard = self.shard(key).lock();
        if let Some(e) = shard.entries.get(&key) {
            return Some(match e.slot() {
                // SAFETY: the entry names the slot, and the shard's lock, held until `f`
                // returns, keeps anyone from removing the entry and freeing the slot.
                Some(slot) => f(
                    e.meta(),
                    Body::Bytes(unsafe { self.slab.bytes(slot, e.used as usize) }),
                ),
                None => f(e.meta(), Body::Word(e.at)),
            });
        }
        shard
            .big
            .get(&key)
            .map(|(meta, b)| f(*meta, Body::Bytes(b)))
    }

    /// Removes `key`'s value, calling `f` with it first, if there is one.
    pub(crate) fn remove<R>(&self, key: u64, f: impl FnOnce(Meta, Body<'_>) -> R) -> Option<R> {
        let removed = {
            let mut shard = self.shard(key).lock();
            match shard.entries.remove(&key) {
                Some(e) => Removed::Entry(e),
                None => Removed::Big(shard.big.remove(&key)?),
            }
        };
        let r = match &removed {
            Removed::Entry(e) => match e.slot() {
                // SAFETY: the entry left the map, so nobody else can reach the slot, which is
                // freed only below.
                Some(slot) => f(
                    e.meta(),
                    Body::Bytes(unsafe { self.slab.bytes(slot, e.used as usize) }),
                ),
                None => f(e.meta(), Body::Word(e.at)),
            },
            Removed::Big((meta, b)) => f(*meta, Body::Bytes(b)),
        };
        self.release(removed);
        Some(r)
    }

    /// Frees what a value that left the map held; its meta.
    fn release(&self, old: Removed) -> Meta {
        self.objects.fetch_sub(1, Relaxed);
        match old {
            Removed::Entry(e) => {
                if let Some(slot) = e.slot() {
                    self.used.fetch_sub(slot.size() as u64, Relaxed);
                    // SAFETY: the entry named the slot and has left the map under its shard's
                    // lock: any read of it held that lock and is over, and none can start.
                    unsafe { self.slab.free(slot) };
                }
                e.meta()
            }
            Removed::Big((meta, b)) => {
                self.used.fetch_sub(b.len() as u64, Relaxed);
                meta
            }
        }
    }

    /// Values kept.
    pub(crate) fn objects(&self) -> u64 {
        self.objects.load(Relaxed)
    }

    /// Bytes of slots in use and of big values.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Every byte the map holds: its chunks (used or not), big values, and the tables.
    pub(crate) fn held_bytes(&self) -> u64 {
        let tables: usize = self
            .shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.entries.capacity() * (std::mem::size_of::<(u64, Entry)>() + 1)
                    + s.big.capacity() * (std::mem::size_of::<(u64, Big)>() + 1)
                    + s.big.values().map(|(_, b)| b.len()).sum::<usize>()
            })
            .sum();
        self.slab.held.load(Relaxed) + tables as u64
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.get() {
            // SAFETY: the mappings made in `mem`, with these lengths; the slab, and every slot
            // in it, is going away.
            unsafe {
                tidepool_sys::syscall!(libc::SYS_munmap, mem.base, RESERVE);
                tidepool_sys::syscall!(
                    libc::SYS_munmap,
                    mem.states as usize,
                    MAX_CHUNKS * std::mem::size_of::<ChunkState>(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
