//! Message types: ops, handles, requests, responses and error codes.

use crate::scan::{Column, Scan};
use bytes::Bytes;
use num_enum::{IntoPrimitive, TryFromPrimitive};
use std::fmt;

/// Operation codes. A response carries its request's op with [`crate::RESPONSE_BIT`] set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoPrimitive, TryFromPrimitive)]
#[repr(u8)]
pub enum Op {
    Hello = 0x01,
    Put = 0x02,
    Get = 0x03,
    Take = 0x04,
    Write = 0x05,
    Free = 0x06,
    PutMany = 0x12,
    GetMany = 0x13,
    TakeMany = 0x14,
    WriteMany = 0x15,
    FreeMany = 0x16,
    EvictFetch = 0x20,
    Stats = 0x30,
    Scan = 0x40,
    Gather = 0x41,
}

/// An opaque reference to one object on a memory node, issued by the node on put.
///
/// The node checks every field on use: the tenant must be the connection's, the epoch the
/// server instance's, and the generation the slot's current one, so a handle that was freed,
/// taken, forged or issued by an earlier run of the server is refused rather than aliasing
/// somebody else's data.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Handle {
    pub tenant: u32,
    pub section: u16,
    /// Random per server start: handles do not survive a restart of the node.
    pub epoch: u16,
    pub slot: u32,
    pub generation: u32,
}

impl Handle {
    pub const ENCODED_LEN: usize = 16;

    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.tenant.to_le_bytes());
        b[4..6].copy_from_slice(&self.section.to_le_bytes());
        b[6..8].copy_from_slice(&self.epoch.to_le_bytes());
        b[8..12].copy_from_slice(&self.slot.to_le_bytes());
        b[12..16].copy_from_slice(&self.generation.to_le_bytes());
        b
    }

    pub fn from_bytes(b: [u8; 16]) -> Handle {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Handle {
            tenant: u32_at(0),
            section: u16::from_le_bytes([b[4], b[5]]),
            epoch: u16::from_le_bytes([b[6], b[7]]),
            slot: u32_at(8),
            generation: u32_at(12),
        }
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Handle(t{}:s{}:e{:04x}:#{}@g{})",
            self.tenant, self.section, self.epoch, self.slot, self.generation
        )
    }
}

/// Why a request (or one item of a batch) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoPrimitive, TryFromPrimitive)]
#[repr(u8)]
pub enum ErrorCode {
    /// The frame could not be decoded; the server closes the connection after saying so.
    Malformed = 1,
    UnsupportedVersion = 2,
    /// Any op other than hello before a successful hello.
    NotAuthenticated = 3,
    /// Unknown tenant or wrong token.
    AuthFailed = 4,
    /// The handle does not name a live object of this tenant (forged, or another tenant's).
    InvalidHandle = 5,
    /// The handle named an object that has since been freed or taken.
    StaleHandle = 6,
    QuotaExceeded = 7,
    CapacityExhausted = 8,
    /// A write larger than the object's allocated block, or a payload over the size limit.
    TooLarge = 9,
    /// The server refused a new connection (connection limit reached).
    Busy = 10,
    Internal = 11,
    AlreadyAuthenticated = 12,
    /// An offloaded scan or gather that cannot run (the message says why).
    BadOffload = 13,
    /// The tenant is in use on this node by a store over other nodes or with other redundancy
    /// (the message names both).
    StoreMismatch = 16,
}

