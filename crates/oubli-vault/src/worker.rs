//! A device thread with deadlines: hardware vault calls that may hang become `Unavailable` after a timeout, in order.
//!
//! A TPM behind a dead socket or a token pulled mid-command can block a
//! library call forever, and the engine must not hang with it: a commit that
//! cannot reach the vault keeps its epoch open and retries (docs/DESIGN.md
//! §4). So every device operation runs on one dedicated thread that owns the
//! connection, and the caller waits for the answer with a deadline.
//!
//! Two rules keep this safe for the commit protocol:
//!
//! * **FIFO, one at a time.** Operations run in the order they were asked
//!   for, never concurrently. A `load` the engine issues after a `store` that
//!   timed out therefore runs only after that store has finished on the
//!   device — it cannot report the old record while the new one is still
//!   about to be written.
//! * **A job whose caller gave up never starts.** If the deadline passes
//!   while a job is still queued, it is cancelled; only a job that had
//!   already started is allowed to finish (its outcome is then unknown to
//!   the caller, which is what `Unavailable` from `store` means).
//!
//! Connections are opened lazily on the thread (a TSS ESAPI context is not
//! `Send`) and dropped after a transport error, so the next job reconnects:
//! a restarted simulator or a re-inserted token is picked up by the retry.

use oubli_core::VaultError;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PENDING: u8 = 0;
const RUNNING: u8 = 1;
const CANCELLED: u8 = 2;

type Job<S> = Box<dyn FnOnce(&mut Conn<S>) + Send>;

/// Opens a device connection; runs on the device thread.
pub(crate) type Connector<S> = Arc<dyn Fn() -> Result<S, VaultError> + Send + Sync>;

/// The device thread's view of its connection.
pub(crate) struct Conn<S> {
    state: Option<S>,
    connect: Connector<S>,
}

impl<S> Conn<S> {
    /// The open connection, opening it first if needed.
    pub fn get(&mut self) -> Result<&mut S, VaultError> {
        if self.state.is_none() {
            self.state = Some((self.connect)()?);
        }
        Ok(self.state.as_mut().expect("just connected"))
    }

    /// Drops the connection, so that the next job opens a fresh one.
    pub fn reset(&mut self) {
        self.state = None;
    }
}

/// Runs device jobs on one thread, with a deadline per call.
pub(crate) struct Worker<S: 'static> {
    name: String,
    timeout: Duration,
    /// Whether the connection stays open between jobs (see [`Worker::new`]).
    keep: bool,
    connect: Connector<S>,
    sender: Mutex<Option<Sender<Job<S>>>>,
    /// Closed by the device thread once it has dropped its connection.
    done: Mutex<Option<Receiver<()>>>,
}

impl<S: 'static> Drop for Worker<S> {
    /// Ends the device thread and waits (boundedly) for it to close the
    /// connection, so that a vault dropped and reopened at once does not
    /// find its own old session still open: a TPM simulator serves one
    /// connection at a time, and a token's login state lives as long as any
    /// session of the process. A thread stuck in a hung call is left behind.
    fn drop(&mut self) {
        let sender = self
            .sender
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(sender);
        if let Some(done) = self
            .done
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = done.recv_timeout(self.timeout.min(Duration::from_secs(5)));
        }
    }
}

