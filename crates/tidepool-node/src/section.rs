//! Memory sections and their allocator threads (Sharry's offloaded, multi-section allocator).
//!
//! Each section is a slice of the arena whose allocation metadata is touched by exactly one
//! thread: its allocator. Connection threads talk to it through a lock-free bounded channel
//! (crossbeam's array flavour). Because a wake-up of another thread costs tens of microseconds
//! on small VMs, connections never ask for one block at a time: they ask for a magazine of
//! blocks of one class and keep it, and they hand freed slots back in batches, piggy-backed on
//! their next refill where possible.

use crate::slots::{Placement, SlotTable};
use crate::spans::{class_sizes, Block, SpanAllocator, MIN_CLASS};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Work for a section's allocator thread.
#[derive(Debug)]
pub enum SectionRequest {
    /// Reserve up to `count` blocks of `class`; answer with their slots (empty when full).
    Refill {
        class: u16,
        count: u32,
        frees: Vec<u32>,
        reply: Sender<Vec<u32>>,
    },
    /// Reserve one block of `size` bytes on the large path.
    Large {
        size: u64,
        frees: Vec<u32>,
        reply: Sender<Vec<u32>>,
    },
    /// These retired or unreserved slots, and their blocks, are free again.
    Free {
        slots: Vec<u32>,
    },
    Shutdown,
}

/// What connection threads see of a section.
#[derive(Debug)]
pub struct Section {
    pub id: u16,
    /// Where the section starts in the arena.
    pub base: u64,
    pub len: u64,
    pub slots: SlotTable,
    pub requests: Sender<SectionRequest>,
    /// Published by the allocator thread after each batch of work.
    pub used_bytes: AtomicU64,
    pub free_page_bytes: AtomicU64,
    /// Bytes sitting in connections' magazines.
    pub reserved_bytes: AtomicU64,
    /// Requests the allocator thread has served (refills, large allocations, free batches):
    /// against the puts, this shows how well magazines amortise the hand-offs.
    pub served: AtomicU64,
}

impl Section {
    pub fn new(id: u16, base: u64, len: u64) -> (Arc<Section>, Receiver<SectionRequest>) {
        let (tx, rx) = crossbeam_channel::bounded(1024);
        let section = Arc::new(Section {
            id,
            base,
            len,
            slots: SlotTable::new((len / MIN_CLASS as u64) as usize),
            requests: tx,
            used_bytes: AtomicU64::new(0),
            free_page_bytes: AtomicU64::new(len),
            reserved_bytes: AtomicU64::new(0),
            served: AtomicU64::new(0),
        });
        (section, rx)
    }

    /// Spawns the allocator thread that owns this section's metadata.
    pub fn spawn_allocator(
        self: &Arc<Self>,
        rx: Receiver<SectionRequest>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let section = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("tp-alloc-{}", self.id))
            .spawn(move || Allocator::new(&section).run(rx))
    }
}

/// State private to one allocator thread.
struct Allocator<'a> {
    section: &'a Section,
    spans: SpanAllocator,
    free_slots: Vec<u32>,
    next_slot: u32,
}

impl<'a> Allocator<'a> {
    fn new(section: &'a Section) -> Self {
        Allocator {
            section,
            spans: SpanAllocator::new(section.len),
            free_slots: vec![],
            next_slot: 0,
        }
    }

    fn run(mut self, rx: Receiver<SectionRequest>) {
        while let Ok(first) = rx.recv() {
            // Drain whatever else is queued before publishing counters once.
            let mut next = Some(first);
            while let Some(req) = next {
                if matches!(req, SectionRequest::Shutdown) {
                    return;
                }
                self.serve(req);
                next = rx.try_recv().ok();
            }
            let s = self.section;
            s.used_bytes
                .store(self.spans.used_bytes(), Ordering::Relaxed);
            s.free_page_bytes
                .store(self.spans.free_page_bytes(), Ordering::Relaxed);
        }
    }

    fn serve(&mut self, req: SectionRequest) {
        self.section.served.fetch_add(1, Ordering::Relaxed);
        match req {
            SectionRequest::Refill {
                class,
                count,
                frees,
                reply,
            } => {
                self.free(&frees);
                let size = class_sizes()[class as usize] as usize;
                let got: Vec<u32> = (0..count).map_while(|_| self.reserve(size)).collect();
                self.section
                    .reserved_bytes
                    .fetch_add(got.len() as u64 * size as u64, Ordering::Relaxed);
                self.answer(reply, got, size as u64);
            }
            SectionRequest::Large { size, frees, reply } => {
                self.free(&frees);
                let got: Vec<u32> = self.reserve(size as usize).into_iter().collect();
                self.answer(reply, got, 0);
            }
            SectionRequest::Free { slots } => self.free(&slots),
            SectionRequest::Shutdown => {}
        }
    }

    /// Sends reserved slots to the connection that asked; if it has gone meanwhile, takes them
    /// back so nothing leaks.
    fn answer(&mut self, reply: Sender<Vec<u32>>, got: Vec<u32>, magazine_block: u64) {
        if let Err(unsent) = reply.send(got) {
            let slots = unsent.into_inner();
            for &slot in &slots {
                if let Some(meta) = self.section.slots.get(slot) {
                    meta.unreserve();
                }
            }
            self.section
                .reserved_bytes
                .fetch_sub(slots.len() as u64 * magazine_block, Ordering::Relaxed);
            self.free(&slots);
        }
    }

    fn reserve(&mut self, size: usize) -> Option<u32> {
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None if (self.next_slot as usize) < self.section.slots.max_slots() => {
                self.next_slot += 1;
                self.next_slot - 1
            }
            None => return None,
        };
        let Some(block) = self.spans.alloc(size) else {
            self.free_slots.push(slot);
            return None;
        };
        self.section.slots.get_or_create(slot).reserve(Placement {
            offset: block.offset,
            cap: block.cap,
            span: block.span,
        });
        Some(slot)
    }

    fn free(&mut self, slots: &[u32]) {
        for &slot in slots {
            let Some(meta) = self.section.slots.get(slot) else {
                debug_assert!(false, "freed slot {slot} was never created");
                continue;
            };
            let p = meta.placement();
            self.spans.free(Block {
                offset: p.offset,
                cap: p.cap,
                span: p.span,
            });
            self.free_slots.push(slot);
        }
    }
}
