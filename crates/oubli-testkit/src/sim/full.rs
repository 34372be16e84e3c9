//! The simulator's full medium: filled by the store's own writes (the reserve holds: deleting and committing must work) or by another program (the space comes back when that program's file goes).

use super::*;

/// Who filled the medium.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FilledBy {
    /// The store's own writes: the medium's size is set with room for the
    /// store's reserve ([`oubli_core::reserve_for`]) and the store measures
    /// it at once, as a store on a disk of that size always knows it. New
    /// data is refused once only the reserve is left; deleting, committing,
    /// the cleaner and opening take the reserve and must work.
    Store,
    /// Another program on the same file system took the space, reserve and
    /// all, without the store knowing: any append may fail. The user frees
    /// that program's file, and everything resumes on the same handle.
    Other,
}

impl FilledBy {
    pub(super) fn kind(self) -> &'static str {
        match self {
            FilledBy::Store => "medium filled by the store",
            FilledBy::Other => "medium filled by another program",
        }
    }
}

/// The disk a store fills itself on: 64 test segments.
const STORE_DISK: u64 = 64 * harness::TEST_SEGMENT;

/// The smallest medium on which a store holding `held` bytes has `room`
/// bytes for new data besides its reserve.
fn size_with_reserve(held: u64, room: u64) -> u64 {
    let mut total = held + room;
    while total < held + room + oubli_core::reserve_for(total) {
        total = held + room + oubli_core::reserve_for(total);
    }
    total
}

impl Sim {
    /// Arms the full medium for step `i`: one seed-chosen way to fill it.
    pub(super) fn fill_medium(&mut self, i: usize) {
        let used = self.medium.used();
        let by = if self.rng.coin() {
            FilledBy::Store
        } else {
            FilledBy::Other
        };
        let room = match by {
            FilledBy::Store => (1 + self.rng.below(4)) * harness::TEST_SEGMENT / 2,
            // Every free byte, or up to half a segment more.
            FilledBy::Other => self.rng.below(3) * harness::TEST_SEGMENT / 4,
        };
        let (capacity, total) = match by {
            // A disk of 64 segments or more (data segments are at most
            // 1/64 of a medium, DESIGN §7), of which another program holds
            // all but what the store holds, `room` and the store's
            // reserve: on a disk of a few segments the reserve (an eighth)
            // would not hold the one segment the cleaner copies forward.
            FilledBy::Store => {
                let total = STORE_DISK.max(size_with_reserve(used, room));
                (used + room + oubli_core::reserve_for(total), total)
            }
            FilledBy::Other => (used + room, 0),
        };
        self.medium.set_total(total);
        self.medium.set_capacity(capacity);
        self.filled_by = Some(by);
        if by == FilledBy::Store {
            // The store learns its medium's size now (as it would have
            // from the start on a disk this size): admission keeps the
            // reserve from here on.
            let _ = self.store().space();
        }
        self.note_fault(
            by.kind(),
            format!(
                "#{i} the medium fills at {capacity} bytes ({used} used), {}",
                by.kind()
            ),
        );
    }

    /// Who filled the medium, while it is full.
    pub(super) fn full_by(&self) -> Option<FilledBy> {
        if self.medium.capacity() == u64::MAX {
            return None;
        }
        self.filled_by
    }

    /// The other program frees its file: the capacity is lifted.
    fn free_the_other_file(&mut self, i: usize) {
        self.medium.set_capacity(u64::MAX);
        self.filled_by = None;
        self.note(format!(
            "#{i} the other program's file is deleted: the space is back"
        ));
    }

    /// A step found the medium full (`e`): what the user does then.
    pub(super) fn make_room(&mut self, i: usize, e: &Error) -> Result<(), String> {
        match self.full_by() {
            Some(FilledBy::Other) => self.make_room_outside(i, e),
            _ => self.make_room_inside(i, e),
        }
    }

    /// Another program filled the medium: deleting still works (a commit
    /// may answer `NoSpace`, having changed nothing), and once that
    /// program's file is gone, the flush and a commit on the same handle
    /// must work and everything acknowledged is there.
    fn make_room_outside(&mut self, i: usize, e: &Error) -> Result<(), String> {
        self.note(format!(
            "#{i} the medium is full ({e}), filled by another program: deleting an object, then freeing that program's file"
        ));
        let store = self.store();
        let full = |what: &str, e2: Error| {
            format!("step #{i} found the medium full ({e}), filled by another program; then {what} failed: {e2}")
        };
        let victim = self
            .runner
            .model
            .objects
            .keys()
            .copied()
            .find(|&o| o != ROOT_DIR && !self.runner.model.destroyed.contains(&o));
        if let Some(oid) = victim {
            match store.delete(oid) {
                Ok(()) => {
                    self.runner.model.objects.remove(&oid);
                }
                // A store opened on this medium waits for the commit its
                // open could not make: changes answer NoSpace, having
                // changed nothing (the model check below).
                Err(e2) if is_full(&e2) => self.note(format!(
                    "#{i} deleting object {oid} on the full medium: {e2}"
                )),
                Err(e2) => return Err(full(&format!("deleting object {oid}"), e2)),
            }
        }
        match store.commit() {
            Ok(()) => {
                self.acknowledge_commit();
                self.check_adversary("after a commit on a medium another program filled")?;
            }
            Err(e2) if is_full(&e2) => {
                self.note(format!("#{i} the commit on the full medium: {e2}"))
            }
            Err(e2) => return Err(full("a commit on the full medium", e2)),
        }
        self.check_model("after deleting on a medium another program filled")?;
        self.free_the_other_file(i);
        store
            .flush()
            .map_err(|e2| full("the flush once the space was back", e2))?;
        self.runner.acked = self.runner.model.clone();
        store
            .commit()
            .map_err(|e2| full("the commit once the space was back", e2))?;
        self.acknowledge_commit();
        self.check_model("after the space came back")?;
        self.check_adversary("after the space came back")
    }