impl<S: 'static> Worker<S> {
    /// `keep`: whether the connection stays open between jobs. A device that
    /// serves one client at a time (the swtpm and mssim simulators) must be
    /// let go after each job, or a second vault handle — another process,
    /// or a reopen — would wait for this one forever.
    pub fn new(
        name: impl Into<String>,
        timeout: Duration,
        keep: bool,
        connect: Connector<S>,
    ) -> Self {
        Worker {
            name: name.into(),
            timeout,
            keep,
            connect,
            sender: Mutex::new(None),
            done: Mutex::new(None),
        }
    }

    /// Runs `job` on the device thread and waits at most the timeout for it.
    ///
    /// Errors the job returns are passed through; the job decides which of
    /// them also drop the connection (see [`Conn::reset`]).
    pub fn run<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Conn<S>) -> Result<R, VaultError> + Send + 'static,
    ) -> Result<R, VaultError> {
        let status = Arc::new(AtomicU8::new(PENDING));
        let (reply_tx, reply_rx) = mpsc::channel();
        let job_status = status.clone();
        let boxed: Job<S> = Box::new(move |conn| {
            // Start only if the caller is still waiting (see module docs).
            if job_status
                .compare_exchange(PENDING, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return;
            }
            let result = job(conn);
            let _ = reply_tx.send(result);
        });
        self.submit(boxed)?;
        match reply_rx.recv_timeout(self.timeout) {
            Ok(result) => result,
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(VaultError::Unavailable(format!(
                "{}: the device library failed (panicked) during the operation",
                self.name
            ))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let started = status
                    .compare_exchange(PENDING, CANCELLED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err();
                // The job may have finished between the timeout and the
                // exchange: take its answer if it is there.
                if let Ok(result) = reply_rx.try_recv() {
                    return result;
                }
                Err(VaultError::Unavailable(if started {
                    format!(
                        "{}: no answer within {:?}; the operation may still complete",
                        self.name, self.timeout
                    )
                } else {
                    format!(
                        "{}: busy with an earlier operation that has not answered for {:?}",
                        self.name, self.timeout
                    )
                }))
            }
        }
    }

    fn submit(&self, job: Job<S>) -> Result<(), VaultError> {
        let mut sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = sender.as_ref() {
            match tx.send(job) {
                Ok(()) => return Ok(()),
                // The thread died (a panic in a library call): start anew.
                Err(mpsc::SendError(job)) => {
                    *sender = None;
                    return self.spawn_with(&mut sender, job);
                }
            }
        }
        self.spawn_with(&mut sender, job)
    }

    fn spawn_with(
        &self,
        sender: &mut Option<Sender<Job<S>>>,
        first: Job<S>,
    ) -> Result<(), VaultError> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        tx.send(first).expect("receiver alive");
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let connect = self.connect.clone();
        let keep = self.keep;
        std::thread::Builder::new()
            .name(format!("oubli-vault-{}", self.name))
            .spawn(move || {
                device_loop(rx, connect, keep);
                drop(done_tx);
            })
            .map_err(|e| VaultError::Unavailable(format!("cannot start device thread: {e}")))?;
        *sender = Some(tx);
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(done_rx);
        Ok(())
    }
}

/// Runs jobs until the Worker (the only sender) is dropped; the connection
/// is dropped on return, before the caller signals "done".
fn device_loop<S>(rx: Receiver<Job<S>>, connect: Connector<S>, keep: bool) {
    let mut conn = Conn {
        state: None,
        connect,
    };
    while let Ok(job) = rx.recv() {
        // A panic inside a device library must not kill the thread (the
        // jobs queued behind it would be lost): the caller sees its reply
        // channel close, and the connection, in an unknown state, is dropped.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
        if outcome.is_err() || !keep {
            conn.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Instant;

    fn worker(timeout_ms: u64) -> (Worker<u32>, Arc<AtomicU32>) {
        let connects = Arc::new(AtomicU32::new(0));
        let c = connects.clone();
        let w = Worker::new(
            "test",
            Duration::from_millis(timeout_ms),
            true,
            Arc::new(move || Ok(c.fetch_add(1, Ordering::SeqCst) + 1)),
        );
        (w, connects)
    }

    #[test]
    fn runs_jobs_in_order_and_connects_lazily() {
        let (w, connects) = worker(2000);
        assert_eq!(connects.load(Ordering::SeqCst), 0);
        assert_eq!(w.run(|c| Ok(*c.get()?)).unwrap(), 1);
        assert_eq!(w.run(|c| Ok(*c.get()?)).unwrap(), 1);
        w.run(|c| {
            c.reset();
            Ok(())
        })
        .unwrap();
        assert_eq!(w.run(|c| Ok(*c.get()?)).unwrap(), 2);
        assert!(matches!(
            w.run::<()>(|_| Err(VaultError::WrongPassword)),
            Err(VaultError::WrongPassword)
        ));
    }

    #[test]
    fn a_hung_job_times_out_and_queued_jobs_are_cancelled() {
        let (w, _) = worker(100);
        let ran = Arc::new(AtomicU32::new(0));
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let g = gate.clone();
        let t = Instant::now();
        let err = w
            .run(move |_| {
                let _wait = g.lock();
                Ok(())
            })
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(matches!(&err, VaultError::Unavailable(m) if m.contains("may still complete")));
        // Queued behind the hung job: times out and must never run.
        let r = ran.clone();
        let err = w
            .run(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(&err, VaultError::Unavailable(m) if m.contains("busy")));
        drop(held);
        // Once the device answers again, later jobs run; the cancelled one did not.
        let r = ran.clone();
        w.run(move |_| {
            r.fetch_add(10, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn a_panicking_job_is_unavailable_and_the_thread_restarts() {
        let (w, connects) = worker(2000);
        let err = w.run::<()>(|_| panic!("library bug")).unwrap_err();
        assert!(matches!(err, VaultError::Unavailable(_)));
        assert_eq!(w.run(|c| Ok(*c.get()?)).unwrap(), 1);
        assert_eq!(connects.load(Ordering::SeqCst), 1);
    }
}
