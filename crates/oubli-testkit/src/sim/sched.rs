//! A controlled schedule for the engine's threads: real engine calls run as logical threads that take turns at the seams (seals, medium and vault calls), switching where the seed says.
//!
//! A scheduled step ([`Sim::sched_step`]) runs a large write (whose cells
//! are sealed outside the engine lock) beside one or two of: a commit (the
//! function `Store::commit` and the committer thread share), the timer's
//! policy commit (`Store::tick` under a policy that wants one: the
//! committer thread's `policy_commit`), the cleaner (`Store::gc`), key
//! consolidation, a flush, a share placement or a cell-size choice on the
//! object being written, and a small write elsewhere. Each runs on an OS
//! thread of its own, but only the thread holding the token runs: every
//! seam call ([`point`]: each seal, each medium call, each vault call) is
//! a place where the holder may hand the token on. The hand-overs follow
//! PCT (Burckhardt et al., "A randomized scheduler with probabilistic
//! guarantees of finding bugs", 2010): each thread has a seeded priority,
//! the highest runnable one runs, and at a few seeded seam counts the
//! holder's priority drops below every other's.
//!
//! Why not `shuttle`: it schedules only threads, locks and condition
//! variables of its own (`shuttle::sync`, `shuttle::thread`), run one at a
//! time on its executor. The engine takes `std::sync` locks and waits on
//! std condition variables (the engine lock, the commit-landed and
//! commit-wanted condvars, the reclaimer's queue, the I/O guard), and
//! spawns its committer and reclaimer with `std::thread`: under shuttle, a
//! thread blocked on one of those blocks the executor, and nothing would
//! switch. Replacing them would mean building the engine against a
//! different `sync` for the simulator.
//!
//! The same limit applies here, and is met by looking: a thread handed the
//! token may block on an engine lock or condvar that a parked thread holds
//! (the token holder never reaches a seam). The parked threads watch the
//! holder's state in `/proc` (Linux): a holder asleep in the kernel while
//! not parked here for [`BLOCKED_AFTER`] is blocked, and the token goes to
//! the next runnable thread; the blocked one parks at its next seam once
//! it wakes. So the hand-overs are the seed's; what is left to the OS is
//! only which of two threads gets a lock first after such a block, and
//! a holder asleep on something short (a lock the reclaimer holds for a
//! moment) taken for blocked. The engine's own threads (the reclaimer) are
//! not scheduled: a seam call from a thread that is not a logical thread
//! goes straight through.

use super::{outcome, Sim};
use crate::marker::BLOCK;
use oubli_core::{EpochPolicy, ROOT_DIR};
use oubli_media::SplitMix64;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long the token holder must be seen asleep outside the scheduler
/// before it counts as blocked (on a lock or condvar another logical
/// thread holds) and the token moves on.
const BLOCKED_AFTER: Duration = Duration::from_millis(4);
/// How often parked threads look at the holder.
const POLL: Duration = Duration::from_millis(1);
/// Seam calls a scheduled step makes, about: the range the PCT change
/// points are drawn from.
const POINTS_RANGE: u64 = 24;

thread_local! {
    /// The schedule and the logical thread this OS thread runs, if any.
    static CURRENT: RefCell<Option<(Arc<Schedule>, usize)>> = const { RefCell::new(None) };
}

