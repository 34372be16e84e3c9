//! Sync and packs: appends wait in memory and are uploaded in append order as runs and packs named with the writer's generation; segment deletion, the gone list, the seal, and the superblocks written conditionally.

use crate::layout::{self, Piece, PACK_PIECES};
use crate::{Head, Run, S3Medium, LAYOUT_1, LAYOUT_2, LAYOUT_3, RUN_MAX};
use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{PutMode, UpdateVersion};
use oubli_core::{Medium, SegmentId, Slot};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;

impl S3Medium {
    /// An append: waits in memory until a sync, or until [`RUN_MAX`] bytes
    /// wait in all (then everything is uploaded, in order, as a sync would).
    pub(crate) fn append_waiting(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check_lock()?;
        let full = {
            let mut state = self.lock();
            let state = &mut *state;
            if offset != 0 && !state.segments.contains_key(&id) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no segment {id} to append to at {offset}"),
                ));
            }
            let seg = state.segments.entry(id).or_default();
            if offset != seg.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "append to segment {id} at {offset}, but it ends at {}",
                        seg.len()
                    ),
                ));
            }
            if offset + data.len() as u64 > self.capacity {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("segment {id} would exceed {} bytes", self.capacity),
                ));
            }
            seg.waiting.extend_from_slice(data);
            let end = offset + data.len() as u64;
            match state.order.last_mut() {
                Some((last, last_end)) if *last == id => *last_end = end,
                _ => state.order.push((id, end)),
            }
            state.waiting_bytes += data.len();
            state.waiting_bytes >= RUN_MAX
        };
        if full {
            // Uploaded as a sync would, everything in order: an early
            // upload of one segment alone could land before earlier
            // appends to another.
            let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
            self.upload_waiting()?;
        }
        Ok(())
    }

    pub(crate) fn upload_waiting(&self) -> io::Result<()> {
        let (order, taken) = {
            let mut state = self.lock();
            let state = &mut *state;
            let order = std::mem::take(&mut state.order);
            state.waiting_bytes = 0;
            let mut taken = BTreeMap::new();
            for (&id, seg) in state.segments.iter_mut() {
                if seg.waiting.is_empty() {
                    continue;
                }
                let bytes = Bytes::from(std::mem::take(&mut seg.waiting));
                let at = seg.waiting_at;
                seg.waiting_at += bytes.len() as u64;
                seg.uploading = Some((at, bytes.clone()));
                taken.insert(id, (at, bytes));
            }
            (order, taken)
        };
        if taken.is_empty() {
            return Ok(());
        }
        let uploads = plan_uploads(&order, &taken);
        let mut sent = 0;
        let mut result = Ok(());
        for pieces in &uploads {
            if let Err(e) = self.upload(pieces, &taken) {
                result = Err(e);
                break;
            }
            sent += 1;
        }
        let mut state = self.lock();
        let state = &mut *state;
        for id in taken.keys() {
            if let Some(seg) = state.segments.get_mut(id) {
                seg.uploading = None;
            }
        }
        if result.is_err() {
            let mut unsent: BTreeMap<SegmentId, u64> = BTreeMap::new();
            let mut order_again = Vec::new();
            for p in uploads[sent..].iter().flatten() {
                unsent.entry(p.id).or_insert(p.offset);
                order_again.push((p.id, p.offset + p.len));
            }
            for (id, from) in unsent {
                let Some(seg) = state.segments.get_mut(&id) else {
                    continue;
                };
                let (at, bytes) = &taken[&id];
                let mut again = bytes[(from - at) as usize..].to_vec();
                state.waiting_bytes += again.len();
                again.extend_from_slice(&seg.waiting);
                seg.waiting = again;
                seg.waiting_at = from;
            }
            order_again.append(&mut state.order);
            state.order = order_again;
        }
        result
    }

    /// One PUT: a run when it carries one segment, a pack otherwise.
    fn upload(
        &self,
        pieces: &[Piece],
        taken: &BTreeMap<SegmentId, (u64, Bytes)>,
    ) -> io::Result<()> {
        let bytes_of = |p: &Piece| {
            let (at, bytes) = &taken[&p.id];
            let from = (p.offset - at) as usize;
            bytes.slice(from..from + p.len as usize)
        };
        let what = || {
            let listed: Vec<String> = pieces
                .iter()
                .map(|p| format!("segment {} at {}", p.id, p.offset))
                .collect();
            format!("writing {}", listed.join(", "))
        };
        let generation = self.lock().generation;
        if let [p] = pieces {
            // A retry of a run whose answer was lost, sent again with more
            // bytes appended since, meets its own shorter object under the
            // same name: that object is kept as the run's start and the
            // rest goes on as the next run.
            let (mut at, mut bytes) = (p.offset, bytes_of(p));
            while !bytes.is_empty() {
                let object = self.key(&layout::run_name(p.id, at, generation));
                let len =
                    match self
                        .runtime
                        .block_on(self.put(&object, bytes.clone(), PutMode::Create))
                    {
                        Ok(_) => bytes.len(),
                        Err(
                            e @ (object_store::Error::AlreadyExists { .. }
                            | object_store::Error::Precondition { .. }),
                        ) => match self.own_shorter_attempt(&object, &bytes) {
                            Some(n) => n,
                            None => return Err(self.error(&what(), e)),
                        },
                        Err(e) => return Err(self.error(&what(), e)),
                    };
                if let Some(seg) = self.lock().segments.get_mut(&p.id) {
                    seg.own.insert(object.clone());
                    let run = Run {
                        len: len as u64,
                        object,
                        base: 0,
                    };
                    seg.runs.insert(at, run);
                }
                at += len as u64;
                bytes = bytes.slice(len..);
            }
            return Ok(());
        }
        self.announce_layout_2()?;
        let name: Arc<str> = layout::pack_name(pieces, generation).into();
        let object = self.key(&name);
        let mut body = Vec::with_capacity(pieces.iter().map(|p| p.len as usize).sum());
        for p in pieces {
            body.extend_from_slice(&bytes_of(p));
        }
        self.runtime
            .block_on(self.put(&object, Bytes::from(body), PutMode::Create))
            .map_err(|e| self.error(&what(), e))?;
        let mut state = self.lock();
        let state = &mut *state;
        let mut base = 0;
        for p in pieces {
            if let Some(seg) = state.segments.get_mut(&p.id) {
                let run = Run {
                    len: p.len,
                    object: object.clone(),
                    base,
                };
                seg.runs.insert(p.offset, run);
            }
            base += p.len;
        }
        state.add_pack(name, pieces.to_vec());
        Ok(())
    }

    /// The length of the object at `key` when it holds a non-empty strict
    /// prefix of `bytes` (our own earlier attempt, cut short by a lost
    /// answer); `None` when it holds anything else (another writer's).
    fn own_shorter_attempt(&self, key: &ObjectPath, bytes: &Bytes) -> Option<usize> {
        let got = self.runtime.block_on(async {
            let r = self.store.get(key).await?;
            r.bytes().await
        });
        let got = got.ok()?;
        (!got.is_empty() && got.len() < bytes.len() && bytes.starts_with(&got)).then_some(got.len())
    }

    /// Makes sure the superblocks object announces layout 2 before the
    /// first pack is written, so that a version that knows only runs
    /// refuses the store instead of missing the packed bytes.
    fn announce_layout_2(&self) -> io::Result<()> {
        if self.lock().layout_2 {
            return Ok(());
        }
        if self.lock().head.is_none() {
            self.read_superblock(Slot::A)?;
        }
        let head = self.lock().head.clone().expect("just read");
        if head.etag.is_some() && head.layout == LAYOUT_1 {
            self.put_head(head)?;
        }
        self.lock().layout_2 = true;
        Ok(())
    }

    /// Writes `next` (slots as they should be) over the superblocks object
    /// this process last saw, conditionally: fenced against any other writer.
    pub(crate) fn put_head(&self, mut next: Head) -> io::Result<()> {
        let mode = match next.etag.take() {
            None => PutMode::Create,
            Some(e_tag) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let key = self.head_key();
        let result = self
            .runtime
            .block_on(self.put(&key, Bytes::from(next.encode()), mode));
        match result {
            Ok(etag) => {
                next.etag = match etag {
                    Some(e) => Some(e),
                    None => self.fetch_head()?.etag,
                };
                next.layout = if next.generation == 0 { LAYOUT_2 } else { LAYOUT_3 };
                self.lock().head = Some(next);
                Ok(())
            }
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{}: the superblocks were written by another process since this one read them: the store is in use elsewhere ({e})",
                    self.location
                ),
            )),
            Err(e) => Err(self.error("writing the superblocks", e)),
        }
    }

    /// Writes the seal of `generation`: each segment's end, the spans of
    /// its bytes each generation wrote (from the runs just loaded) and the
    /// gone list, as this writer found them under the lock. Loads trust
    /// objects of older generations only within it.
    pub(crate) fn write_seal(&self, generation: u64) -> io::Result<()> {
        let body = {
            let state = self.lock();
            let ends = state.segments.iter().map(|(&id, s)| (id, s.len()));
            let mut spans: Vec<(SegmentId, layout::Span)> = Vec::new();
            for (&id, seg) in &state.segments {
                for (&at, run) in &seg.runs {
                    let written_by = self.generation_of(&run.object);
                    match spans.last_mut() {
                        Some((last, s))
                            if *last == id && s.generation == written_by && s.end == at =>
                        {
                            s.end = at + run.len
                        }
                        _ => spans.push((
                            id,
                            layout::Span {
                                generation: written_by,
                                start: at,
                                end: at + run.len,
                            },
                        )),
                    }
                }
            }
            layout::encode_seal(ends, spans, state.gone.iter().copied())
        };
        let key = self.key(&layout::seal_name(generation));
        self.runtime
            .block_on(self.put(&key, Bytes::from(body), PutMode::Overwrite))
            .map_err(|e| self.error("writing the seal of this writer's generation", e))?;
        Ok(())
    }

    /// A writer's tidying at open: deletes what a crash in the middle of a
    /// segment deletion left (packs whose every segment is gone, run
    /// objects of gone segments) and what earlier generations left outside
    /// the seal, then shortens the gone list.
    /// Best effort: what fails stays for the next opening.
    pub(crate) fn tidy(&self) {
        let (packs, mut doomed) = {
            let mut state = self.lock();
            let packs: Vec<Arc<str>> = state
                .packs
                .iter()
                .filter(|(_, pieces)| pieces.iter().all(|p| !state.segments.contains_key(&p.id)))
                .map(|(name, _)| name.clone())
                .collect();
            (packs, std::mem::take(&mut state.stale))
        };
        doomed.extend(packs.iter().map(|n| self.key(n)));
        if self.delete_objects(doomed).is_ok() {
            self.forget_packs(&packs);
            let _ = self.prune_gone();
        }
    }

    /// Deletes objects, many at once; one already gone is no error.
    fn delete_objects(&self, keys: Vec<ObjectPath>) -> Result<(), object_store::Error> {
        self.runtime
            .block_on(futures::future::try_join_all(keys.iter().map(
                |k| async move {
                    match self.store.delete(k).await {
                        Err(object_store::Error::NotFound { .. }) => Ok(()),
                        other => other,
                    }
                },
            )))
            .map(|_| ())
    }

    /// Forgets deleted packs.
    fn forget_packs(&self, deleted: &[Arc<str>]) {
        let mut state = self.lock();
        let state = &mut *state;
        for name in deleted {
            for p in state.packs.remove(name).unwrap_or_default() {
                if let Some(refs) = state.pack_refs.get_mut(&p.id) {
                    refs.remove(name);
                    if refs.is_empty() {
                        state.pack_refs.remove(&p.id);
                    }
                }
            }
        }
    }

    /// Replaces the gone list (one PUT; the writer alone writes it, stamped
    /// with its generation: a load trusts only the current generation's
    /// list, the seal's otherwise). Conditional on the version this process
    /// last read or wrote: a taken-over holder's late write would otherwise
    /// replace the list of the holder that took over, and the deletions
    /// that holder made after its seal would come back at the next open
    /// (the seal's list counting instead). A version written since by an
    /// older generation (such a late write, ignored by every load since)
    /// or by this one (an attempt whose answer was lost) is replaced; one
    /// by a later generation means this writer was taken over: `WouldBlock`.
    fn write_gone(&self, ids: BTreeSet<SegmentId>) -> io::Result<()> {
        let key = self.key(layout::GONE);
        let generation = self.lock().generation;
        let body = Bytes::from(layout::encode_gone(ids.iter().copied(), generation));
        let what = "writing the list of deleted segments";
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mode = match self.lock().gone_etag.clone() {
                None => PutMode::Create,
                Some(e_tag) => PutMode::Update(UpdateVersion {
                    e_tag: Some(e_tag),
                    version: None,
                }),
            };
            match self.runtime.block_on(self.put(&key, body.clone(), mode)) {
                Ok(etag) => {
                    let mut state = self.lock();
                    state.gone_etag = etag;
                    state.gone = ids;
                    return Ok(());
                }
                Err(
                    e @ (object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. }),
                ) if attempts < 4 => {
                    let now = self.get_optional(&key).map_err(|e| self.error(what, e))?;
                    // `None`: deleted since (created again).
                    let written_by = match &now {
                        None => None,
                        Some((b, _)) => Some(layout::gone_generation(b).ok_or_else(|| {
                            io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "{}: the list of deleted segments is malformed",
                                    self.location
                                ),
                            )
                        })?),
                    };
                    if written_by.is_some_and(|g| g > generation) {
                        return Err(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            format!(
                                "{}: the list of deleted segments was written by a later holder of the store's lock: this process was taken over ({e})",
                                self.location
                            ),
                        ));
                    }
                    self.lock().gone_etag = now.and_then(|(_, etag)| etag);
                }
                Err(e) => return Err(self.error(what, e)),
            }
        }
    }

    /// Drops from the gone list the segments no pack holds a piece of any
    /// more: after those packs were deleted, never before (the list
    /// shortened first would let a listing bring a segment back).
    fn prune_gone(&self) -> io::Result<()> {
        let kept: BTreeSet<SegmentId> = {
            let state = self.lock();
            state
                .gone
                .iter()
                .copied()
                .filter(|id| state.pack_refs.contains_key(id))
                .collect()
        };
        if kept.len() == self.lock().gone.len() {
            return Ok(());
        }
        self.write_gone(kept)
    }

    /// Deletes a segment's objects: its own runs, and every pack whose
    /// other pieces all belong to deleted segments.
    pub(crate) fn delete_segment_objects(&self, id: SegmentId) -> io::Result<()> {
        let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        self.readahead.forget(id);
        // Its own runs go; a pack goes with its last live segment. A pack
        // that stays would list this segment again at the next opening:
        // the gone list, written first, keeps it deleted.
        let (runs, dying, listed_gone) = {
            let state = self.lock();
            let Some(seg) = state.segments.get(&id) else {
                return Ok(());
            };
            let runs: Vec<ObjectPath> = seg.own.iter().cloned().collect();
            let (mut dying, mut staying) = (Vec::new(), false);
            for name in state.pack_refs.get(&id).into_iter().flatten() {
                let others_live = state.packs.get(name).is_some_and(|pieces| {
                    pieces
                        .iter()
                        .any(|p| p.id != id && state.segments.contains_key(&p.id))
                });
                if others_live {
                    staying = true;
                } else {
                    dying.push(name.clone());
                }
            }
            (runs, dying, staying)
        };
        if listed_gone {
            let mut gone = self.lock().gone.clone();
            gone.insert(id);
            self.write_gone(gone)?;
        }
        let mut doomed = runs;
        doomed.extend(dying.iter().map(|n| self.key(n)));
        self.delete_objects(doomed)
            .map_err(|e| self.error(&format!("deleting segment {id}"), e))?;
        {
            let mut state = self.lock();
            if let Some(seg) = state.segments.remove(&id) {
                // Its appends not uploaded yet are dropped with it.
                state.waiting_bytes -= seg.waiting.len();
                state.order.retain(|&(s, _)| s != id);
            }
        }
        self.forget_packs(&dying);
        self.prune_gone()
    }
}

