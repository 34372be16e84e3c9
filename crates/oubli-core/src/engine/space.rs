//! Room on the medium: the reserve kept for deletes, commits, the cleaner and opening, and the check that refuses new data once only the reserve remains (DESIGN §7, "A full medium").

use super::*;

/// The reserve is 1/32 of the medium (ZFS's slop space, `spa_slop_shift`
/// 5) ...
const RESERVE_SHIFT: u32 = 5;
/// ... but at least this much (or an eighth of a smaller medium): a
/// commit that deletes thousands of files (its tree nodes and frame), the
/// next log's megabyte the medium prepares, two superblocks, and a
/// cleaner slice with room to spare.
const RESERVE_MIN: u64 = 8 << 20;
/// ... and at most this much: the worst a commit, the cleaner and an open
/// need together — the changed tree nodes a commit writes
/// ([`Options::dirty_tree_bytes`], 64 MiB), one data segment the cleaner
/// copies forward (64 MiB), the log prepared ahead and the superblocks.
const RESERVE_MAX: u64 = 160 << 20;
/// How long a measurement of the medium's free space stands while writes
/// are admitted against it (other programs share the file system).
const RECHECK: Duration = Duration::from_secs(1);

/// The reserve on a medium of `total` bytes.
pub fn reserve_for(total: u64) -> u64 {
    (total >> RESERVE_SHIFT)
        .max(RESERVE_MIN.min(total / 8))
        .min(RESERVE_MAX)
}

/// How large data segments grow on `medium`: [`DATA_SEGMENT_TARGET`],
/// but at most 1/64 of a medium smaller than 4 GiB (at least 1 MiB). The
/// cleaner frees space a segment at a time and copies a segment's live
/// part forward first, into the reserve: on a 64 MiB disk, where the
/// reserve is 8 MiB, one 64 MiB segment holding all the data could never
/// be cleaned (f2fs's segments are 2 MiB for the same reason).
///
/// A medium whose segments are fixed slots no larger than the target (a
/// file or block device, raw NAND) keeps them whole: its free space comes
/// in slots, so a smaller segment would only waste the rest of its slot
/// (choose small slots for a small device).
pub(super) fn segment_target(medium: &dyn Medium) -> u64 {
    let capacity = medium.segment_capacity();
    if capacity <= DATA_SEGMENT_TARGET {
        return capacity;
    }
    let most = DATA_SEGMENT_TARGET;
    match medium.space() {
        Ok(Some(s)) => most.min((s.total / 64).max(1 << 20)),
        _ => most,
    }
}

/// Bytes a write of `n` bytes may take on the medium: the sealing
/// overhead of its cells (tags, nonces; under 1/64 at the smallest cell)
/// and a share of a tree node.
fn charge(n: u64) -> u64 {
    n + n / 64 + 512
}

/// The medium's room as the engine sees it ([`Store::space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceInfo {
    /// The medium's size.
    pub total: u64,
    /// What appends may still take.
    pub free: u64,
    /// Kept for deletes, commits, the cleaner and opening: new data is
    /// refused once only this is left.
    pub reserve: u64,
    /// What new data may still take: free, less the reserve and what the
    /// write buffer holds.
    pub available: u64,
}

impl SpaceInfo {
    /// Whether `status` warns: less than the reserve, or a tenth of the
    /// medium if that is more, is left for data.
    pub fn nearly_full(&self) -> bool {
        self.available < self.reserve.max(self.total / 10)
    }
}

/// What the engine last learned of the medium's room.
#[derive(Debug, Default)]
pub(super) struct SpaceGauge {
    /// When the medium was last asked (`None`: never, or a commit or the
    /// cleaner changed it since).
    checked: Option<Instant>,
    /// What writes may still take before the medium is asked again.
    headroom: u64,
    /// The last answer, if the medium can tell.
    last: Option<SpaceInfo>,
}

impl SpaceGauge {
    /// Asks the medium again before the next write (space was freed or
    /// taken by something the gauge does not count).
    pub(super) fn stale(&mut self) {
        self.checked = None;
    }

