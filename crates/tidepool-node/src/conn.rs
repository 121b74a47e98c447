//! One client connection's protocol state: authentication, magazines of reserved blocks,
//! pending frees, and the ops themselves. The I/O around it is in `io.rs`.

use crate::counters::{Failure, WorkerMetrics};
use crate::section::SectionRequest;
use crate::shared::Shared;
use crate::slots::{ReadGuard, Refusal, SlotMeta};
use crate::spans::{class_of, class_sizes, footprint};
use crate::tenants::{Owned, Session, Tenant};
use bytes::BytesMut;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tidepool_proto::{
    decode_request, ErrorCode, FrameWriter, Handle, HelloInfo, Op, Request, Response, RESPONSE_BIT,
};

mod batch;
mod offload;

/// Hand freed slots back once this many are pending for one section.
const FREE_BATCH: usize = 64;
/// A refill brings at most this many blocks, and about this many bytes...
const MAGAZINE_MAX: u32 = 64;
const MAGAZINE_BYTES: u64 = 256 << 10;
/// ...and a connection holds at most this many bytes in all its magazines together, so a node
/// with many connections and many sizes in use does not strand its capacity in magazines.
const MAGAZINES_TOTAL: u64 = 1 << 20;

/// Objects at least this large are sent from the arena by a vectored write, not copied into the
/// send buffer first.
const ZERO_COPY_MIN: usize = 1024;

/// Object bytes to be spliced into the send buffer at `at`, still in the arena under a read
/// guard. The I/O worker sends them with one writev and then drops the guards.
#[derive(Debug)]
pub(crate) struct Splice<'a> {
    pub at: usize,
    pub guard: ReadGuard<'a>,
    pub base: u64,
}

struct Auth {
    tenant: Arc<Tenant>,
    session: Arc<Session>,
    client_session: u64,
    /// Whether the client gave store settings at hello (see [`Tenant::join_store`]).
    in_store: bool,
}

/// Why a hello was refused.
enum Refused {
    Code(ErrorCode),
    /// The tenant's store settings differ (the message names both).
    Store(String),
}

pub(crate) struct Conn<'a> {
    pub sh: &'a Shared,
    /// The counters of the I/O worker serving this connection.
    metrics: &'a WorkerMetrics,
    auth: Option<Auth>,
    /// Per size class: reserved (section, slot) pairs ready for puts.
    magazines: Vec<Vec<(u16, u32)>>,
    /// Per size class: how many blocks the next refill asks for (slow start: doubles per
    /// refill, so a class used once reserves little).
    refill_count: Vec<u32>,
    /// Bytes in all magazines.
    magazine_bytes: u64,
    /// Per section: retired slots not yet handed back.
    pending_free: Vec<Vec<u32>>,
    /// Objects put since the last hand-over to the session's list.
    new_owned: Vec<Owned>,
    reply_tx: Sender<Vec<u32>>,
    reply_rx: Receiver<Vec<u32>>,
    /// Where this connection starts looking for a section with room.
    rotor: usize,
    /// Gets answered from the arena, waiting for the next send.
    splices: Vec<Splice<'a>>,
    /// Object bytes in `splices`.
    splice_bytes: usize,
}

/// What one [`Conn::on_bytes`] did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Served {
    /// Frames answered (a malformed one included).
    pub frames: u64,
    /// It stopped with complete frames left in the buffer: the answers reached the limit.
    pub at_limit: bool,
    /// A malformed frame was answered; the connection must close once the answer is out.
    pub malformed: bool,
}

fn refusal(r: Refusal) -> ErrorCode {
    match r {
        Refusal::Invalid => ErrorCode::InvalidHandle,
        Refusal::Stale => ErrorCode::StaleHandle,
    }
}

/// Whether a request takes exclusive access to objects (then the splices this connection
/// holds read guards for are copied out first).
fn takes_exclusive(op: Op) -> bool {
    matches!(
        op,
        Op::Write
            | Op::Free
            | Op::Take
            | Op::WriteMany
            | Op::FreeMany
            | Op::TakeMany
            | Op::EvictFetch
    )
}

