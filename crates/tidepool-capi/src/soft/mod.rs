//! Soft memory for C: an arena, pools of fixed-size objects rebuilt by a callback (Midas's
//! `SoftMemPool` and `SoftUniquePtr`), and maps and arrays of bytes.

mod arena;
mod array;
mod map;
mod pool;

pub use arena::*;
pub use array::*;
pub use map::*;
pub use pool::*;
