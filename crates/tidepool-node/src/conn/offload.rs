//! Offloaded work on a connection: scans (filter, group, aggregate over far vectors' lines) and
//! gathers of single elements, run where the data lives.

use super::{refusal, Conn};
use crate::counters::Failure;
use crate::slots::ReadGuard;
use bytes::BytesMut;
use std::sync::atomic::Ordering;
use tidepool_proto::scan::{Column, Scan};
use tidepool_proto::{ErrorCode, Handle, Op, Request, Response};
use tidepool_query::Evaluator;

impl<'a> Conn<'a> {
    /// Answers a scan or a gather: its values or data, or its error with a message saying
    /// what was wrong with it.
    pub(super) fn answer_offload(&self, req: &Request, op: Op, id: u64, out: &mut BytesMut) {
        let answer = match req {
            Request::Scan(scan) => self.scan(scan).map(Response::Values),
            Request::Gather { column, indices } => self
                .gather(column, indices)
                .map(|b| Response::Data(b.freeze())),
            _ => unreachable!("only scans and gathers are offloaded"),
        };
        let resp = answer.unwrap_or_else(|(code, message)| {
            self.tenant().stats.errors.fetch_add(1, Ordering::Relaxed);
            self.metrics.failure(Failure::Code(code));
            Response::Error { code, message }
        });
        resp.encode(op, id, out);
    }

    /// A read guard on the object behind `h`, and its section's base in the arena.
    fn read_line(&self, h: Handle) -> Result<(ReadGuard<'a>, u64), (ErrorCode, String)> {
        let refused = |code: ErrorCode| (code, format!("a line of the scan: {}", code.describe()));
        let (section, meta) = self.resolve(h).map_err(refused)?;
        let guard = meta
            .read(h.generation, h.tenant)
            .map_err(|r| refused(refusal(r)))?;
        Ok((guard, self.sh.sections[section as usize].base))
    }

    /// Runs an offloaded scan over the objects it names, a line of every column at a time.
    pub(super) fn scan(
        &self,
        scan: &Scan<Option<Handle>>,
    ) -> Result<Vec<u64>, (ErrorCode, String)> {
        let bad = |e: tidepool_query::ScanError| (ErrorCode::BadOffload, e.to_string());
        let mut ev = Evaluator::new(scan).map_err(bad)?;
        let mut guards = Vec::with_capacity(scan.columns.len());
        for line in 0..ev.lines() {
            guards.clear();
            for (c, col) in scan.columns.iter().enumerate() {
                guards.push(match col.lines[line] {
                    Some(h) if ev.reads(c) => Some(self.read_line(h)?),
                    _ => None,
                });
            }
            let slices: Vec<Option<&[u8]>> = guards
                .iter()
                .map(|g| g.as_ref().map(|(g, base)| self.sh.arena.slice(g, *base)))
                .collect();
            ev.feed(line, &slices).map_err(bad)?;
        }
        self.tenant().stats.gets.fetch_add(1, Ordering::Relaxed);
        Ok(ev.finish())
    }

    /// The elements at `indices` of one far vector, concatenated.
    pub(super) fn gather(
        &self,
        column: &Column<Option<Handle>>,
        indices: &[u64],
    ) -> Result<BytesMut, (ErrorCode, String)> {
        let size = column.ty.size();
        let le = column.line_elems as u64;
        if le == 0 {
            return Err((
                ErrorCode::BadOffload,
                "a column with 0 elements per line".into(),
            ));
        }
        let mut out = BytesMut::with_capacity(indices.len() * size);
        for &i in indices {
            let line = i / le;
            let at = (i % le) as usize * size;
            let Some(h) = column.lines.get(line as usize) else {
                return Err((
                    ErrorCode::BadOffload,
                    format!("row {i} is past the column's {} lines", column.lines.len()),
                ));
            };
            match h {
                None => out.extend_from_slice(&[0u8; 8][..size]),
                Some(h) => {
                    let (g, base) = self.read_line(*h)?;
                    let d = self.sh.arena.slice(&g, base);
                    let Some(e) = d.get(at..at + size) else {
                        return Err((
                            ErrorCode::BadOffload,
                            format!("row {i}: its line holds only {} bytes", d.len()),
                        ));
                    };
                    out.extend_from_slice(e);
                }
            }
        }
        Ok(out)
    }
}
