//! Reads: the superblocks object, the listing that rebuilds every segment at open (trusting older generations only within the seal), and reads of segment bytes.

use crate::layout::{self, Object};
use crate::readahead::RunRef;
use crate::{Head, Run, S3Medium, Segment, LAYOUT_1, LAYOUT_2, LAYOUT_3};
use object_store::path::Path as ObjectPath;
use oubli_core::SegmentId;
use std::collections::{BTreeMap, BTreeSet};
use std::io;

impl S3Medium {
    /// Reads the superblocks object as it is on the server now.
    pub(crate) fn fetch_head(&self) -> io::Result<Head> {
        let key = self.head_key();
        let got = self.runtime.block_on(async {
            match self.store.get(&key).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    Ok(Some((r.bytes().await?, etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match got.map_err(|e| self.error("reading the superblocks", e))? {
            None => Ok(Head::default()),
            Some((_, None)) => Err(io::Error::other(format!(
                "{}: the server gave no ETag for the superblocks (conditional writes are needed)",
                self.location
            ))),
            Some((bytes, Some(etag))) => {
                let (layout, generation, slots) = Head::decode(&bytes).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: the superblocks object is malformed", self.location),
                    )
                })?;
                if ![LAYOUT_1, LAYOUT_2, LAYOUT_3].contains(&layout) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: the store was written by a newer oubli (S3 layout {layout}; this one reads layouts 1 to 3)",
                            self.location
                        ),
                    ));
                }
                Ok(Head {
                    etag: Some(etag),
                    layout,
                    generation,
                    slots,
                })
            }
        }
    }

    /// Reads an object and its ETag; `None` when there is none.
    pub(crate) fn get_optional(
        &self,
        key: &ObjectPath,
    ) -> Result<Option<(bytes::Bytes, Option<String>)>, object_store::Error> {
        self.runtime.block_on(async {
            match self.store.get(key).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    Ok(Some((r.bytes().await?, etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// Lists the run and pack objects, reads the gone list and the seal of
    /// `head`'s generation, and rebuilds each segment's runs.
    ///
    /// Which objects count: those of `head`'s generation, and those of an
    /// older one that lie within the seal (inside a span of bytes the seal
    /// says their generation wrote; a v1 seal: ending at or before the
    /// segment's sealed end); any other older generation's object is a
    /// taken-over holder's late upload, whenever it landed, and is ignored
    /// (and deleted by a writer's tidying). Of those, from byte 0, each next run
    /// is the piece that reaches furthest among those covering the
    /// segment's end so far (a PUT whose answer was lost and that was
    /// retried with more bytes left two objects starting at the same
    /// offset: the longer one wins; their common bytes are equal). Bytes
    /// after a gap (impossible unless the bucket was tampered with) are
    /// ignored. The gone list counts when stamped with `head`'s generation,
    /// the seal's list otherwise.
    pub(crate) fn load_segments(&self, head: &Head) -> io::Result<()> {
        let current = head.generation;
        let list = |dir: &'static str| {
            let prefix = self.key(dir);
            async move {
                use futures::TryStreamExt;
                self.store
                    .list(Some(&prefix))
                    .try_collect::<Vec<object_store::ObjectMeta>>()
                    .await
            }
        };
        let (runs, packs, seals) = self
            .runtime
            .block_on(async { futures::try_join!(list("seg/"), list("pack/"), list("seal/")) })
            .map_err(|e| self.error("listing the segments", e))?;
        let malformed = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {what} is malformed", self.location),
            )
        };
        let gone_body = self
            .get_optional(&self.key(layout::GONE))
            .map_err(|e| self.error("reading the list of deleted segments", e))?;
        let gone_etag = gone_body.as_ref().and_then(|(_, etag)| etag.clone());
        let gone_object = match gone_body.map(|(body, _)| body) {
            None => None,
            Some(body) => Some(
                layout::decode_gone(&body)
                    .zip(layout::gone_generation(&body))
                    .ok_or_else(|| malformed("the list of deleted segments"))?,
            ),
        };
        let seal = if current == 0 {
            None
        } else {
            let body = self
                .get_optional(&self.key(&layout::seal_name(current)))
                .map_err(|e| self.error("reading the seal of the store's generation", e))?
                .map(|(body, _)| body)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "{}: the seal of generation {current} is missing",
                            self.location
                        ),
                    )
                })?;
            Some(layout::decode_seal(&body).ok_or_else(|| malformed("the seal"))?)
        };
        let gone: Vec<SegmentId> = match (&gone_object, &seal) {
            (Some((ids, g)), _) if *g == current => ids.clone(),
            (_, Some(seal)) => seal.gone.clone(),
            (Some((ids, _)), None) => ids.clone(),
            (None, None) => Vec::new(),
        };
        // Whether an object of `generation` holding `[offset, offset+len)`
        // of segment `id` counts: one of the superblocks' generation, or of
        // an older one that the seal covers (`Seal::covers`).
        let counts = |generation: u64, id: SegmentId, offset: u64, len: u64| {
            generation == current
                || generation < current
                    && seal
                        .as_ref()
                        .is_some_and(|s| s.covers(generation, id, offset, len))
        };
        // Whether an older generation's piece of segment `id` is dead: the
        // segment was deleted before the seal (`Seal::gone_then`). It keeps
        // its pack whole, and never counts for the segment.
        let dead = |generation: u64, id: SegmentId| {
            generation < current && seal.as_ref().is_some_and(|s| s.gone_then(id))
        };
        // Per segment: (offset, length, object, base) of every piece listed.
        let mut pieces: BTreeMap<SegmentId, Vec<(u64, u64, ObjectPath, u64)>> = BTreeMap::new();
        let mut own: BTreeMap<SegmentId, BTreeSet<ObjectPath>> = BTreeMap::new();
        let mut state = self.lock();
        let state = &mut *state;
        state.gone = gone.into_iter().collect();
        state.gone_etag = gone_etag;
        for meta in seals.iter() {
            let older = self
                .relative(&meta.location)
                .and_then(layout::parse_seal_name)
                .is_some_and(|g| g < current);
            if older {
                state.stale.push(meta.location.clone());
            }
        }
        for meta in runs.iter().chain(&packs) {
            let Some(name) = self.relative(&meta.location) else {
                continue;
            };
            match layout::parse(name) {
                Object::Run {
                    id,
                    offset,
                    generation,
                } => {
                    if !counts(generation, id, offset, meta.size) {
                        if generation < current {
                            state.stale.push(meta.location.clone());
                        }
                        continue;
                    }
                    own.entry(id).or_default().insert(meta.location.clone());
                    pieces.entry(id).or_default().push((
                        offset,
                        meta.size,
                        meta.location.clone(),
                        0,
                    ));
                }
                Object::Pack(listed, generation) => {
                    if listed.iter().map(|p| p.len).sum::<u64>() != meta.size {
                        // Not what this layout writes: ignored.
                        continue;
                    }
                    // A pack is one PUT: it counts whole or not at all.
                    let whole = listed.iter().all(|p| {
                        counts(generation, p.id, p.offset, p.len) || dead(generation, p.id)
                    });
                    if !whole {
                        if generation < current {
                            state.stale.push(meta.location.clone());
                        }
                        continue;
                    }
                    let mut base = 0;
                    for p in &listed {
                        if counts(generation, p.id, p.offset, p.len) {
                            let at = (p.offset, p.len, meta.location.clone(), base);
                            pieces.entry(p.id).or_default().push(at);
                        }
                        base += p.len;
                    }
                    state.add_pack(name.into(), listed);
                }
                Object::Other => {}
            }
        }
        for (id, objects) in &own {
            if state.gone.contains(id) {
                state.stale.extend(objects.iter().cloned());
            }
        }
        for (id, mut listed) in pieces {
            if state.gone.contains(&id) {
                continue;
            }
            listed.sort_by_key(|&(offset, ..)| offset);
            let mut seg = Segment {
                own: own.remove(&id).unwrap_or_default(),
                ..Segment::default()
            };
            let mut end = 0;
            let mut next = 0;
            loop {
                let mut best: Option<&(u64, u64, ObjectPath, u64)> = None;
                while next < listed.len() && listed[next].0 <= end {
                    let candidate = &listed[next];
                    let reach = candidate.0 + candidate.1;
                    if reach > end && best.is_none_or(|b| reach > b.0 + b.1) {
                        best = Some(candidate);
                    }
                    next += 1;
                }
                let Some((offset, len, object, base)) = best else {
                    break;
                };
                seg.runs.insert(
                    end,
                    Run {
                        len: offset + len - end,
                        object: object.clone(),
                        base: base + (end - offset),
                    },
                );
                end = offset + len;
            }
            seg.waiting_at = end;
            state.segments.insert(id, seg);
        }
        Ok(())
    }

    /// A read: from memory what waits or is being uploaded, from the
    /// server (read-ahead windows for a stream, ranged GETs otherwise) the rest.
    pub(crate) fn read_at(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        // What to fetch from uploaded runs: (run, from within it, length,
        // position in buf); and the runs a sequential reader goes on into.
        let mut fetches: Vec<(RunRef, u64, usize, usize)> = Vec::new();
        let mut ahead: Vec<RunRef> = Vec::new();
        {
            let state = self.lock();
            let Some(seg) = state.segments.get(&id) else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no segment {id}"),
                ));
            };
            if end > seg.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of segment {id} past its end"),
                ));
            }
            let mut at = offset;
            while at < end {
                if at >= seg.waiting_at {
                    let from = (at - seg.waiting_at) as usize;
                    let n = (end - at) as usize;
                    buf[(at - offset) as usize..].copy_from_slice(&seg.waiting[from..from + n]);
                    break;
                }
                if let Some((u_at, bytes)) = &seg.uploading {
                    let u_end = u_at + bytes.len() as u64;
                    if (*u_at..u_end).contains(&at) {
                        let n = (end.min(u_end) - at) as usize;
                        let from = (at - u_at) as usize;
                        buf[(at - offset) as usize..][..n].copy_from_slice(&bytes[from..from + n]);
                        at += n as u64;
                        continue;
                    }
                }
                let Some((&run_at, run)) = seg.runs.range(..=at).next_back() else {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no run"));
                };
                let n = (end.min(run_at + run.len) - at) as usize;
                let run = RunRef {
                    run_at,
                    run_len: run.len,
                    object: run.object.clone(),
                    base: run.base,
                };
                fetches.push((run, at - run_at, n, (at - offset) as usize));
                at += n as u64;
            }
            if let Some((last, ..)) = fetches.last() {
                ahead.push(last.clone());
                let next = seg.runs.range(last.run_at + 1..).take(2);
                ahead.extend(next.map(|(&run_at, r)| RunRef {
                    run_at,
                    run_len: r.len,
                    object: r.object.clone(),
                    base: r.base,
                }));
            }
        }
        let ra = &self.readahead;
        let handle = self.runtime.handle();
        let failed = |e| self.error(&format!("reading segment {id}"), e);
        let streak = ra.streak(id, offset, end);
        if streak > 0 {
            // A stream: through the windows, the next ones fetched behind it.
            for (run, from, n, into) in &fetches {
                ra.read_through(handle, &self.store, id, run, *from, &mut buf[*into..][..*n])
                    .map_err(failed)?;
            }
            if let (true, Some((_, from, n, _))) = (streak > 1, fetches.last()) {
                ra.prefetch(handle, &self.store, id, &ahead, from + *n as u64 - 1);
            }
            return Ok(());
        }
        // A random read: from a window if one holds it, else exactly its bytes.
        let mut gets = Vec::new();
        for (run, from, n, into) in fetches {
            if !ra.copy_if_ready(id, &run, from, &mut buf[into..into + n]) {
                gets.push((run, from, n, into));
            }
        }
        self.gets
            .fetch_add(gets.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let got = self
            .runtime
            .block_on(futures::future::try_join_all(gets.iter().map(
                |(run, from, n, _)| {
                    let range = run.base + from..run.base + from + *n as u64;
                    async move { self.store.get_range(&run.object, range).await }
                },
            )))
            .map_err(failed)?;
        for (bytes, (_, _, n, into)) in got.into_iter().zip(&gets) {
            if bytes.len() != *n {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: short read of segment {id}", self.location),
                ));
            }
            buf[*into..into + n].copy_from_slice(&bytes);
        }
        Ok(())
    }
}
