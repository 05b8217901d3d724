//! A fixed pool of worker threads that run one parallel loop at a time.
//!
//! `run(n, f)` calls `f(0..n)` spread over the workers and the calling thread
//! and returns when every call has finished. The closure may borrow from the
//! caller's stack: the pool guarantees that no worker touches it after `run`
//! returns or unwinds.
//!
//! A decode step is a few hundred short loops back to back, so waking a
//! sleeping thread for each would cost more than many loops take. Workers
//! therefore spin for up to [`SPIN`] after a loop (and the caller as long
//! while it waits for them) before they sleep on a condition variable: an
//! idle pool costs no CPU, a busy one no wake-ups.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a thread spins for the next event before it sleeps.
const SPIN: Duration = Duration::from_micros(100);

/// Spins until `done()` or `SPIN` has passed; true if `done()`.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > SPIN {
            return done();
        }
    }
}

type Task = dyn Fn(usize) + Sync;

/// A published loop: the closure (lifetime erased, see `run`) and its size.
#[derive(Clone, Copy)]
struct Job {
    task: *const Task,
    n: usize,
}

// SAFETY: `task` points to a `Sync` closure, so calling it from several
// threads is allowed; `run` keeps it alive while any worker can see it.
unsafe impl Send for Job {}

struct State {
    generation: u64,
    job: Option<Job>,
    /// Workers asleep on `work_ready`.
    sleepers: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work_ready: Condvar,
    work_done: Condvar,
    /// `State::generation`, readable without the lock for spinning.
    generation: AtomicU64,
    /// The next task index to claim.
    next: AtomicUsize,
    /// Workers that took the current job and have not finished it; taken
    /// only under the lock while the job is published.
    busy: AtomicUsize,
    panicked: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Tasks run outside the lock and panics inside them are caught, so a
        // poisoned lock still guards consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims and runs tasks until none are left; true if one panicked.
    fn drain(&self, job: Job) -> bool {
        catch_unwind(AssertUnwindSafe(|| loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= job.n {
                break;
            }
            // SAFETY: `run` does not return before every worker has left
            // `drain` for this job, so the closure is alive.
            unsafe { (*job.task)(i) };
        }))
        .is_err()
    }
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One loop at a time: sessions on several threads take turns per loop.
    submit: Mutex<()>,
}

/// The most threads a pool runs loops on (`m40_model_params.n_threads`).
/// More would only cost memory and scheduling: no CPU has that many cores
/// for one process to use well.
pub const MAX_THREADS: usize = 1024;

/// Checks a thread count a host asked for (0 is "one per core" and resolved
/// before this).
pub fn check_thread_count(n_threads: usize) -> Result<()> {
    if n_threads > MAX_THREADS {
        return Err(Error::invalid_argument(format!(
            "n_threads {n_threads} is more than the {MAX_THREADS} CPU threads a model may use (0: one per core)"
        )));
    }
    Ok(())
}

/// Starts one worker thread running `body`.
type Spawn<'a> = dyn FnMut(usize, Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>> + 'a;

impl ThreadPool {
    /// A pool running loops on `n_threads` threads in all: the caller and
    /// `n_threads - 1` workers. Panics where [`ThreadPool::try_new`] fails
    /// (for tests and benchmarks).
    pub fn new(n_threads: usize) -> ThreadPool {
        Self::try_new(n_threads).expect("starting a CPU thread pool")
    }

    /// A pool running loops on `n_threads` threads in all: the caller and
    /// `n_threads - 1` workers. More than [`MAX_THREADS`] is an argument
    /// error; a worker that cannot start (the process or user is out of
    /// threads or memory) fails it with `OutOfMemory`, after every worker
    /// already started has been stopped and joined: nothing is left behind.
    pub fn try_new(n_threads: usize) -> Result<ThreadPool> {
        Self::with_spawner(n_threads, &mut |i, body| {
            std::thread::Builder::new()
                .name(format!("m40llm-cpu-{i}"))
                .spawn(body)
        })
    }