    /// Whether the last measure found the medium nearly full (the
    /// cleaner then runs for any dead space, not only past its policy).
    pub(super) fn short(&self) -> bool {
        self.last.is_some_and(|s| s.nearly_full())
    }
}

impl Store {
    /// The medium's size, free space and reserve, measured now (`None`
    /// when the medium cannot tell).
    pub fn space(&self) -> Result<Option<SpaceInfo>> {
        let mut e = self.lock_beside_commit();
        e.measure_space()?;
        Ok(e.space.last)
    }
}

impl Engine {
    /// The medium's room now, as [`SpaceInfo`] (`None`: it cannot tell).
    pub(super) fn space_now(&self) -> Result<Option<SpaceInfo>> {
        let space = self
            .ctx
            .medium
            .space()
            .map_err(|e| Error::io("asking the medium for its free space", e))?;
        Ok(space.map(|space| {
            let reserve = reserve_for(space.total);
            // The write buffer is accepted but not on the medium yet: it will be.
            let buffered = charge(self.dirty_bytes as u64);
            SpaceInfo {
                total: space.total,
                free: space.free,
                reserve,
                available: space.free.saturating_sub(reserve).saturating_sub(buffered),
            }
        }))
    }

    /// Asks the medium for its room; sets the headroom writes may take.
    pub(super) fn measure_space(&mut self) -> Result<()> {
        let space = self.space_now()?;
        self.space.checked = Some(Instant::now());
        self.space.headroom = space.map_or(u64::MAX, |s| s.available);
        self.space.last = space;
        Ok(())
    }

    /// Admits a write of `n` new bytes, or refuses it with `NoSpace`
    /// (nothing changed) when only the reserve would be left. Deletes,
    /// commits, the cleaner and opening never ask: the reserve is theirs.
    pub(super) fn admit(&mut self, n: u64) -> Result<()> {
        let need = charge(n);
        let fresh = self.space.checked.is_some_and(|t| t.elapsed() < RECHECK);
        // A medium that cannot say lets the write go to it: its own
        // error, if any, comes with the write.
        if (!fresh || self.space.headroom < need) && self.measure_space().is_err() {
            self.space.headroom = u64::MAX;
        }
        if self.space.headroom < need {
            let (reserve, left) = self.space.last.map_or((0, 0), |s| (s.reserve, s.available));
            return Err(Error::NoSpace(format!(
                "{}: a write of {n} bytes does not fit in the {left} bytes left for data; \
                 the last {reserve} bytes are kept for deleting, committing and cleaning",
                self.ctx.medium.describe(),
            )));
        }
        self.space.headroom -= need;
        Ok(())
    }

    /// On a nearly full medium, starts a cleaner run at once after a
    /// commit asked for (`oubli rm` then `oubli commit`, TRIM then a
    /// commit), not at the next commit of the policy: what a deletion
    /// freed comes back only through the cleaner, and writes wait for it.
    pub(super) fn clean_if_short(&mut self) {
        if self.cleaning.is_some() || self.writable().is_err() || self.measure_space().is_err() {
            return;
        }
        if self.space.short() && self.clean_due() {
            let start = self.trace_start();
            let live = start.segment_usage(&self.ctx);
            self.start_traced_run(start, live);
        }
    }

    /// The most the cleaner may copy before its commit: the free space
    /// (the reserve included, which is there for it) less a quarter of
    /// the reserve for the commit itself. `u64::MAX` when unknown.
    pub(super) fn cleaner_room(&mut self) -> u64 {
        if self.measure_space().is_err() {
            return u64::MAX;
        }
        match self.space.last {
            Some(s) => s.free.saturating_sub(s.reserve / 4),
            None => u64::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_sizes() {
        // A small disk: an eighth, so that most of it still takes data.
        assert_eq!(reserve_for(48 << 20), 6 << 20);
        // The floor, then 1/32, then the ceiling.
        assert_eq!(reserve_for(128 << 20), 8 << 20);
        assert_eq!(reserve_for(1 << 30), 32 << 20);
        assert_eq!(reserve_for(1 << 40), 160 << 20);
    }
}
