//! What an allocation path returns.

/// An allocation and whether its bytes are known to be zero.
#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub ptr: *mut u8,
    pub fresh: bool,
}

impl Block {
    pub const NULL_BLOCK: Block = Block {
        ptr: core::ptr::null_mut(),
        fresh: false,
    };
}