/// A seam call (a seal, a medium or vault call): the calling logical
/// thread, if it is one, may hand the token on here, and waits until it
/// holds it again. Other threads go straight through.
pub fn point(kind: &'static str) {
    let current = CURRENT.with(|c| c.borrow().clone());
    if let Some((schedule, me)) = current {
        schedule.point(me, kind);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Waiting for the token (at a seam, or not started).
    Parked,
    /// Holds the token and runs.
    Running,
    /// Was given the token and blocked outside the scheduler.
    Blocked,
    Done,
}

struct Thread {
    name: &'static str,
    status: Status,
    priority: i64,
    /// Its kernel task id, to read its state in /proc.
    tid: Option<u32>,
    /// The seam it is parked at (or last passed).
    at: &'static str,
}

struct State {
    threads: Vec<Thread>,
    holder: Option<usize>,
    /// Threads that have started (and parked at their start).
    started: usize,
    /// Seam calls the holders made.
    points: u64,
    /// The seam counts at which the holder's priority drops.
    change_at: Vec<u64>,
    lowest: i64,
    /// Since when the holder has been seen asleep outside the scheduler.
    asleep_since: Option<Instant>,
    /// What happened, in order: hand-overs and blocks.
    events: Vec<String>,
    /// Fault-count kinds of the races reached.
    kinds: Vec<&'static str>,
}

struct Schedule {
    state: Mutex<State>,
    turn: Condvar,
}

impl Schedule {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn point(&self, me: usize, kind: &'static str) {
        let mut s = self.lock();
        s.threads[me].at = kind;
        if s.holder == Some(me) {
            s = self.let_woken_settle(s);
            s.points += 1;
            if s.change_at.contains(&s.points) {
                s.lowest -= 1;
                s.threads[me].priority = s.lowest;
            }
            s.threads[me].status = Status::Parked;
            s.hand_over(me);
        } else {
            // It ran on after a block (or took no turn yet): it waits here.
            s.threads[me].status = Status::Parked;
            if s.holder.is_none() {
                s.hand_over(me);
            }
        }
        self.turn.notify_all();
        self.wait_turn(s, me);
    }

    /// Before the holder decides: a thread that blocked and has woken since
    /// (the holder let go of the lock it waited for) runs to its next seam,
    /// or blocks again, before the holder goes on, so that the two do not
    /// run side by side.
    fn let_woken_settle<'a>(&self, mut s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while s
            .threads
            .iter()
            .any(|t| t.status == Status::Blocked && t.tid.is_some_and(running))
        {
            s = self
                .turn
                .wait_timeout(s, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        s
    }

    /// Waits until `me` holds the token, watching whether the holder blocked.
    fn wait_turn(&self, mut s: MutexGuard<'_, State>, me: usize) {
        while s.holder != Some(me) {
            s = self
                .turn
                .wait_timeout(s, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if s.holder_blocked() {
                self.turn.notify_all();
            }
        }
        s.threads[me].status = Status::Running;
    }

    fn done(&self, me: usize) {
        let mut s = self.lock();
        s.threads[me].status = Status::Done;
        s = self.let_woken_settle(s);
        if s.holder == Some(me) {
            s.hand_over(me);
        }
        self.turn.notify_all();
    }
}

impl State {
    /// The highest-priority thread that may run.
    fn pick(&self) -> Option<usize> {
        (0..self.threads.len())
            .filter(|&t| self.threads[t].status == Status::Parked)
            .max_by_key(|&t| self.threads[t].priority)
    }

    /// `from` (parked now, or done) gives the token to whoever should run.
    fn hand_over(&mut self, from: usize) {
        let next = self.pick();
        self.asleep_since = None;
        if let Some(to) = next.filter(|&to| to != from) {
            // Only switches count as races: between two threads that both
            // still have work (the next one taking over at a seam of the
            // last).
            if self.threads[from].status != Status::Done {
                let (a, b, at) = (
                    self.threads[to].name,
                    self.threads[from].name,
                    self.threads[from].at,
                );
                self.events.push(format!("{a} during {b} (at its {at})"));
                self.kinds.push(intern(format!("sched: {a} during {b}")));
            }
        }
        self.holder = next;
    }

    /// Whether the holder is blocked outside the scheduler (then the token
    /// moves on).
    fn holder_blocked(&mut self) -> bool {
        let Some(h) = self.holder else {
            return false;
        };
        if self.threads[h].status != Status::Running {
            return false;
        }
        let asleep = self.threads[h].tid.is_some_and(asleep);
        if !asleep {
            self.asleep_since = None;
            return false;
        }
        let since = *self.asleep_since.get_or_insert_with(Instant::now);
        if since.elapsed() < BLOCKED_AFTER {
            return false;
        }
        self.threads[h].status = Status::Blocked;
        let (name, at) = (self.threads[h].name, self.threads[h].at);
        self.events.push(format!("{name} blocked after its {at}"));
        self.kinds.push("sched: a thread blocked on the engine");
        self.hand_over(h);
        true
    }
}

/// Fault-count kinds are `&'static str`: the few distinct race names are
/// kept once each.
fn intern(name: String) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.get(name.as_str()) {
        return n;
    }
    let n: &'static str = Box::leak(name.into_boxed_str());
    names.insert(n);
    n
}

/// This thread's kernel task id.
fn own_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// Task `tid`'s state as /proc says ('R' running, 'S' asleep, e.g. on a
/// futex: a lock or condvar).
fn task_state(tid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (comm) S ...": the name may hold anything, the state follows
    // its last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
}

fn asleep(tid: u32) -> bool {
    task_state(tid) == Some('S')
}

fn running(tid: u32) -> bool {
    task_state(tid) == Some('R')
}

/// An operation of a scheduled step: its name and what it does; it reports
/// its outcome.
type Op<'a> = (&'static str, Box<dyn FnOnce() -> String + Send + 'a>);

/// What a scheduled run did: each operation's outcome, the events in order
/// and the race kinds reached.
struct Ran {
    outcomes: Vec<String>,
    /// Seam calls the token holders made.
    points: u64,
    events: Vec<String>,
    kinds: Vec<&'static str>,
}

/// Runs `ops` as logical threads under a schedule drawn from `rng`.
fn run(rng: &mut SplitMix64, ops: Vec<Op<'_>>) -> Ran {
    let n = ops.len();
    let depth = 1 + rng.below(3);
    let change_at = (0..depth).map(|_| 1 + rng.below(POINTS_RANGE)).collect();
    let threads = ops
        .iter()
        .map(|(name, _)| Thread {
            name,
            status: Status::Parked,
            // Set below: distinct, a seeded permutation.
            priority: 0,
            tid: None,
            at: "start",
        })
        .collect::<Vec<_>>();
    let schedule = Arc::new(Schedule {
        state: Mutex::new(State {
            threads,
            holder: None,
            started: 0,
            points: 0,
            change_at,
            lowest: 0,
            asleep_since: None,
            events: Vec::new(),
            kinds: Vec::new(),
        }),
        turn: Condvar::new(),
    });
    {
        let mut s = schedule.lock();
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (rank, t) in order.into_iter().enumerate() {
            s.threads[t].priority = (n + rank) as i64;
        }
    }
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = ops
            .into_iter()
            .enumerate()
            .map(|(me, (_, op))| {
                let schedule = schedule.clone();
                scope.spawn(move || {
                    CURRENT.with(|c| *c.borrow_mut() = Some((schedule.clone(), me)));
                    {
                        let mut s = schedule.lock();
                        s.threads[me].tid = own_tid();
                        s.started += 1;
                        if s.started == s.threads.len() {
                            // Everyone is parked at its start: the first turn.
                            s.holder = s.pick();
                            schedule.turn.notify_all();
                        }
                        schedule.wait_turn(s, me);
                    }
                    let report = catch(op);
                    CURRENT.with(|c| c.borrow_mut().take());
                    schedule.done(me);
                    report
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| "panicked".into()))
            .collect()
    });
    let mut s = schedule.lock();
    Ran {
        outcomes,
        points: s.points,
        events: std::mem::take(&mut s.events),
        kinds: std::mem::take(&mut s.kinds),
    }
}

/// A panic in an operation is its outcome (the step then fails), not a
/// panic of the scheduler's thread.
fn catch(op: Box<dyn FnOnce() -> String + Send + '_>) -> String {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(op)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("panic: {what}")
    })
}