/// Splits the appends waiting (in `order`) into uploads, in order: each
/// carries at most [`PACK_PIECES`] segments, and one segment's bytes in one
/// upload are contiguous. Within one upload order does not matter (a PUT
/// is atomic); between uploads it is kept (they are sent one after the
/// other).
fn plan_uploads(
    order: &[(SegmentId, u64)],
    taken: &BTreeMap<SegmentId, (u64, Bytes)>,
) -> Vec<Vec<Piece>> {
    let mut cursor: BTreeMap<SegmentId, u64> =
        taken.iter().map(|(&id, (at, _))| (id, *at)).collect();
    let mut uploads = Vec::new();
    let mut current: BTreeMap<SegmentId, u64> = BTreeMap::new();
    let close = |current: &mut BTreeMap<SegmentId, u64>,
                 cursor: &mut BTreeMap<SegmentId, u64>,
                 uploads: &mut Vec<Vec<Piece>>| {
        let pieces: Vec<Piece> = current
            .iter()
            .filter_map(|(&id, &end)| {
                let from = cursor.insert(id, end)?;
                (end > from).then_some(Piece {
                    id,
                    offset: from,
                    len: end - from,
                })
            })
            .collect();
        if !pieces.is_empty() {
            uploads.push(pieces);
        }
        current.clear();
    };
    // Every segment's whole waiting range comes last, in case the order
    // missed an append (it cannot; a no-op then).
    let ends = taken
        .iter()
        .map(|(&id, (at, bytes))| (id, at + bytes.len() as u64));
    for (id, end) in order.iter().copied().chain(ends) {
        let Some(&from) = cursor.get(&id) else {
            continue;
        };
        if end <= from && !current.contains_key(&id) {
            continue;
        }
        if !current.contains_key(&id) && current.len() == PACK_PIECES {
            close(&mut current, &mut cursor, &mut uploads);
        }
        let e = current.entry(id).or_insert(end);
        *e = (*e).max(end);
    }
    close(&mut current, &mut cursor, &mut uploads);
    uploads
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After each upload of a plan, what is durable must be exactly what
    /// some prefix of the appends made: the promise of `keeps_append_order`.
    #[test]
    fn uploads_keep_append_order_whatever_the_interleaving() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let segments = 1 + rand(20) as u32;
            let mut ends: BTreeMap<SegmentId, u64> = BTreeMap::new();
            let mut appends = Vec::new();
            for _ in 0..1 + rand(60) {
                let id = rand(u64::from(segments)) as u32;
                let end = ends.entry(id).or_insert(0);
                *end += 1 + rand(5);
                appends.push((id, *end));
            }
            let mut order: Vec<(SegmentId, u64)> = Vec::new();
            for &(id, end) in &appends {
                match order.last_mut() {
                    Some((last, e)) if *last == id => *e = end,
                    _ => order.push((id, end)),
                }
            }
            let taken: BTreeMap<SegmentId, (u64, Bytes)> = ends
                .iter()
                .map(|(&id, &end)| (id, (0, Bytes::from(vec![0u8; end as usize]))))
                .collect();
            let uploads = plan_uploads(&order, &taken);
            let mut durable: BTreeMap<SegmentId, u64> = BTreeMap::new();
            for pieces in &uploads {
                assert!(pieces.len() <= PACK_PIECES);
                for p in pieces {
                    let at = durable.entry(p.id).or_insert(0);
                    assert_eq!(*at, p.offset, "pieces of a segment are contiguous");
                    *at += p.len;
                }
                // Some prefix of the appends gives exactly `durable`.
                let is_prefix = (0..=appends.len()).any(|n| {
                    let mut state: BTreeMap<SegmentId, u64> = BTreeMap::new();
                    for &(id, end) in &appends[..n] {
                        state.insert(id, end);
                    }
                    state == durable
                });
                assert!(
                    is_prefix,
                    "after an upload: {durable:?} is no prefix of {appends:?}"
                );
            }
            assert_eq!(durable, ends, "everything uploaded");
        }
    }
}