impl<'a> Conn<'a> {
    pub fn new(sh: &'a Shared, id: u64, metrics: &'a WorkerMetrics) -> Conn<'a> {
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        Conn {
            sh,
            metrics,
            auth: None,
            magazines: vec![vec![]; class_sizes().len()],
            refill_count: vec![2; class_sizes().len()],
            magazine_bytes: 0,
            pending_free: vec![vec![]; sh.sections.len()],
            new_owned: vec![],
            reply_tx,
            reply_rx,
            rotor: id as usize,
            splices: vec![],
            splice_bytes: 0,
        }
    }

    /// Bytes of answers still to be spliced in from the arena.
    pub fn spliced_bytes(&self) -> usize {
        self.splice_bytes
    }

    /// Whether answers wait in the arena (see [`Conn::take_splices`]).
    pub fn has_splices(&self) -> bool {
        !self.splices.is_empty()
    }

    /// Hands the pending splices to the sender, who releases their guards once their bytes
    /// are sent or copied.
    pub fn take_splices(&mut self) -> Vec<Splice<'a>> {
        self.splice_bytes = 0;
        std::mem::take(&mut self.splices)
    }

    /// Gives back the vector [`Conn::take_splices`] handed out once its guards are released,
    /// so the next answer reuses its room instead of allocating.
    pub fn return_splices(&mut self, mut spent: Vec<Splice<'a>>) {
        spent.clear();
        if self.splices.is_empty() {
            self.splices = spent;
        }
    }

    /// Serves the complete frames in `rbuf`, appending the answers to `wbuf`, until
    /// `wbuf.len()` plus the object bytes still to be spliced in reach `limit` (checked before
    /// each frame: one answer can take them past it). On a malformed frame it appends an
    /// error answer naming the problem and says so: the caller sends what is in `wbuf` and
    /// closes this connection (and only this one).
    pub fn on_bytes(&mut self, rbuf: &mut BytesMut, wbuf: &mut BytesMut, limit: usize) -> Served {
        let mut served = Served::default();
        loop {
            if wbuf.len() + self.splice_bytes >= limit {
                served.at_limit = !rbuf.is_empty();
                break;
            }
            match decode_request(rbuf, self.sh.max_body) {
                Ok(Some((id, req))) => {
                    served.frames += 1;
                    self.metrics.request(req.op());
                    self.serve(id, req, wbuf);
                }
                Ok(None) => break,
                Err(e) => {
                    // Answer with the reason, using the frame's own op and id when the header
                    // was readable, so the client can report it.
                    let (op, id) = match tidepool_proto::peek_header(rbuf, u32::MAX) {
                        Ok(Some(h)) if Op::try_from(h.op).is_ok() => (h.op, h.id),
                        _ => (Op::Hello as u8, 0),
                    };
                    // A TLS ClientHello at a node without TLS: say so in the answer (the
                    // client sees it as plain text where a handshake should be).
                    let tls_hello = rbuf.first() == Some(&0x16) && rbuf.get(1) == Some(&0x03);
                    let mut w = FrameWriter::begin(wbuf, op | RESPONSE_BIT, id);
                    w.put_u8(ErrorCode::Malformed as u8);
                    if tls_hello {
                        w.put_str16(
                            "this memory node does not use TLS (it was started without \
                             --tls-cert); connect without tls=1",
                        );
                    } else {
                        w.put_str16(&format!("{e}; closing this connection"));
                    }
                    w.finish();
                    tracing::debug!("malformed frame: {e}");
                    self.metrics.failure(Failure::Code(ErrorCode::Malformed));
                    served.frames += 1;
                    served.malformed = true;
                    break;
                }
            }
        }
        self.hand_over_owned();
        served
    }

    /// Copies every pending splice into `out` and drops its read guard. Needed before this
    /// connection takes exclusive access to any object: it may be one whose guard it holds
    /// itself, and would then wait for its own reader forever.
    fn materialize_splices(&mut self, out: &mut BytesMut) {
        if self.splices.is_empty() {
            return;
        }
        let mut whole = BytesMut::with_capacity(out.len() + self.splice_bytes);
        let mut at = 0;
        self.splice_bytes = 0;
        for s in self.splices.drain(..) {
            whole.extend_from_slice(&out[at..s.at]);
            self.sh.arena.read(&s.guard, s.base, &mut whole);
            at = s.at;
        }
        whole.extend_from_slice(&out[at..]);
        *out = whole;
    }

    /// Answers one request, appending its answer frame to `out`.
    fn serve(&mut self, id: u64, req: Request, out: &mut BytesMut) {
        let op = req.op();
        if takes_exclusive(op) {
            self.materialize_splices(out);
        }
        let splices_before = (self.splices.len(), self.splice_bytes);
        let mut w = FrameWriter::begin(out, op as u8 | RESPONSE_BIT, id);
        let result = match req {
            Request::Hello {
                tenant,
                token,
                session,
                store,
            } => match self.hello(&tenant, &token, session, &store, &mut w) {
                Err(Refused::Code(code)) => Err(code),
                Err(Refused::Store(message)) => {
                    let code = ErrorCode::StoreMismatch;
                    self.metrics.failure(Failure::Code(code));
                    w.abandon();
                    Response::Error { code, message }.encode(op, id, out);
                    return;
                }
                Ok(()) => Ok(()),
            },
            _ if self.auth.is_none() => Err(ErrorCode::NotAuthenticated),
            Request::Put { data } => self.put(&data).map(|h| {
                w.put_u8(0);
                w.put_handle(h);
            }),
            Request::Get { handle } => self.fetch(handle, false, &mut w),
            Request::Take { handle } => self.fetch(handle, true, &mut w),
            Request::Write { handle, data } => self.write(handle, &data).map(|()| w.put_u8(0)),
            Request::Free { handle } => self.free(handle).map(|()| w.put_u8(0)),
            Request::PutMany { items } => self.put_many(items, &mut w),
            Request::GetMany { handles } | Request::TakeMany { handles } => {
                self.fetch_many(handles, op == Op::TakeMany, &mut w)
            }
            Request::WriteMany { items } => self.write_many(items, &mut w),
            Request::FreeMany { handles } => self.free_many(handles, &mut w),
            Request::EvictFetch { evict, fetch, take } => {
                self.evict_fetch(evict, fetch, take, &mut w)
            }
            Request::Stats => {
                w.abandon();
                self.stats(op, id, out);
                return;
            }
            Request::Scan(_) | Request::Gather { .. } => {
                w.abandon();
                self.answer_offload(&req, op, id, out);
                return;
            }
        };
        match result {
            Err(code) => {
                w.abandon();
                self.refuse(code, splices_before, op, id, out);
            }
            Ok(()) => w.finish(),
        }
    }

    /// The tenant's counters and the node's, as a stats answer.
    fn stats(&self, op: Op, id: u64, out: &mut BytesMut) {
        let Some(auth) = &self.auth else {
            unreachable!("checked above")
        };
        let mut stats: Vec<(String, u64)> = auth
            .tenant
            .counters()
            .into_iter()
            .map(|(k, v)| (format!("tenant.{k}"), v))
            .collect();
        stats.extend(self.sh.node_counters());
        Response::Stats(stats).encode(op, id, out);
    }

    /// Answers a refused request with its error code, counting it, after dropping the splices
    /// its half-written answer had taken.
    fn refuse(
        &mut self,
        code: ErrorCode,
        splices_before: (usize, usize),
        op: Op,
        id: u64,
        out: &mut BytesMut,
    ) {
        if let Some(a) = &self.auth {
            a.tenant.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.failure(Failure::Code(code));
        if code == ErrorCode::AuthFailed {
            self.metrics.auth_failure();
        }
        self.splices.truncate(splices_before.0);
        self.splice_bytes = splices_before.1;
        let mut w = FrameWriter::begin(out, op as u8 | RESPONSE_BIT, id);
        w.put_u8(code as u8);
        w.put_str16(code.describe());
        w.finish();
    }

    fn hello(
        &mut self,
        tenant: &str,
        token: &str,
        client_session: u64,
        store: &str,
        w: &mut FrameWriter<'_>,
    ) -> Result<(), Refused> {
        if self.auth.is_some() {
            return Err(Refused::Code(ErrorCode::AlreadyAuthenticated));
        }
        let t = self
            .sh
            .tenants
            .authenticate(tenant, token)
            .map_err(Refused::Code)?;
        let in_store = !store.is_empty();
        if in_store {
            t.join_store(store).map_err(|in_use| {
                Refused::Store(format!(
                    "tenant '{tenant}' on this node is in use by a store kept as {in_use}, and \
                     this client's is {store}; clients sharing a tenant must list the same memory \
                     nodes with the same replicas= or ec=, or use a tenant of their own"
                ))
            })?;
        }
        t.stats.connections.fetch_add(1, Ordering::Relaxed);
        let session = self.sh.sessions.join(Arc::clone(&t), client_session);
        let info = HelloInfo {
            tenant_id: t.id,
            quota: t.quota,
            capacity: self.sh.capacity,
            max_body: self.sh.max_body,
        };
        self.auth = Some(Auth {
            tenant: t,
            session,
            client_session,
            in_store,
        });
        w.put_u8(0);
        w.put_u32(info.tenant_id);
        w.put_u64(info.quota);
        w.put_u64(info.capacity);
        w.put_u32(info.max_body);
        Ok(())
    }

    fn tenant(&self) -> &Arc<Tenant> {
        &self.auth.as_ref().expect("authenticated").tenant
    }

    /// Finds the slot a handle names, checking what can be checked without touching it.
    fn resolve(&self, h: Handle) -> Result<(u16, &'a SlotMeta), ErrorCode> {
        let sh: &'a Shared = self.sh;
        if h.tenant != self.tenant().id || h.epoch != sh.epoch {
            return Err(ErrorCode::InvalidHandle);
        }
        let section = sh
            .sections
            .get(h.section as usize)
            .ok_or(ErrorCode::InvalidHandle)?;
        let meta = section.slots.get(h.slot).ok_or(ErrorCode::InvalidHandle)?;
        Ok((h.section, meta))
    }

    fn put(&mut self, data: &[u8]) -> Result<Handle, ErrorCode> {
        let tenant = Arc::clone(self.tenant());
        let cap = footprint(data.len());
        tenant.charge(cap)?;
        let got = match class_of(data.len()) {
            Some(class) => self.take_reserved(class),
            None => self.reserve_large(data.len()),
        };
        let (section, slot) = match got {
            Ok(x) => x,
            Err(e) => {
                tenant.uncharge(cap);
                return Err(e);
            }
        };
        let sec = &self.sh.sections[section as usize];
        let meta = sec.slots.get(slot).expect("reserved slots exist");
        debug_assert_eq!(meta.placement().cap as u64, cap);
        // The slot came out of our own magazine (or a reply addressed to us): nobody else
        // holds it.
        let reserved = meta.claim_reserved();
        self.sh.arena.write(&reserved, sec.base, data);
        let session = self.auth.as_ref().expect("authenticated").session.id;
        let generation = reserved.publish(tenant.id, data.len() as u32, session);
        self.new_owned.push((section, slot, generation));
        let s = &tenant.stats;
        s.objects.fetch_add(1, Ordering::Relaxed);
        s.bytes_live.fetch_add(data.len() as u64, Ordering::Relaxed);
        s.puts.fetch_add(1, Ordering::Relaxed);
        Ok(Handle {
            tenant: tenant.id,
            section,
            epoch: self.sh.epoch,
            slot,
            generation,
        })
    }

    /// Appends a status byte and the object's bytes; with `take`, frees it afterwards.
    fn fetch(&mut self, h: Handle, take: bool, w: &mut FrameWriter<'_>) -> Result<(), ErrorCode> {
        let (section, meta) = self.resolve(h)?;
        let tenant_id = h.tenant;
        let base = self.sh.sections[section as usize].base;
        if take {
            let guard = meta.exclusive(h.generation, tenant_id).map_err(refusal)?;
            let (len, p) = (meta.len(), meta.placement());
            w.put_u8(0);
            w.begin_blob(len);
            self.sh.arena.read(&guard, base, w.buf());
            guard.retire();
            self.tenant().stats.takes.fetch_add(1, Ordering::Relaxed);
            self.after_free(section, h.slot, p.cap, len);
        } else {
            let guard = meta.read(h.generation, tenant_id).map_err(refusal)?;
            let len = meta.len();
            w.put_u8(0);
            w.begin_blob(len);
            if len >= ZERO_COPY_MIN {
                let at = w.buf().len();
                w.add_external(len);
                self.splices.push(Splice { at, guard, base });
                self.splice_bytes += len;
            } else {
                self.sh.arena.read(&guard, base, w.buf());
                drop(guard);
            }
            self.tenant().stats.gets.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn write(&mut self, h: Handle, data: &[u8]) -> Result<(), ErrorCode> {
        let (section, meta) = self.resolve(h)?;
        let guard = meta.exclusive(h.generation, h.tenant).map_err(refusal)?;
        let p = meta.placement();
        if data.len() > p.cap as usize {
            return Err(ErrorCode::TooLarge);
        }
        let old = meta.len() as u64;
        self.sh
            .arena
            .write(&guard, self.sh.sections[section as usize].base, data);
        guard.set_len(data.len() as u32);
        drop(guard);
        let s = &self.tenant().stats;
        s.bytes_live.fetch_add(data.len() as u64, Ordering::Relaxed);
        s.bytes_live.fetch_sub(old, Ordering::Relaxed);
        s.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn free(&mut self, h: Handle) -> Result<(), ErrorCode> {
        let (section, meta) = self.resolve(h)?;
        let guard = meta.exclusive(h.generation, h.tenant).map_err(refusal)?;
        let (len, cap) = (meta.len(), meta.placement().cap);
        guard.retire();
        self.tenant().stats.frees.fetch_add(1, Ordering::Relaxed);
        self.after_free(section, h.slot, cap, len);
        Ok(())
    }

    /// Accounts for an object that died and queues its slot for its allocator.
    fn after_free(&mut self, section: u16, slot: u32, cap: u32, len: usize) {
        let tenant = self.tenant();
        tenant.uncharge(cap as u64);
        tenant.stats.objects.fetch_sub(1, Ordering::Relaxed);
        tenant
            .stats
            .bytes_live
            .fetch_sub(len as u64, Ordering::Relaxed);
        let pending = &mut self.pending_free[section as usize];
        pending.push(slot);
        if pending.len() >= FREE_BATCH {
            let slots = std::mem::take(pending);
            self.send(section, SectionRequest::Free { slots });
        }
    }

    fn send(&self, section: u16, req: SectionRequest) {
        // The allocator thread lives as long as the server; a send fails only during shutdown,
        // when nothing more will be allocated anyway.
        let _ = self.sh.sections[section as usize].requests.send(req);
    }

    fn take_reserved(&mut self, class: u16) -> Result<(u16, u32), ErrorCode> {
        let size = class_sizes()[class as usize] as u64;
        if self.magazines[class as usize].is_empty() {
            if let Err(e) = self.refill(class, size) {
                // Give back what this connection holds in reserve and try once more: a full
                // node should be full of objects, not of magazines.
                if e != ErrorCode::CapacityExhausted || self.magazine_bytes == 0 {
                    return Err(e);
                }
                self.return_magazines();
                self.flush_frees();
                self.refill(class, size)?;
            }
        }
        let got = self.magazines[class as usize]
            .pop()
            .expect("refill returned at least one slot");
        self.magazine_bytes -= size;
        self.sh.sections[got.0 as usize]
            .reserved_bytes
            .fetch_sub(size, Ordering::Relaxed);
        Ok(got)
    }

    fn refill(&mut self, class: u16, size: u64) -> Result<(), ErrorCode> {
        let room = MAGAZINES_TOTAL.saturating_sub(self.magazine_bytes) / size;
        let count = (self.refill_count[class as usize] as u64)
            .min(MAGAZINE_BYTES / size)
            .min(room)
            .max(1) as u32;
        self.refill_count[class as usize] = (count * 2).min(MAGAZINE_MAX);
        let (section, slots) = self.ask_sections(|frees, reply| SectionRequest::Refill {
            class,
            count,
            frees,
            reply,
        })?;
        self.magazine_bytes += slots.len() as u64 * size;
        self.magazines[class as usize].extend(slots.into_iter().map(|s| (section, s)));
        Ok(())
    }

    /// Hands every reserved block back (they go with the next free batch).
    fn return_magazines(&mut self) {
        for (class, mag) in self.magazines.iter_mut().enumerate() {
            let size = class_sizes()[class] as u64;
            for (section, slot) in mag.drain(..) {
                let sec = &self.sh.sections[section as usize];
                sec.reserved_bytes.fetch_sub(size, Ordering::Relaxed);
                if let Some(meta) = sec.slots.get(slot) {
                    meta.unreserve();
                }
                self.pending_free[section as usize].push(slot);
            }
        }
        self.magazine_bytes = 0;
    }

    /// Sends every pending free to its section now.
    fn flush_frees(&mut self) {
        for section in 0..self.pending_free.len() {
            let slots = std::mem::take(&mut self.pending_free[section]);
            if !slots.is_empty() {
                self.send(section as u16, SectionRequest::Free { slots });
            }
        }
    }

    fn reserve_large(&mut self, size: usize) -> Result<(u16, u32), ErrorCode> {
        let ask = |c: &mut Self| {
            c.ask_sections(|frees, reply| SectionRequest::Large {
                size: size as u64,
                frees,
                reply,
            })
        };
        let (section, mut slots) = match ask(self) {
            Err(ErrorCode::CapacityExhausted) if self.magazine_bytes > 0 => {
                self.return_magazines();
                self.flush_frees();
                ask(self)?
            }
            r => r?,
        };
        Ok((section, slots.pop().expect("at least one slot")))
    }

    /// Asks sections in the scheduler's order until one has room.
    fn ask_sections(
        &mut self,
        make: impl Fn(Vec<u32>, Sender<Vec<u32>>) -> SectionRequest,
    ) -> Result<(u16, Vec<u32>), ErrorCode> {
        self.rotor = self.rotor.wrapping_add(1);
        for section in self.sh.schedule(self.rotor) {
            let frees = std::mem::take(&mut self.pending_free[section as usize]);
            let req = make(frees, self.reply_tx.clone());
            if self.sh.sections[section as usize]
                .requests
                .send(req)
                .is_err()
            {
                return Err(ErrorCode::Internal);
            }
            let slots = self.reply_rx.recv().map_err(|_| ErrorCode::Internal)?;
            if !slots.is_empty() {
                return Ok((section, slots));
            }
        }
        Err(ErrorCode::CapacityExhausted)
    }

    /// Moves the objects put during the last batch to the session's list, compacting the list
    /// when it has grown well past what is still live.
    fn hand_over_owned(&mut self) {
        if self.new_owned.is_empty() {
            return;
        }
        let Some(auth) = &self.auth else { return };
        let mut owned = auth.session.owned.lock();
        owned.entries.append(&mut self.new_owned);
        if owned.entries.len() >= owned.compact_at {
            let sections = &self.sh.sections;
            owned.entries.retain(|&(sec, slot, gen)| {
                sections[sec as usize]
                    .slots
                    .get(slot)
                    .is_some_and(|m| m.looks_live(gen))
            });
            owned.compact_at = (owned.entries.len() * 2).max(4096);
        }
    }

    /// Releases everything this connection holds: unused magazine blocks, pending frees and,
    /// if it was the session's last connection, every object the session still owns.
    pub fn close(&mut self) {
        // Answers that will never be sent: their read guards must go before this connection
        // takes objects exclusively below.
        self.splices.clear();
        self.splice_bytes = 0;
        self.hand_over_owned();
        self.return_magazines();
        if let Some(auth) = self.auth.take() {
            auth.tenant
                .stats
                .connections
                .fetch_sub(1, Ordering::Relaxed);
            if auth.in_store {
                auth.tenant.leave_store();
            }
            if self.sh.sessions.leave(&auth.session, auth.client_session) {
                let entries = std::mem::take(&mut auth.session.owned.lock().entries);
                let mut released = 0u64;
                for (section, slot, generation) in entries {
                    let Some(meta) = self.sh.sections[section as usize].slots.get(slot) else {
                        continue;
                    };
                    let Ok(guard) = meta.exclusive(generation, auth.tenant.id) else {
                        continue; // already freed or taken
                    };
                    if meta.owner() != auth.session.id {
                        continue;
                    }
                    let (len, cap) = (meta.len(), meta.placement().cap);
                    guard.retire();
                    released += 1;
                    let t = &auth.tenant;
                    t.uncharge(cap as u64);
                    t.stats.objects.fetch_sub(1, Ordering::Relaxed);
                    t.stats.bytes_live.fetch_sub(len as u64, Ordering::Relaxed);
                    self.pending_free[section as usize].push(slot);
                }
                auth.tenant
                    .stats
                    .released_on_disconnect
                    .fetch_add(released, Ordering::Relaxed);
            }
        }
        self.flush_frees();
    }
}