/// What runs beside the large write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Beside {
    Commit,
    TimerCommit,
    Cleaner,
    Consolidate,
    Flush,
    SetShare(usize),
    SmallCells,
    Write(u64),
}

impl Beside {
    fn name(self) -> &'static str {
        match self {
            Beside::Commit => "commit",
            Beside::TimerCommit => "policy commit",
            Beside::Cleaner => "cleaner",
            Beside::Consolidate => "key consolidation",
            Beside::Flush => "flush",
            Beside::SetShare(_) => "set-share",
            Beside::SmallCells => "cell-size choice",
            Beside::Write(_) => "small write",
        }
    }

    /// Whether it ends an epoch (the oracle then commits once more,
    /// reported, and asks the adversary).
    fn commits(self) -> bool {
        matches!(self, Beside::Commit | Beside::TimerCommit | Beside::Cleaner)
    }
}

/// What an operation of a scheduled step did to the model.
#[derive(Clone, Copy)]
enum Effect<'a> {
    Write(u64, &'a [u8]),
    /// The new object was placed under share `s`.
    Share(usize),
}

impl Effect<'_> {
    fn apply(self, model: &mut crate::Model, oid: u64) {
        match self {
            Effect::Write(target, data) => model.write(target, 0, data),
            Effect::Share(s) => {
                model.share_of.insert(oid, s);
            }
        }
    }
}

/// Every order of `n` things (n is at most 3 here).
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut o = rest.clone();
            o.insert(at, n - 1);
            out.push(o);
        }
    }
    out
}

