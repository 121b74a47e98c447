//! Frame encoding and decoding.
//!
//! The decoder never trusts a length or count: every count is checked against the bytes that
//! remain before anything is allocated for it, so a forged header cannot make the receiver
//! reserve memory it was never sent.

use crate::scan::{Agg, AggKind, Cmp, Column, ElemType, Filter, Group, Scan, MAX_RESULTS};
use crate::types::{ErrorCode, EvictItem, Handle, HelloInfo, ItemResult, Op, Request, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const MAGIC: [u8; 2] = *b"TP";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 16;
/// The largest body any peer accepts (64 MiB). A server may announce a smaller one in hello.
pub const MAX_BODY: u32 = 64 << 20;
/// The most items one batched frame may carry.
pub const MAX_ITEMS: u32 = 1 << 16;
pub const RESPONSE_BIT: u8 = 0x80;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: u8,
    pub body_len: u32,
    pub id: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("bad magic {0:02x?}: the peer does not speak the tidepool protocol")]
    BadMagic([u8; 2]),
    #[error("protocol version {0} is not supported (this build speaks version {VERSION})")]
    UnsupportedVersion(u8),
    #[error("frame body of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    #[error("unknown op 0x{0:02x}")]
    UnknownOp(u8),
    #[error("expected a {expected}, got op 0x{got:02x}")]
    WrongDirection { expected: &'static str, got: u8 },
    #[error("frame body ends early while reading {0}")]
    Truncated(&'static str),
    #[error("{0} bytes left over after the frame body")]
    Trailing(usize),
    #[error("batch of {0} items exceeds the limit of {MAX_ITEMS}")]
    TooManyItems(u32),
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    #[error("unknown status code {0}")]
    UnknownStatus(u8),
    #[error("invalid flag byte {0} in {1}")]
    BadFlag(u8, &'static str),
}

/// Reads the header at the start of `buf`, if all 16 bytes are there, and validates it against
/// `max_body`.
pub fn peek_header(buf: &[u8], max_body: u32) -> Result<Option<Header>, DecodeError> {
    if buf.len() < HEADER_LEN {
        // Reject garbage as early as its first bytes allow.
        if !buf.is_empty() && buf[0] != MAGIC[0] {
            return Err(DecodeError::BadMagic([
                buf[0],
                buf.get(1).copied().unwrap_or(0),
            ]));
        }
        return Ok(None);
    }
    if buf[0..2] != MAGIC {
        return Err(DecodeError::BadMagic([buf[0], buf[1]]));
    }
    if buf[2] != VERSION {
        return Err(DecodeError::UnsupportedVersion(buf[2]));
    }
    let body_len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if body_len > max_body {
        return Err(DecodeError::TooLarge {
            len: body_len,
            max: max_body,
        });
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[8..16]);
    Ok(Some(Header {
        op: buf[3],
        body_len,
        id: u64::from_le_bytes(id),
    }))
}

/// Splits one whole frame off the front of `buf`, or returns `None` if more bytes are needed.
fn split_frame(buf: &mut BytesMut, max_body: u32) -> Result<Option<(Header, Bytes)>, DecodeError> {
    let Some(h) = peek_header(buf, max_body)? else {
        return Ok(None);
    };
    let total = HEADER_LEN + h.body_len as usize;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(total).freeze();
    frame.advance(HEADER_LEN);
    Ok(Some((h, frame)))
}

/// Decodes one request from the front of `buf`. `Ok(None)`: not all of it has arrived yet.
/// An error means the stream cannot be trusted any more and the connection should be closed.
pub fn decode_request(
    buf: &mut BytesMut,
    max_body: u32,
) -> Result<Option<(u64, Request)>, DecodeError> {
    let Some((h, body)) = split_frame(buf, max_body)? else {
        return Ok(None);
    };
    if h.op & RESPONSE_BIT != 0 {
        return Err(DecodeError::WrongDirection {
            expected: "request",
            got: h.op,
        });
    }
    let op = Op::try_from(h.op).map_err(|_| DecodeError::UnknownOp(h.op))?;
    let mut r = Reader(body);
    let req = r.request(op)?;
    r.finish()?;
    Ok(Some((h.id, req)))
}

/// Decodes one response from the front of `buf`. `Ok(None)`: not all of it has arrived yet.
pub fn decode_response(
    buf: &mut BytesMut,
    max_body: u32,
) -> Result<Option<(u64, Response)>, DecodeError> {
    let Some((h, body)) = split_frame(buf, max_body)? else {
        return Ok(None);
    };
    if h.op & RESPONSE_BIT == 0 {
        return Err(DecodeError::WrongDirection {
            expected: "response",
            got: h.op,
        });
    }
    let op = Op::try_from(h.op & !RESPONSE_BIT).map_err(|_| DecodeError::UnknownOp(h.op))?;
    let mut r = Reader(body);
    let status = r.u8("status")?;
    if status != 0 {
        let code = ErrorCode::try_from(status).map_err(|_| DecodeError::UnknownStatus(status))?;
        let message = r.str16("error message")?;
        r.finish()?;
        return Ok(Some((h.id, Response::Error { code, message })));
    }
    let resp = match op {
        Op::Hello => Response::Hello(HelloInfo {
            tenant_id: r.u32("tenant id")?,
            quota: r.u64("quota")?,
            capacity: r.u64("capacity")?,
            max_body: r.u32("max body")?,
        }),
        Op::Put => Response::Handle(r.handle()?),
        Op::Get | Op::Take | Op::Gather => Response::Data(r.blob()?),
        Op::Scan => {
            let n = r.u32("value count")? as usize;
            if n > MAX_RESULTS {
                return Err(DecodeError::TooManyItems(n as u32));
            }
            r.need(n * 8, "values")?;
            Response::Values((0..n).map(|_| r.u64("value")).collect::<Result<_, _>>()?)
        }
        Op::Write | Op::Free => Response::Done,
        Op::PutMany => Response::Handles(r.items(|r| r.handle())?),
        Op::GetMany | Op::TakeMany => Response::DataMany(r.items(|r| r.blob())?),
        Op::WriteMany | Op::FreeMany => Response::DoneMany(r.items(|_| Ok(()))?),
        Op::EvictFetch => Response::EvictFetch {
            evicted: r.items(|r| r.handle())?,
            fetched: r.items(|r| r.blob())?,
        },
        Op::Stats => {
            let n = r.count(10)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push((r.str16("stat name")?, r.u64("stat value")?));
            }
            Response::Stats(v)
        }
    };
    r.finish()?;
    Ok(Some((h.id, resp)))
}

/// Bounds-checked reader over one frame body.
struct Reader(Bytes);

impl Reader {
    /// The body of a request whose op is `op`.
    fn request(&mut self, op: Op) -> Result<Request, DecodeError> {
        Ok(match op {
            Op::Hello => self.hello()?,
            Op::Put => Request::Put { data: self.blob()? },
            Op::Get => Request::Get {
                handle: self.handle()?,
            },
            Op::Take => Request::Take {
                handle: self.handle()?,
            },
            Op::Write => Request::Write {
                handle: self.handle()?,
                data: self.blob()?,
            },
            Op::Free => Request::Free {
                handle: self.handle()?,
            },
            Op::PutMany => Request::PutMany {
                items: self.blobs()?,
            },
            Op::GetMany => Request::GetMany {
                handles: self.handles()?,
            },
            Op::TakeMany => Request::TakeMany {
                handles: self.handles()?,
            },
            Op::WriteMany => Request::WriteMany {
                items: self.writes()?,
            },
            Op::FreeMany => Request::FreeMany {
                handles: self.handles()?,
            },
            Op::EvictFetch => self.evict_fetch()?,
            Op::Stats => Request::Stats,
            Op::Scan => Request::Scan(self.scan()?),
            Op::Gather => Request::Gather {
                column: self.column()?,
                indices: self.row_indices()?,
            },
        })
    }
    /// A hello request: tenant, token, session and the store settings newer clients send.
    fn hello(&mut self) -> Result<Request, DecodeError> {
        Ok(Request::Hello {
            tenant: self.str16("tenant name")?,
            token: self.str16("token")?,
            session: self.u64("session id")?,
            // Absent from clients that predate it.
            store: if self.0.is_empty() {
                String::new()
            } else {
                self.str16("store settings")?
            },
        })
    }
    /// A counted list of blobs (the items of a batched put).
    fn blobs(&mut self) -> Result<Vec<Bytes>, DecodeError> {
        let n = self.count(4)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.blob()?);
        }
        Ok(items)
    }
    /// A counted list of (handle, blob) pairs (the items of a batched write).
    fn writes(&mut self) -> Result<Vec<(Handle, Bytes)>, DecodeError> {
        let n = self.count(Handle::ENCODED_LEN + 4)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push((self.handle()?, self.blob()?));
        }
        Ok(items)
    }
    /// An evict-and-fetch request: the take flag, the items to evict, the handles to fetch.
    fn evict_fetch(&mut self) -> Result<Request, DecodeError> {
        let take = self.flag("take flag")?;
        let n = self.count(5)?;
        let mut evict = Vec::with_capacity(n);
        for _ in 0..n {
            let handle = if self.flag("evict item")? {
                Some(self.handle()?)
            } else {
                None
            };
            evict.push(EvictItem {
                handle,
                data: self.blob()?,
            });
        }
        Ok(Request::EvictFetch {
            evict,
            fetch: self.handles()?,
            take,
        })
    }
    /// A counted list of row indices (what a gather reads).
    fn row_indices(&mut self) -> Result<Vec<u64>, DecodeError> {
        let n = self.count(8)?;
        (0..n).map(|_| self.u64("row index")).collect()
    }
    fn need(&self, n: usize, what: &'static str) -> Result<(), DecodeError> {
        if self.0.remaining() < n {
            Err(DecodeError::Truncated(what))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.need(1, what)?;
        Ok(self.0.get_u8())
    }
    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadFlag(v, what)),
        }
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        self.need(2, what)?;
        Ok(self.0.get_u16_le())
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.need(4, what)?;
        Ok(self.0.get_u32_le())
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.need(8, what)?;
        Ok(self.0.get_u64_le())
    }
    fn handle(&mut self) -> Result<Handle, DecodeError> {
        self.need(Handle::ENCODED_LEN, "handle")?;
        let mut b = [0u8; 16];
        self.0.copy_to_slice(&mut b);
        Ok(Handle::from_bytes(b))
    }
    fn blob(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u32("payload length")? as usize;
        self.need(len, "payload")?;
        Ok(self.0.split_to(len))
    }
    fn str16(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let len = self.u16(what)? as usize;
        self.need(len, what)?;
        let b = self.0.split_to(len);
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::BadUtf8(what))
    }
    /// An item count, checked against the limit and against the bytes left, given that each
    /// item takes at least `min_item` bytes.
    fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.u32("item count")?;
        if n > MAX_ITEMS {
            return Err(DecodeError::TooManyItems(n));
        }
        self.need(n as usize * min_item, "batch items")?;
        Ok(n as usize)
    }
    fn opt_handle(&mut self) -> Result<Option<Handle>, DecodeError> {
        Ok(if self.flag("line present")? {
            Some(self.handle()?)
        } else {
            None
        })
    }
    fn column(&mut self) -> Result<Column<Option<Handle>>, DecodeError> {
        let t = self.u8("element type")?;
        let ty = ElemType::try_from(t).map_err(|_| DecodeError::BadFlag(t, "element type"))?;
        let line_elems = self.u32("elements per line")?;
        let n = self.count(1)?;
        let mut lines = Vec::with_capacity(n);
        for _ in 0..n {
            lines.push(self.opt_handle()?);
        }
        Ok(Column {
            ty,
            line_elems,
            lines,
        })
    }
    fn scan(&mut self) -> Result<Scan<Option<Handle>>, DecodeError> {
        let rows = self.u64("rows")?;
        let nc = self.u8("column count")?;
        let mut columns = Vec::with_capacity(nc.min(8) as usize);
        for _ in 0..nc {
            columns.push(self.column()?);
        }
        let filter = if self.flag("filter present")? {
            let column = self.u8("filter column")?;
            let c = self.u8("comparison")?;
            Some(Filter {
                column,
                cmp: Cmp::try_from(c).map_err(|_| DecodeError::BadFlag(c, "comparison"))?,
                value: self.u64("filter value")?,
            })
        } else {
            None
        };
        let group = if self.flag("group present")? {
            Some(Group {
                column: self.u8("group column")?,
                groups: self.u32("groups")?,
            })
        } else {
            None
        };
        let na = self.u8("aggregation count")?;
        let mut aggs = Vec::with_capacity(na.min(16) as usize);
        for _ in 0..na {
            let column = self.u8("aggregation column")?;
            let k = self.u8("aggregation")?;
            let kind = match k {
                1 => AggKind::Sum,
                2 => AggKind::Min,
                3 => AggKind::Max,
                4 => AggKind::Count,
                5 => AggKind::Histogram {
                    lo: self.u64("histogram low")?,
                    hi: self.u64("histogram high")?,
                    buckets: self.u32("buckets")?,
                },
                k => return Err(DecodeError::BadFlag(k, "aggregation")),
            };
            aggs.push(Agg { column, kind });
        }
        Ok(Scan {
            rows,
            columns,
            filter,
            group,
            aggs,
        })
    }
    fn handles(&mut self) -> Result<Vec<Handle>, DecodeError> {
        let n = self.count(Handle::ENCODED_LEN)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.handle()?);
        }
        Ok(v)
    }
    fn items<T>(
        &mut self,
        mut f: impl FnMut(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<Vec<ItemResult<T>>, DecodeError> {
        let n = self.count(1)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let status = self.u8("item status")?;
            if status == 0 {
                v.push(Ok(f(self)?));
            } else {
                let code =
                    ErrorCode::try_from(status).map_err(|_| DecodeError::UnknownStatus(status))?;
                v.push(Err(code));
            }
        }
        Ok(v)
    }
    fn finish(self) -> Result<(), DecodeError> {
        match self.0.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Writes one frame into a buffer: the header first with a zero length, the body through the
/// `put_*` methods, then [`FrameWriter::finish`] patches the length in. The server uses this to
/// copy object data straight from its arena into the send buffer.
#[derive(Debug)]
pub struct FrameWriter<'a> {
    buf: &'a mut BytesMut,
    start: usize,
    /// Body bytes the caller sends from elsewhere (vectored writes), not in `buf`.
    external: usize,
}

/// Writes a header whose body (of `body_len` bytes) the caller sends itself, e.g. partly from
/// its own memory with vectored writes.
pub fn put_header(buf: &mut BytesMut, op: u8, id: u64, body_len: u32) {
    buf.put_slice(&MAGIC);
    buf.put_u8(VERSION);
    buf.put_u8(op);
    buf.put_u32_le(body_len);
    buf.put_u64_le(id);
}

impl<'a> FrameWriter<'a> {
    pub fn begin(buf: &'a mut BytesMut, op: u8, id: u64) -> Self {
        let start = buf.len();
        buf.reserve(HEADER_LEN + 64);
        buf.put_slice(&MAGIC);
        buf.put_u8(VERSION);
        buf.put_u8(op);
        buf.put_u32_le(0);
        buf.put_u64_le(id);
        FrameWriter {
            buf,
            start,
            external: 0,
        }
    }

    /// Counts `len` body bytes that the caller will send itself, right after what is in the
    /// buffer now (a vectored write splices them in).
    pub fn add_external(&mut self, len: usize) {
        self.external += len;
    }
    pub fn put_u8(&mut self, v: u8) {
        self.buf.put_u8(v);
    }
    pub fn put_u32(&mut self, v: u32) {
        self.buf.put_u32_le(v);
    }
    pub fn put_u64(&mut self, v: u64) {
        self.buf.put_u64_le(v);
    }
    pub fn put_handle(&mut self, h: Handle) {
        self.buf.put_slice(&h.to_bytes());
    }
    pub fn put_blob(&mut self, data: &[u8]) {
        self.begin_blob(data.len());
        self.buf.put_slice(data);
    }
    /// Writes a blob's length only; the caller then appends exactly `len` bytes with
    /// [`FrameWriter::extend_blob`] (in pieces if it likes).
    pub fn begin_blob(&mut self, len: usize) {
        self.buf.reserve(4 + len);
        self.buf.put_u32_le(len as u32);
    }
    /// The buffer being written, for appending blob bytes without an intermediate copy.
    pub fn buf(&mut self) -> &mut BytesMut {
        self.buf
    }
    pub fn extend_blob(&mut self, data: &[u8]) {
        self.buf.put_slice(data);
    }
    pub fn put_str16(&mut self, s: &str) {
        let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
        self.buf.put_u16_le(b.len() as u16);
        self.buf.put_slice(b);
    }
    /// A placeholder for a count that is known only after the items are written.
    pub fn reserve_u32(&mut self) -> usize {
        let at = self.buf.len();
        self.buf.put_u32_le(0);
        at
    }
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Body bytes written so far, external ones included.
    pub fn body_len(&self) -> usize {
        self.buf.len() - self.start - HEADER_LEN + self.external
    }

    /// Where this frame starts in the buffer.
    pub fn start(&self) -> usize {
        self.start
    }
    pub fn finish(self) {
        let len = self.body_len() as u32;
        self.buf[self.start + 4..self.start + 8].copy_from_slice(&len.to_le_bytes());
    }
    /// Drops everything written since `begin` (used to replace a half-written answer with an
    /// error).
    pub fn abandon(self) {
        self.buf.truncate(self.start);
    }
}

impl Request {
    /// Appends this request as one frame.
    pub fn encode(&self, id: u64, buf: &mut BytesMut) {
        let mut w = FrameWriter::begin(buf, self.op() as u8, id);
        match self {
            Request::Hello {
                tenant,
                token,
                session,
                store,
            } => {
                w.put_str16(tenant);
                w.put_str16(token);
                w.put_u64(*session);
                // Only when there is one: nodes that predate the field refuse bytes after the
                // session id, and a client of one node has nothing to say.
                if !store.is_empty() {
                    w.put_str16(store);
                }
            }
            Request::Put { data } => w.put_blob(data),
            Request::Get { handle } | Request::Take { handle } | Request::Free { handle } => {
                w.put_handle(*handle)
            }
            Request::Write { handle, data } => {
                w.put_handle(*handle);
                w.put_blob(data);
            }
            Request::PutMany { items } => {
                w.put_u32(items.len() as u32);
                for d in items {
                    w.put_blob(d);
                }
            }
            Request::GetMany { handles }
            | Request::TakeMany { handles }
            | Request::FreeMany { handles } => put_handles(&mut w, handles),
            Request::WriteMany { items } => {
                w.put_u32(items.len() as u32);
                for (h, d) in items {
                    w.put_handle(*h);
                    w.put_blob(d);
                }
            }
            Request::EvictFetch { evict, fetch, take } => {
                w.put_u8(*take as u8);
                w.put_u32(evict.len() as u32);
                for item in evict {
                    match item.handle {
                        Some(h) => {
                            w.put_u8(1);
                            w.put_handle(h);
                        }
                        None => w.put_u8(0),
                    }
                    w.put_blob(&item.data);
                }
                put_handles(&mut w, fetch);
            }
            Request::Stats => {}
            Request::Scan(scan) => put_scan(&mut w, scan),
            Request::Gather { column, indices } => {
                put_column(&mut w, column);
                w.put_u32(indices.len() as u32);
                for &i in indices {
                    w.put_u64(i);
                }
            }
        }
        w.finish();
    }
}

fn put_column(w: &mut FrameWriter<'_>, c: &Column<Option<Handle>>) {
    w.put_u8(c.ty as u8);
    w.put_u32(c.line_elems);
    w.put_u32(c.lines.len() as u32);
    for l in &c.lines {
        match l {
            Some(h) => {
                w.put_u8(1);
                w.put_handle(*h);
            }
            None => w.put_u8(0),
        }
    }
}

fn put_scan(w: &mut FrameWriter<'_>, s: &Scan<Option<Handle>>) {
    w.put_u64(s.rows);
    w.put_u8(s.columns.len() as u8);
    for c in &s.columns {
        put_column(w, c);
    }
    match s.filter {
        Some(f) => {
            w.put_u8(1);
            w.put_u8(f.column);
            w.put_u8(f.cmp as u8);
            w.put_u64(f.value);
        }
        None => w.put_u8(0),
    }
    match s.group {
        Some(g) => {
            w.put_u8(1);
            w.put_u8(g.column);
            w.put_u32(g.groups);
        }
        None => w.put_u8(0),
    }
    w.put_u8(s.aggs.len() as u8);
    for a in &s.aggs {
        w.put_u8(a.column);
        match a.kind {
            AggKind::Sum => w.put_u8(1),
            AggKind::Min => w.put_u8(2),
            AggKind::Max => w.put_u8(3),
            AggKind::Count => w.put_u8(4),
            AggKind::Histogram { lo, hi, buckets } => {
                w.put_u8(5);
                w.put_u64(lo);
                w.put_u64(hi);
                w.put_u32(buckets);
            }
        }
    }
}

fn put_handles(w: &mut FrameWriter<'_>, handles: &[Handle]) {
    w.put_u32(handles.len() as u32);
    for h in handles {
        w.put_handle(*h);
    }
}

fn put_items<T>(
    w: &mut FrameWriter<'_>,
    items: &[ItemResult<T>],
    mut f: impl FnMut(&mut FrameWriter<'_>, &T),
) {
    w.put_u32(items.len() as u32);
    for it in items {
        match it {
            Ok(v) => {
                w.put_u8(0);
                f(w, v);
            }
            Err(code) => w.put_u8(*code as u8),
        }
    }
}

impl Response {
    /// Appends this response, answering a request with op `op`, as one frame.
    pub fn encode(&self, op: Op, id: u64, buf: &mut BytesMut) {
        let mut w = FrameWriter::begin(buf, op as u8 | RESPONSE_BIT, id);
        if let Response::Error { code, message } = self {
            w.put_u8(*code as u8);
            w.put_str16(message);
            w.finish();
            return;
        }
        w.put_u8(0);
        match self {
            Response::Error { .. } => unreachable!("handled above"),
            Response::Hello(i) => {
                w.put_u32(i.tenant_id);
                w.put_u64(i.quota);
                w.put_u64(i.capacity);
                w.put_u32(i.max_body);
            }
            Response::Handle(h) => w.put_handle(*h),
            Response::Data(d) => w.put_blob(d),
            Response::Done => {}
            Response::Handles(v) => put_items(&mut w, v, |w, h| w.put_handle(*h)),
            Response::DataMany(v) => put_items(&mut w, v, |w, d| w.put_blob(d)),
            Response::DoneMany(v) => put_items(&mut w, v, |_, _| {}),
            Response::EvictFetch { evicted, fetched } => {
                put_items(&mut w, evicted, |w, h| w.put_handle(*h));
                put_items(&mut w, fetched, |w, d| w.put_blob(d));
            }
            Response::Stats(v) => {
                w.put_u32(v.len() as u32);
                for (k, val) in v {
                    w.put_str16(k);
                    w.put_u64(*val);
                }
            }
            Response::Values(v) => {
                w.put_u32(v.len() as u32);
                for &x in v {
                    w.put_u64(x);
                }
            }
        }
        w.finish();
    }
}

#[cfg(test)]
mod tests;
