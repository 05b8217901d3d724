//! The host threads that move a large read's pieces from pinned memory into
//! their rows as the device's copies land (`State::read_rows`). They are
//! started once per backend and wait for work: 8 sessions' logits of a
//! 248,320-token vocabulary are 7.9 MB a step, which the link moves in
//! 0.15 ms on the H200 and eight threads copy in about 0.2 ms, while starting
//! eight threads for every step took longer than both (the read took
//! 0.66–0.91 ms of a 2–3 ms step).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread;

use super::runtime::{self, OwnedEvent};
use crate::error::{Error, Result};

/// One read: `len` values in pinned memory at `pinned`, in pieces of
/// `piece_values`, piece i complete once `events[i]` has passed; row r of
/// `row_len` values goes to `rows[r]`.
#[derive(Clone, Copy)]
pub(super) struct ReadPieces {
    pub device: usize,
    pub pinned: *const f32,
    pub len: usize,
    pub piece_values: usize,
    pub events: *const OwnedEvent,
    pub rows: *const *mut f32,
    pub row_len: usize,
}

/// A share of a read: pieces `first`, `first + step`, …
struct Job {
    read: ReadPieces,
    first: usize,
    step: usize,
}

// SAFETY: a job's pointers name the pinned buffer, the events and the rows'
// buffers of one `CopyWorkers::run`, which waits for every job's result
// before it returns, so they outlive the job. The jobs write disjoint
// ranges of the rows, each inside its row's capacity, and read pieces of the
// pinned buffer only after the device's copy into them has finished;
// `OwnedEvent` is Sync.
unsafe impl Send for Job {}

struct Worker {
    jobs: Sender<Job>,
    thread: Option<thread::JoinHandle<()>>,
}

/// A pool of read-back threads, each waiting for a share of a read.
pub(super) struct CopyWorkers {
    workers: Vec<Worker>,
    results: Receiver<Result<()>>,
}

impl CopyWorkers {
    /// Up to `threads` workers: as many as the system lets the process
    /// start, none an error.
    pub fn new(threads: usize) -> Result<CopyWorkers> {
        let (result_sender, results) = channel();
        let mut workers = Vec::new();
        let mut failure = None;
        for i in 0..threads {
            let (jobs, job_receiver) = channel::<Job>();
            let results = result_sender.clone();
            let started = thread::Builder::new()
                .name(format!("m40-readback-{i}"))
                .spawn(move || {
                    // Ends when the pool, and so its job senders, drop.
                    while let Ok(job) = job_receiver.recv() {
                        let result = catch_unwind(AssertUnwindSafe(|| copy_pieces(&job)))
                            .unwrap_or_else(|_| {
                                Err(Error::internal("a read-back thread panicked"))
                            });
                        if results.send(result).is_err() {
                            return;
                        }
                    }
                });
            match started {
                Ok(thread) => workers.push(Worker {
                    jobs,
                    thread: Some(thread),
                }),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if workers.is_empty() {
            let why = failure.map_or_else(|| "none asked for".to_string(), |e| e.to_string());
            return Err(Error::internal(format!(
                "starting read-back threads: {why}"
            )));
        }
        Ok(CopyWorkers { workers, results })
    }

    /// The workers started.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Copies every piece of `read` into its rows on the first `threads`
    /// workers (thread t takes pieces t, t + threads, …, in the order they
    /// land) and waits for all of them; the first failure, if any.
    ///
    /// # Safety
    /// `read` names live memory: `len` values of pinned memory that the
    /// device's copies fill, an event per piece recorded after its copy,
    /// and a buffer of capacity `row_len` per row, none of it touched by
    /// anything else until this returns.
    pub unsafe fn run(&self, read: ReadPieces, threads: usize) -> Result<()> {
        let threads = threads.clamp(1, self.workers.len());
        let mut sent = 0;
        let mut outcome = Ok(());
        for (t, worker) in self.workers[..threads].iter().enumerate() {
            let job = Job {
                read,
                first: t,
                step: threads,
            };
            if worker.jobs.send(job).is_ok() {
                sent += 1;
            } else {
                outcome = Err(Error::internal("a read-back thread has ended"));
            }
        }
        // Every job sent must be done before the memory it names may go.
        for _ in 0..sent {
            let result = self
                .results
                .recv()
                .unwrap_or_else(|_| Err(Error::internal("a read-back thread has ended")));
            outcome = outcome.and(result);
        }
        outcome
    }
}

impl Drop for CopyWorkers {
    /// Ends the threads and waits for them: none may still run library
    /// code once the backend is gone (a host may unload the library next).
    fn drop(&mut self) {
        for worker in &mut self.workers {
            // A closed channel ends the worker's loop.
            let (closed, _) = channel();
            drop(std::mem::replace(&mut worker.jobs, closed));
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                // A worker that panicked outside a job has nothing to report.
                let _ = thread.join();
            }
        }
    }
}

/// One job's pieces into their rows.
fn copy_pieces(job: &Job) -> Result<()> {
    let r = &job.read;
    runtime::ensure_device(r.device)?;
    let n_pieces = r.len.div_ceil(r.piece_values);
    for piece in (job.first..n_pieces).step_by(job.step) {
        // SAFETY: the read names an event per piece (`CopyWorkers::run`).
        unsafe { (*r.events.add(piece)).wait()? };
        let (mut at, end) = (
            piece * r.piece_values,
            ((piece + 1) * r.piece_values).min(r.len),
        );
        while at < end {
            let (row, offset) = (at / r.row_len, at % r.row_len);
            let n = (r.row_len - offset).min(end - at);
            // SAFETY: the piece's copy is done (its event passed); row `row`
            // has capacity for row_len values, and values offset..offset + n
            // of it are this piece's alone.
            unsafe {
                std::ptr::copy_nonoverlapping(r.pinned.add(at), (*r.rows.add(row)).add(offset), n)
            };
            at += n;
        }
    }
    Ok(())
}
