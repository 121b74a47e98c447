//! Redis and Redis Cluster backend. (Being written.)
use crate::{FarStore, Key, StoreError};
use bytes::Bytes;

#[derive(Debug)]
pub struct RedisStore;

impl RedisStore {
    pub fn connect(_addr: &str, _prefix: Option<String>) -> Result<RedisStore, StoreError> {
        unimplemented!("redis backend")
    }
    pub fn connect_cluster(_nodes: &[String], _prefix: Option<String>) -> Result<RedisStore, StoreError> {
        unimplemented!("redis cluster backend")
    }
}

impl FarStore for RedisStore {
    fn describe(&self) -> String { unimplemented!() }
    fn write_many(&self, _items: &[(Key, &[u8])]) -> Result<(), StoreError> { unimplemented!() }
    fn read_many(&self, _keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> { unimplemented!() }
    fn take_many(&self, _keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> { unimplemented!() }
    fn remove_many(&self, _keys: &[Key]) -> Result<(), StoreError> { unimplemented!() }
}
