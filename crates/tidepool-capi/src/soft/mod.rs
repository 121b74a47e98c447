//! Soft memory for C: an arena, pools of fixed-size objects rebuilt by a callback (Midas's
//! `SoftMemPool` and `SoftUniquePtr`), and maps and arrays of bytes.

mod arena;
mod array;
mod map;
mod pool;

pub use arena::{
    tp_arena, tp_arena_free, tp_arena_new, tp_arena_set_budget, tp_buf, tp_buf_append, tp_index_fn,
    tp_key_fn, tp_reconstruct_fn, tp_stats,
};
pub use array::{
    tp_soft_array, tp_soft_array_cmpxchg, tp_soft_array_free, tp_soft_array_get, tp_soft_array_len,
    tp_soft_array_new, tp_soft_array_set, tp_soft_array_stats,
};
pub use map::{
    tp_soft_map, tp_soft_map_free, tp_soft_map_get, tp_soft_map_insert, tp_soft_map_len,
    tp_soft_map_new, tp_soft_map_remove, tp_soft_map_stats,
};
pub use pool::{
    tp_soft_box, tp_soft_box_cmpxchg, tp_soft_box_free, tp_soft_box_new, tp_soft_box_read,
    tp_soft_box_write, tp_soft_pool, tp_soft_pool_free, tp_soft_pool_new, tp_soft_pool_stats,
};
