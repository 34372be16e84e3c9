//! Snapshot retention for long-running processes: automatic snapshots every so often, the oldest dropped beyond a count, expired ones removed.

use oubli_core::{Result, Store};
use std::time::Duration;

/// Names of automatic snapshots start with this (then the UTC time).
pub const AUTO_PREFIX: &str = "auto-";

/// What a mount or server does with snapshots on its timer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// Take an automatic snapshot when the newest one is this old.
    pub every: Option<Duration>,
    /// Keep at most this many automatic snapshots (the oldest go first).
    pub keep: Option<usize>,
    /// A snapshot never removed here (the one this process serves: its
    /// clients read through a view that holds its keys).
    pub protected: Option<String>,
}

/// One thing [`tick`] did, for the process's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Created(String),
    Expired(String),
    Dropped(String),
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Created(n) => write!(f, "took snapshot {n}"),
            Event::Expired(n) => write!(f, "removed expired snapshot {n}"),
            Event::Dropped(n) => write!(f, "removed snapshot {n} (beyond --snapshot-keep)"),
        }
    }
}

/// `YYYYMMDD-HHMMSS` in UTC.
fn stamp(secs: u64) -> String {
    let t = crate::clock::utc(secs);
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// Removes expired snapshots, takes an automatic snapshot when `every` has
/// passed since the newest automatic one, and drops the oldest automatic
/// ones beyond `keep`. Removal is erasure at the next commit, as always.
pub fn tick(store: &Store, retention: &Retention, now: u64) -> Result<Vec<Event>> {
    let removable = |name: &str| retention.protected.as_deref() != Some(name);
    let mut events = Vec::new();
    for s in store.snapshots() {
        if s.expires_at.is_some_and(|t| t <= now) && removable(&s.name) {
            store.snapshot_remove(&s.name)?;
            events.push(Event::Expired(s.name));
        }
    }
    let automatic = |store: &Store| {
        let mut list: Vec<_> = store
            .snapshots()
            .into_iter()
            .filter(|s| s.name.starts_with(AUTO_PREFIX))
            .collect();
        list.sort_by_key(|s| (s.created_at, s.name.clone()));
        list
    };
    if let Some(every) = retention.every {
        let newest = automatic(store).last().map(|s| s.created_at);
        if newest.is_none_or(|t| now.saturating_sub(t) >= every.as_secs()) {
            let mut name = format!("{AUTO_PREFIX}{}", stamp(now));
            let taken: Vec<String> = store.snapshots().into_iter().map(|s| s.name).collect();
            let mut n = 1;
            while taken.contains(&name) {
                n += 1;
                name = format!("{AUTO_PREFIX}{}-{n}", stamp(now));
            }
            store.snapshot_create(&name, None)?;
            events.push(Event::Created(name));
        }
    }
    if let Some(keep) = retention.keep {
        let list = automatic(store);
        let list: Vec<_> = list.iter().filter(|s| removable(&s.name)).collect();
        for old in list.iter().take(list.len().saturating_sub(keep)) {
            store.snapshot_remove(&old.name)?;
            events.push(Event::Dropped(old.name.clone()));
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_dates() {
        assert_eq!(stamp(0), "19700101-000000");
        assert_eq!(stamp(1_795_000_000), "20261118-110640");
        assert_eq!(stamp(951_782_400), "20000229-000000");
    }
}