impl ErrorCode {
    /// A sentence a user can act on.
    pub fn describe(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Malformed => "malformed frame",
            UnsupportedVersion => "unsupported protocol version",
            NotAuthenticated => "hello (tenant and token) must come first",
            AuthFailed => "unknown tenant or wrong token",
            InvalidHandle => "handle does not name an object of this tenant",
            StaleHandle => "handle names an object that was freed or taken",
            QuotaExceeded => "tenant quota exhausted",
            CapacityExhausted => "memory node capacity exhausted",
            TooLarge => "payload larger than allowed",
            Busy => "server busy (connection limit reached)",
            Internal => "internal server error",
            AlreadyAuthenticated => "hello was already sent on this connection",
            BadOffload => "offloaded operation cannot run",
            StoreMismatch => "the tenant is in use by a store with other settings",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The result of one item in a batch.
pub type ItemResult<T> = Result<T, ErrorCode>;

/// One object sent out by an evict-and-fetch: written in place when `handle` is given (keep-copy
/// write-back), newly allocated otherwise (unique-copy swap-out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictItem {
    pub handle: Option<Handle>,
    pub data: Bytes,
}

/// What the server says in answer to hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloInfo {
    pub tenant_id: u32,
    /// Bytes this tenant may hold; the node's capacity when no quota is set.
    pub quota: u64,
    pub capacity: u64,
    /// The largest frame body the server accepts.
    pub max_body: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Authenticates the connection. Connections that give the same non-zero `session` (a random
    /// number the client picks once) form one session: objects belong to the session and are
    /// released when its last connection closes. Zero means a session of this connection alone.
    ///
    /// `store` says what the client's store is when the node is one of several (`ec=4+2 over
    /// h1,...`), empty otherwise: every connection of a tenant that gives one must give the same
    /// (clients sharing a tenant must agree on its nodes and redundancy).
    Hello {
        tenant: String,
        token: String,
        session: u64,
        store: String,
    },
    Put {
        data: Bytes,
    },
    /// Read and keep the far copy.
    Get {
        handle: Handle,
    },
    /// Read and free: the unique-copy swap-in.
    Take {
        handle: Handle,
    },
    Write {
        handle: Handle,
        data: Bytes,
    },
    Free {
        handle: Handle,
    },
    PutMany {
        items: Vec<Bytes>,
    },
    GetMany {
        handles: Vec<Handle>,
    },
    TakeMany {
        handles: Vec<Handle>,
    },
    WriteMany {
        items: Vec<(Handle, Bytes)>,
    },
    FreeMany {
        handles: Vec<Handle>,
    },
    /// Send objects out and bring others in with one round trip.
    EvictFetch {
        evict: Vec<EvictItem>,
        fetch: Vec<Handle>,
        /// Free the fetched objects' far copies (unique copy) instead of keeping them.
        take: bool,
    },
    Stats,
    /// Compute aggregations over far vectors stored here (see [`crate::scan`]).
    Scan(Scan<Option<Handle>>),
    /// The elements at `indices` (row numbers) of one far vector, concatenated.
    Gather {
        column: Column<Option<Handle>>,
        indices: Vec<u64>,
    },
}

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Hello { .. } => Op::Hello,
            Request::Put { .. } => Op::Put,
            Request::Get { .. } => Op::Get,
            Request::Take { .. } => Op::Take,
            Request::Write { .. } => Op::Write,
            Request::Free { .. } => Op::Free,
            Request::PutMany { .. } => Op::PutMany,
            Request::GetMany { .. } => Op::GetMany,
            Request::TakeMany { .. } => Op::TakeMany,
            Request::WriteMany { .. } => Op::WriteMany,
            Request::FreeMany { .. } => Op::FreeMany,
            Request::EvictFetch { .. } => Op::EvictFetch,
            Request::Stats => Op::Stats,
            Request::Scan(_) => Op::Scan,
            Request::Gather { .. } => Op::Gather,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The whole request failed.
    Error {
        code: ErrorCode,
        message: String,
    },
    Hello(HelloInfo),
    /// Answer to put.
    Handle(Handle),
    /// Answer to get and take.
    Data(Bytes),
    /// Answer to write and free.
    Done,
    /// Answer to put-many.
    Handles(Vec<ItemResult<Handle>>),
    /// Answer to get-many and take-many.
    DataMany(Vec<ItemResult<Bytes>>),
    /// Answer to write-many and free-many.
    DoneMany(Vec<ItemResult<()>>),
    EvictFetch {
        evicted: Vec<ItemResult<Handle>>,
        fetched: Vec<ItemResult<Bytes>>,
    },
    /// Named counters: the tenant's own (`tenant.*`) and the node's (`node.*`).
    Stats(Vec<(String, u64)>),
    /// Answer to scan.
    Values(Vec<u64>),
}
