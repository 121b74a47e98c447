pub mod coding;
pub mod local;
pub mod memcached;
pub mod node;
pub mod node_set;
pub mod packed;
pub mod redis;
mod slots;
