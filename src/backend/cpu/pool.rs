//! A fixed pool of worker threads that run one parallel loop at a time.
//!
//! `run(n, f)` calls `f(0..n)` spread over the workers and the calling thread
//! and returns when every call has finished. Idle workers sleep on a condition
//! variable (no spinning). The closure may borrow from the caller's stack: the
//! pool guarantees that no worker touches it after `run` returns or unwinds.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

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
    /// Workers that took the current job and have not finished it.
    busy: usize,
    panicked: bool,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work_ready: Condvar,
    work_done: Condvar,
    next: AtomicUsize,
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

impl ThreadPool {
    /// A pool running loops on `n_threads` threads in all: the caller and
    /// `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                busy: 0,
                panicked: false,
                shutdown: false,
            }),
            work_ready: Condvar::new(),
            work_done: Condvar::new(),
            next: AtomicUsize::new(0),
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("m40llm-cpu-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawning a CPU worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            submit: Mutex::new(()),
        }
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
        {
            let mut state = self.shared.lock();
            self.shared.next.store(0, Ordering::Relaxed);
            state.job = Some(job);
            state.generation += 1;
            state.panicked = false;
        }
        self.shared.work_ready.notify_all();
        let caller_panicked = self.shared.drain(job);
        // Withdraw the job so that workers still asleep never see it, then
        // wait for those that took it.
        let mut state = self.shared.lock();
        state.job = None;
        while state.busy > 0 {
            state = self
                .shared
                .work_done
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        let worker_panicked = state.panicked;
        drop(state);
        if caller_panicked || worker_panicked {
            resume_unwind(Box::new("a task of a parallel CPU loop panicked"));
        }
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0;
    loop {
        let job = {
            let mut state = shared.lock();
            loop {
                if state.shutdown {
                    return;
                }
                if state.generation != seen {
                    seen = state.generation;
                    if let Some(job) = state.job {
                        state.busy += 1;
                        break job;
                    }
                }
                state = shared
                    .work_ready
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
        };
        let panicked = shared.drain(job);
        let mut state = shared.lock();
        state.panicked |= panicked;
        state.busy -= 1;
        if state.busy == 0 {
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