    /// The store filled the medium itself: every snapshot and every object
    /// go, then a commit and the cleaner, each inside the reserve; then new
    /// data must fit again.
    fn make_room_inside(&mut self, i: usize, e: &Error) -> Result<(), String> {
        self.note(format!(
            "#{i} the medium is full ({e}): deleting to make room"
        ));
        let store = self.store();
        let full = |what: String, e2: Error| {
            format!("step #{i} found the medium full ({e}); then {what} failed: {e2}")
        };
        let names: Vec<String> = self.runner.model.snapshots.keys().cloned().collect();
        for name in names {
            store
                .snapshot_remove(&name)
                .map_err(|e2| full(format!("removing snapshot {name}"), e2))?;
            self.runner.model.snapshots.remove(&name);
        }
        let objects: Vec<u64> = self.runner.model.objects.keys().copied().collect();
        for oid in objects.into_iter().filter(|&o| o != ROOT_DIR) {
            store
                .delete(oid)
                .map_err(|e2| full(format!("deleting object {oid}"), e2))?;
            self.runner.model.objects.remove(&oid);
        }
        store.commit().map_err(|e2| full("the commit".into(), e2))?;
        self.acknowledge_commit();
        store.gc(0.5).map_err(|e2| full("the cleaner".into(), e2))?;
        self.acknowledge_commit();
        self.check_model("after making room")?;
        self.check_adversary("after making room")?;
        // New data may still not fit (what the store keeps for itself can
        // exceed so small a medium, and it measures the room at most about
        // once a second), but the store must say so and stay usable.
        let data = self.own_data(harness::TEST_CELL as usize);
        let wrote = store.create_object(b"").and_then(|oid| {
            self.runner.model.objects.insert(oid, Vec::new());
            store.write(oid, 0, &data).map(|()| oid)
        });
        match wrote {
            Ok(oid) => self.runner.model.write(oid, 0, &data),
            Err(e2) if is_full(&e2) => {
                self.note(format!("#{i} still full after making room: {e2}"))
            }
            Err(e2) => return Err(full("writing one cell after making room".into(), e2)),
        }
        store
            .flush()
            .map_err(|e2| full("a flush after making room".into(), e2))?;
        self.runner.acked = self.runner.model.clone();
        self.medium.set_capacity(u64::MAX);
        self.filled_by = None;
        self.note(format!("#{i} room made; the capacity is lifted"));
        self.check_model("after writing on the emptied medium")
    }

    /// The flush before a clean reopen found the medium full: only when
    /// another program filled it (what the store admitted has the reserve
    /// to go to); the user frees that file and flushes again.
    pub(super) fn flush_when_full(&mut self, store: &Store, e: Error) -> Result<(), String> {
        if self.full_by() != Some(FilledBy::Other) || !is_full(&e) {
            return Err(format!("the flush before a reopen failed: {e}"));
        }
        self.note(format!("the flush before a reopen: {e}"));
        self.free_the_other_file(self.steps);
        store
            .flush()
            .map_err(|e2| format!("the flush before a reopen found the medium full ({e}); once the space was back it failed again: {e2}"))
    }

    /// Opening found the medium full: only when another program filled
    /// it (opening may take the reserve); the user frees that file and
    /// opens again.
    pub(super) fn open_when_full(&mut self, e: Error) -> Result<Store, String> {
        if self.full_by() != Some(FilledBy::Other) || !is_full(&e) {
            return Err(format!("the store does not reopen: {e}"));
        }
        self.note(format!("opening on the full medium: {e}"));
        self.free_the_other_file(self.steps);
        Store::open(
            self.medium.clone() as Arc<dyn Medium>,
            self.vault.clone(),
            self.options.clone(),
        )
        .map_err(|e2| format!("the store does not reopen on a medium another program filled ({e}); once the space was back it failed again: {e2}"))
    }
}

#[cfg(test)]
mod tests {
    use super::size_with_reserve;

    #[test]
    fn a_medium_sized_with_reserve_leaves_the_room_besides_it() {
        for (held, room) in [(0, 1), (3 << 20, 128 << 10), (900 << 20, 1 << 20)] {
            let total = size_with_reserve(held, room);
            assert!(total - held - oubli_core::reserve_for(total) >= room);
        }
    }
}
