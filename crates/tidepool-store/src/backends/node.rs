//! Memory-node backend. (Being written.)
use crate::{FarStore, Key, StoreError};
use bytes::Bytes;

#[derive(Debug)]
pub struct NodeStore;

impl NodeStore {
    pub fn connect(_addr: &str, _tenant: &str, _token: &str) -> Result<NodeStore, StoreError> {
        unimplemented!("redis backend")
    }
}

impl FarStore for NodeStore {
    fn describe(&self) -> String {
        unimplemented!()
    }
    fn write_many(&self, _items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        unimplemented!()
    }
    fn read_many(&self, _keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        unimplemented!()
    }
    fn take_many(&self, _keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        unimplemented!()
    }
    fn remove_many(&self, _keys: &[Key]) -> Result<(), StoreError> {
        unimplemented!()
    }
}
#[derive(Debug)]
pub struct NodeClient;