    fn with_spawner(n_threads: usize, spawn: &mut Spawn<'_>) -> Result<ThreadPool> {
        check_thread_count(n_threads)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                sleepers: 0,
                shutdown: false,
            }),
            work_ready: Condvar::new(),
            work_done: Condvar::new(),
            generation: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        });
        let n_workers = n_threads.max(1) - 1;
        let mut pool = ThreadPool {
            shared,
            workers: Vec::new(),
            submit: Mutex::new(()),
        };
        pool.workers.try_reserve_exact(n_workers).map_err(|_| {
            Error::out_of_memory(format!("cannot allocate {n_workers} thread handles"))
        })?;
        for i in 1..=n_workers {
            let shared = Arc::clone(&pool.shared);
            match spawn(i, Box::new(move || worker(&shared))) {
                Ok(handle) => pool.workers.push(handle),
                Err(e) => {
                    // Dropping the pool shuts down and joins the workers
                    // started so far.
                    let started = pool.workers.len();
                    drop(pool);
                    return Err(Error::out_of_memory(format!(
                        "cannot start CPU worker thread {i} of the {n_workers} that n_threads {n_threads} needs: {e} \
                         (the {started} started were stopped; ask for fewer threads or raise the process's thread limit)"
                    )));
                }
            }
        }
        Ok(pool)
    }

    /// Threads a loop runs on, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `task(i)` for every `i` in `0..n`, in parallel, and returns when
    /// all calls have returned. A panic in any call is re-raised here.
    pub fn run(&self, n: usize, task: &(dyn Fn(usize) + Sync)) {
        let _turn = self.submit.lock().unwrap_or_else(|p| p.into_inner());
        if self.workers.is_empty() || n <= 1 {
            (0..n).for_each(task);
            return;
        }
        // SAFETY: the lifetime is erased so workers can hold the pointer; it
        // is only dereferenced in `drain` for this generation, and this
        // function waits below until every worker is done with it (also when
        // the caller's own share panics), then withdraws it.
        let task: *const Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Task>(task) };
        let job = Job { task, n };
        let shared = &*self.shared;
        {
            let mut state = shared.lock();
            shared.next.store(0, Ordering::Relaxed);
            shared.panicked.store(false, Ordering::Relaxed);
            state.job = Some(job);
            state.generation += 1;
            shared.generation.store(state.generation, Ordering::Release);
            if state.sleepers > 0 {
                shared.work_ready.notify_all();
            }
        }
        let caller_panicked = shared.drain(job);
        // Withdraw the job so that no worker takes it any more, then wait for
        // those that did.
        shared.lock().job = None;
        if !spin_until(|| shared.busy.load(Ordering::Acquire) == 0) {
            let mut state = shared.lock();
            while shared.busy.load(Ordering::Acquire) > 0 {
                state = shared
                    .work_done
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
        if caller_panicked || shared.panicked.load(Ordering::Relaxed) {
            resume_unwind(Box::new("a task of a parallel CPU loop panicked"));
        }
    }
    /// Calls `f(i, piece)` for each `chunk`-long piece i of `data` (the last
    /// may be shorter), in parallel, like `data.chunks_mut(chunk)`.
    pub fn for_each_chunk<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        struct Base<T>(*mut T, usize);
        // SAFETY: the tasks reach `data` only through disjoint pieces, and
        // `T: Send` lets a piece be used on another thread.
        unsafe impl<T: Send> Sync for Base<T> {}
        impl<T> Base<T> {
            /// # Safety
            /// `start..start + len` lies in the slice, and no one else uses it
            /// while the piece lives.
            #[allow(clippy::mut_from_ref)]
            unsafe fn piece(&self, start: usize, len: usize) -> &mut [T] {
                unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
            }
        }
        let chunk = chunk.max(1);
        let base = Base(data.as_mut_ptr(), data.len());
        self.run(data.len().div_ceil(chunk), &|i| {
            let start = i * chunk;
            let len = chunk.min(base.1 - start);
            // SAFETY: piece i is elements start..start + len of `data`,
            // which stays mutably borrowed until `run` returns; no other task
            // gets any of them.
            let piece = unsafe { base.piece(start, len) };
            f(i, piece)
        });
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0;
    loop {
        spin_until(|| shared.generation.load(Ordering::Acquire) != seen);
        let mut state = shared.lock();
        if state.generation == seen && !state.shutdown {
            state.sleepers += 1;
            while state.generation == seen && !state.shutdown {
                state = shared
                    .work_ready
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            state.sleepers -= 1;
        }
        if state.shutdown {
            return;
        }
        seen = state.generation;
        let Some(job) = state.job else {
            // Published and withdrawn while this worker was on its way.
            continue;
        };
        shared.busy.fetch_add(1, Ordering::AcqRel);
        drop(state);
        if shared.drain(job) {
            shared.panicked.store(true, Ordering::Relaxed);
        }
        if shared.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock, so the caller cannot miss it between checking
            // `busy` and starting to wait.
            let _state = shared.lock();
            shared.work_done.notify_one();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work_ready.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_exactly_once_for_any_thread_count() {
        for threads in 1..=4 {
            let pool = ThreadPool::new(threads);
            for n in [0, 1, 2, 7, 100, 1000] {
                let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "threads {threads}, n {n}"
                );
            }
        }
    }

    #[test]
    fn a_panicking_task_is_reraised_and_the_pool_stays_usable() {
        let pool = ThreadPool::new(3);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, &|i| {
                if i == 33 {
                    panic!("task 33 fails");
                }
            })
        }));
        assert!(result.is_err());
        let count = AtomicU64::new(0);
        pool.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn more_than_max_threads_is_an_argument_error() {
        for n in [MAX_THREADS + 1, u32::MAX as usize] {
            let err = ThreadPool::try_new(n).err().expect("too many threads");
            assert_eq!(err.kind(), crate::error::ErrorKind::InvalidArgument);
            assert!(err.message().contains(&n.to_string()), "{err}");
        }
    }

    #[test]
    fn a_thread_that_cannot_start_fails_the_pool_and_every_started_thread_is_joined() {
        let started = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let mut spawn = |i: usize, body: Box<dyn FnOnce() + Send>| {
            if i == 5 {
                return Err(std::io::Error::from_raw_os_error(11)); // EAGAIN
            }
            let finished = Arc::clone(&finished);
            started.fetch_add(1, Ordering::SeqCst);
            std::thread::Builder::new().spawn(move || {
                body();
                finished.fetch_add(1, Ordering::SeqCst);
            })
        };
        let err = ThreadPool::with_spawner(8, &mut spawn)
            .err()
            .expect("a worker failed to start");
        assert_eq!(err.kind(), crate::error::ErrorKind::OutOfMemory);
        assert!(
            err.message().contains("thread 5 of the 7")
                && err.message().contains("4 started were stopped"),
            "{err}"
        );
        // Joined before the error returned: none of them is still running.
        assert_eq!(started.load(Ordering::SeqCst), 4);
        assert_eq!(finished.load(Ordering::SeqCst), 4);
        // And a pool started afterwards works.
        let pool = ThreadPool::try_new(3).unwrap();
        let count = AtomicU64::new(0);
        pool.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn for_each_chunk_hands_out_every_piece_once() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            let mut data = vec![0usize; 103];
            pool.for_each_chunk(&mut data, 10, &|i, piece| {
                assert!(piece.len() == 10 || (i == 10 && piece.len() == 3));
                for (k, v) in piece.iter_mut().enumerate() {
                    *v += i * 10 + k + 1;
                }
            });
            assert!(data.iter().enumerate().all(|(k, &v)| v == k + 1));
        }
    }

    #[test]
    fn several_threads_may_share_one_pool() {
        let pool = ThreadPool::new(2);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let sum = AtomicU64::new(0);
                        pool.run(100, &|i| {
                            sum.fetch_add(i as u64, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 4950);
                    }
                });
            }
        });
    }
}
