//! Batched requests on a connection: each item gets its own status (and its handle or data),
//! so one bad item does not fail the others.

use super::Conn;
use crate::counters::Failure;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use tidepool_proto::{ErrorCode, EvictItem, FrameWriter, Handle};

impl Conn<'_> {
    /// Stores each item, answering a handle per item.
    pub(super) fn put_many(
        &mut self,
        items: Vec<Bytes>,
        w: &mut FrameWriter<'_>,
    ) -> Result<(), ErrorCode> {
        w.put_u8(0);
        w.put_u32(items.len() as u32);
        for data in items {
            let r = self.put(&data);
            self.put_handle_item(w, r);
        }
        Ok(())
    }

    /// Reads (or, with `take`, takes) each object, answering its data per item.
    pub(super) fn fetch_many(
        &mut self,
        handles: Vec<Handle>,
        take: bool,
        w: &mut FrameWriter<'_>,
    ) -> Result<(), ErrorCode> {
        w.put_u8(0);
        w.put_u32(handles.len() as u32);
        for h in handles {
            self.fetch_item(h, take, w);
        }
        Ok(())
    }

    /// Overwrites each object, answering a status per item.
    pub(super) fn write_many(
        &mut self,
        items: Vec<(Handle, Bytes)>,
        w: &mut FrameWriter<'_>,
    ) -> Result<(), ErrorCode> {
        w.put_u8(0);
        w.put_u32(items.len() as u32);
        for (h, data) in items {
            let r = self.write(h, &data);
            self.status_item(w, r);
        }
        Ok(())
    }

    /// Frees each object, answering a status per item.
    pub(super) fn free_many(
        &mut self,
        handles: Vec<Handle>,
        w: &mut FrameWriter<'_>,
    ) -> Result<(), ErrorCode> {
        w.put_u8(0);
        w.put_u32(handles.len() as u32);
        for h in handles {
            let r = self.free(h);
            self.status_item(w, r);
        }
        Ok(())
    }

    /// Stores the evicted items (over their old objects, or as new ones), then reads (or
    /// takes) the ones fetched: a handle per evicted item, then data per fetched one.
    pub(super) fn evict_fetch(
        &mut self,
        evict: Vec<EvictItem>,
        fetch: Vec<Handle>,
        take: bool,
        w: &mut FrameWriter<'_>,
    ) -> Result<(), ErrorCode> {
        w.put_u8(0);
        w.put_u32(evict.len() as u32);
        for EvictItem { handle, data } in evict {
            let r = match handle {
                Some(h) => self.write(h, &data).map(|()| h),
                None => self.put(&data),
            };
            self.put_handle_item(w, r);
        }
        w.put_u32(fetch.len() as u32);
        for h in fetch {
            self.fetch_item(h, take, w);
        }
        Ok(())
    }

    /// An item's handle, or its error.
    fn put_handle_item(&self, w: &mut FrameWriter<'_>, r: Result<Handle, ErrorCode>) {
        match r {
            Ok(h) => {
                w.put_u8(0);
                w.put_handle(h);
            }
            Err(code) => self.item_error(w, code),
        }
    }

    /// An item's status.
    fn status_item(&self, w: &mut FrameWriter<'_>, r: Result<(), ErrorCode>) {
        match r {
            Ok(()) => w.put_u8(0),
            Err(code) => self.item_error(w, code),
        }
    }

    /// An item's error code, counted as a failure.
    fn item_error(&self, w: &mut FrameWriter<'_>, code: ErrorCode) {
        if let Some(a) = &self.auth {
            a.tenant.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.failure(Failure::Code(code));
        w.put_u8(code as u8);
    }

    /// An item's data, or its error.
    fn fetch_item(&mut self, h: Handle, take: bool, w: &mut FrameWriter<'_>) {
        if let Err(code) = self.fetch(h, take, w) {
            self.item_error(w, code);
        }
    }
}