impl Sim {
    /// A large write to a new object with one or two other engine calls,
    /// under a seeded schedule; then the oracle.
    pub(super) fn sched_step(&mut self, i: usize) -> Result<(), String> {
        if self.medium.capacity() != u64::MAX {
            return Ok(());
        }
        // Its own stream: the run's stays what it was without schedules.
        let mut rng = SplitMix64::new(self.seed ^ (i as u64).wrapping_mul(0x5c4e_d01e_9e37_79b9));
        let store = self.store();
        let oid = match store.create_object(b"") {
            Ok(oid) => oid,
            Err(e) => return self.extra_failed(i, "creating an object", e),
        };
        self.runner.model.objects.insert(oid, Vec::new());
        self.remember();
        let cells = 4 + rng.below(8) as usize;
        let data = self.own_data(cells * crate::harness::TEST_CELL as usize);
        let others: Vec<u64> = self
            .runner
            .model
            .objects
            .keys()
            .copied()
            .filter(|&o| o != ROOT_DIR && o != oid && !self.runner.model.destroyed.contains(&o))
            .collect();
        let mut beside: Vec<Beside> = Vec::new();
        for _ in 0..1 + rng.below(2) {
            let b = match rng.below(8) {
                0 => Beside::Commit,
                1 => Beside::TimerCommit,
                2 => Beside::Cleaner,
                3 => Beside::Consolidate,
                4 => Beside::Flush,
                5 => match self.live_share(rng.next_u64() as u32) {
                    Some(s) => Beside::SetShare(s),
                    None => Beside::Commit,
                },
                6 => Beside::SmallCells,
                _ if others.is_empty() => Beside::Flush,
                _ => Beside::Write(others[rng.below(others.len() as u64) as usize]),
            };
            // One of each kind: two placements of one object would make
            // the model depend on their order.
            if !beside.iter().any(|x| x.name() == b.name()) {
                beside.push(b);
            }
        }
        let small = self.own_data(3 * BLOCK);
        let names: Vec<String> = self.shares.iter().map(|s| s.name.clone()).collect();
        if beside.contains(&Beside::TimerCommit) {
            // The timer's tick commits when the policy wants it: any bytes.
            store.set_policy(EpochPolicy {
                bytes: Some(1),
                ..EpochPolicy::manual()
            });
        }
        let mut ops: Vec<Op<'_>> = vec![(
            "large write",
            Box::new(|| outcome(&store.write(oid, 0, &data))),
        )];
        for &b in &beside {
            let (store, small, names) = (&store, &small, &names);
            let op: Box<dyn FnOnce() -> String + Send + '_> = match b {
                Beside::Commit => Box::new(move || outcome(&store.commit())),
                Beside::TimerCommit => Box::new(move || {
                    let before = store.epoch();
                    store.tick();
                    format!("ok (epoch {before} -> {})", store.epoch())
                }),
                Beside::Cleaner => Box::new(move || outcome(&store.gc(0.5))),
                Beside::Consolidate => Box::new(move || outcome(&store.consolidate_keys())),
                Beside::Flush => Box::new(move || outcome(&store.flush())),
                Beside::SetShare(s) => Box::new(move || outcome(&store.set_share(oid, &names[s]))),
                Beside::SmallCells => Box::new(move || match store.use_small_cells(oid) {
                    Ok(small) => format!("ok ({})", if small { "small" } else { "kept" }),
                    Err(e) => format!("error: {e}"),
                }),
                Beside::Write(target) => Box::new(move || outcome(&store.write(target, 0, small))),
            };
            ops.push((b.name(), op));
        }
        let ran = run(&mut rng, ops);
        if beside.contains(&Beside::TimerCommit) {
            store.set_policy(EpochPolicy::manual());
        }
        for kind in &ran.kinds {
            *self.faults.entry(kind).or_default() += 1;
        }
        let what: Vec<String> = std::iter::once("large write".to_string())
            .chain(beside.iter().map(|b| format!("{b:?}")))
            .zip(&ran.outcomes)
            .map(|(op, out)| format!("{op} -> {out}"))
            .collect();
        let line = format!(
            "#{i} scheduled: {cells} cells to new object {oid}; {}; {} seam calls; {}",
            what.join("; "),
            ran.points,
            if ran.events.is_empty() {
                "no switch".to_string()
            } else {
                ran.events.join(", ")
            }
        );
        if std::env::var_os("OUBLI_SIM_VERBOSE").is_some() {
            eprintln!("{line}");
        }
        self.note_fault("sched: scheduled step", line);
        // The model: what reported success happened, in any order (a
        // commit or flush beside them may have made any prefix durable).
        let ok = |out: &String| out.starts_with("ok");
        let mut effects = Vec::new();
        for (b, out) in beside.iter().zip(&ran.outcomes[1..]) {
            match (b, ok(out)) {
                (Beside::SetShare(s), true) => effects.push(Effect::Share(*s)),
                // Placing an object that holds data is refused: the large
                // write got there first.
                (Beside::SetShare(_), false) if out.contains("already holds data") => {}
                (Beside::Write(target), true) => effects.push(Effect::Write(*target, &small)),
                (_, true) => {}
                (b, false) => {
                    return self.sched_failed(i, b.name(), out);
                }
            }
        }
        if !ok(&ran.outcomes[0]) {
            return self.sched_failed(i, "the large write", &ran.outcomes[0]);
        }
        effects.push(Effect::Write(oid, &data));
        let base = self.runner.model.clone();
        for order in orders(effects.len()) {
            let mut model = base.clone();
            for &e in &order {
                effects[e].apply(&mut model, oid);
                if !self.since_ack.contains(&model) {
                    self.since_ack.push(model.clone());
                }
            }
            self.runner.model = model;
        }
        self.check_model(&format!("after the scheduled step #{i}"))?;
        if effects.iter().any(|e| matches!(e, Effect::Share(_))) {
            // A state with the placement and one without read back alike
            // (the model's diff compares contents, not placements): after
            // a later crash the oracle could not tell which one the store
            // holds. A flush makes the placement acknowledged.
            if let Err(e) = store.flush() {
                return self.extra_failed(i, "the flush after a scheduled placement", e);
            }
            self.runner.acked = self.runner.model.clone();
        }
        if beside.iter().any(|b| b.commits()) {
            // What the scheduled commits covered is not known here: one
            // more, reported, and the adversary.
            if let Err(e) = store.commit() {
                return self.extra_failed(i, "the commit after a scheduled step", e);
            }
            self.acknowledge_commit();
            self.check_adversary(&format!("after the scheduled step #{i}"))?;
        }
        Ok(())
    }

    /// No fault is armed in a scheduled step (and the medium has room):
    /// nothing explains a failure.
    fn sched_failed(&self, i: usize, what: &str, out: &str) -> Result<(), String> {
        Err(format!(
            "#{i} scheduled step: {what} failed with no fault to explain it: {out}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_blocked_on_a_lock_another_holds_gives_the_token_back() {
        // Thread "a" takes a lock and parks at a seam holding it; "b" is
        // then given the token and blocks on that lock: the scheduler must
        // see it and let "a" finish.
        let lock = Mutex::new(());
        let mut blocked = 0;
        for seed in 0..6 {
            let mut rng = SplitMix64::new(seed);
            let ran = run(
                &mut rng,
                vec![
                    (
                        "a",
                        Box::new(|| {
                            let _held = lock.lock().unwrap();
                            for _ in 0..200 {
                                point("seam");
                            }
                            "ok".into()
                        }),
                    ),
                    (
                        "b",
                        Box::new(|| {
                            for _ in 0..200 {
                                point("seam");
                                drop(lock.lock().unwrap());
                            }
                            "ok".into()
                        }),
                    ),
                ],
            );
            assert_eq!(ran.outcomes, ["ok", "ok"], "seed {seed}");
            blocked += ran.events.iter().filter(|e| e.contains("blocked")).count();
        }
        assert!(
            blocked > 0,
            "no seed handed the token to the thread that then blocked"
        );
    }

    #[test]
    fn a_schedule_replays_from_its_seed() {
        // Two threads that never block: the hand-overs are the seed's.
        let trace = |seed| {
            let log = Mutex::new(Vec::new());
            let mut rng = SplitMix64::new(seed);
            let ops: Vec<Op<'_>> = ["a", "b", "c"]
                .into_iter()
                .map(|name| {
                    let log = &log;
                    let op: Box<dyn FnOnce() -> String + Send + '_> = Box::new(move || {
                        for _ in 0..40 {
                            point("seam");
                            log.lock().unwrap().push(name);
                        }
                        "ok".into()
                    });
                    (name, op)
                })
                .collect();
            let ran = run(&mut rng, ops);
            (log.into_inner().unwrap(), ran.events)
        };
        let mut switched = false;
        for seed in 0..8 {
            let first = trace(seed);
            assert_eq!(first, trace(seed), "seed {seed}");
            switched |= first.1.iter().any(|e| e.contains("during"));
        }
        assert!(switched, "no seed switched threads mid-way");
    }
}
