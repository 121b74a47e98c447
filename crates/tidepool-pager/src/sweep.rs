//! The state of refill's sweep (see `refill.rs`), kept apart so that the pager's shared state
//! can hold it without depending on the work done with it.

use std::collections::HashMap;

/// Where the sweep is in each region, and what it has seen since it last found a page to bring
/// back.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    /// Per region (by id): where the next pass starts, and the page states read since a pass
    /// last brought a page back or saw one on its way out.
    pub(crate) at: HashMap<u32, (usize, usize)>,
    /// `evict_seq` when the dry streak began.
    pub(crate) dry_seq: u32,
    pub(crate) dry: bool,
    /// `Some(seq)`: a whole lap of every region found nothing to bring back, and nothing was
    /// evicted after `seq`; passes wait for the next eviction.
    pub(crate) idle: Option<u32>,
    /// Page states read so far.
    pub(crate) read: u64,
}
