//! The Tidepool memory-node wire protocol: framed, versioned, binary messages. No I/O.
//!
//! Every message is one frame: a 16-byte little-endian header followed by a body.
//!
//! ```text
//! offset  size  field
//!      0     2  magic "TP"
//!      2     1  protocol version (1)
//!      3     1  op; responses set the high bit (0x80) of the request's op
//!      4     4  body length in bytes (at most MAX_BODY)
//!      8     8  request id, chosen by the client and echoed in the response
//! ```
//!
//! Request ids let one connection carry many outstanding requests; the server may answer them in
//! any order. Payloads are decoded as `Bytes` slices of the receive buffer, so decoding a 4 KiB
//! value copies nothing.
//!
//! A response body starts with a status byte. A non-zero status is an error for the whole
//! request, followed by a human-readable message. Batched ("many") responses carry a status per
//! item, so one bad handle does not fail its neighbours.
#![forbid(unsafe_code)]

pub mod build;
mod codec;
pub mod coord;
pub mod exposition;
pub mod scan;
mod types;

pub use codec::{
    decode_request, decode_response, peek_header, put_header, DecodeError, FrameWriter, Header,
    HEADER_LEN, MAGIC, MAX_BODY, MAX_ITEMS, RESPONSE_BIT, VERSION,
};
pub use types::{ErrorCode, EvictItem, Handle, HelloInfo, ItemResult, Op, Request, Response};
