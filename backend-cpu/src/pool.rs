//! The compute pool: fork-join parallel regions for the forward pass, with the
//! calling thread working alongside `threads - 1` persistent helpers.
//!
//! Why not rayon: a decode step of SmolLM2-135M runs about 150 parallel
//! regions (4 matmuls and one attention per layer, then the LM head) of 20-100
//! µs each. With rayon, a caller outside its pool injects each region and
//! sleeps until the workers finish it, so every region costs two thread
//! wake-ups; perf showed ~15 % of a single-stream decode step in the kernel's
//! scheduler. Here the caller runs tasks itself and the helpers wait for the
//! next region by spinning (then yielding) for [`SPIN`] before they sleep, the
//! scheme of llama.cpp's thread pool and OpenMP's `OMP_WAIT_POLICY=active`
//! with a bounded spin.
//!
//! Tasks are claimed one at a time from a shared counter, so the split adapts
//! to a helper that is descheduled. Which thread runs a task never changes its
//! result: kernels fix their reduction order per output (see
//! [`super::matmul`]).
//!
//! One region at a time: a second caller (another model on another thread)
//! waits for the region in progress; a task that starts a region itself runs
//! that region inline on its own thread, which gives the same results.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle helper waits for the next region before it sleeps:
/// longer than the gaps between a step's regions and between decode steps,
/// short enough that an idle worker stops using CPU at once.
const SPIN: Duration = Duration::from_micros(500);

/// Busy-wait iterations before an idle helper starts yielding its core.
const SPIN_BEFORE_YIELD: u32 = 4096;

/// `state` bit: the current region accepts helpers.
const OPEN: u64 = 1 << 31;
/// `state` bits counting the helpers registered in the current region.
const ACTIVE: u64 = OPEN - 1;

thread_local! {
    /// Whether this thread is a helper or is running a region's tasks: a
    /// region started here runs inline instead of waiting for the pool.
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Threads for the pool made by [`global`] (0: one per available core).
static THREADS: AtomicUsize = AtomicUsize::new(0);
static GLOBAL: OnceLock<ComputePool> = OnceLock::new();

/// Sets the thread count (the caller included) of the [`global`] pool;
/// 0 means one per available core. Takes effect only before the first region.
pub fn set_threads(threads: usize) {
    THREADS.store(threads, Ordering::Relaxed);
}

/// The process-wide pool, started on first use with [`set_threads`]'s count.
pub fn global() -> &'static ComputePool {
    GLOBAL.get_or_init(|| {
        let n = match THREADS.load(Ordering::Relaxed) {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        ComputePool::new(n)
    })
}

/// A region's task function with its lifetime erased; only dereferenced by
/// helpers registered while the region is open, and the caller waits for all
/// of them before the function goes out of scope.
#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn(usize) + Sync));

/// What the caller and its helpers share.
struct Shared {
    /// Region number (high 32 bits), [`OPEN`], and registered helpers ([`ACTIVE`]).
    state: AtomicU64,
    /// The current region's tasks; written only while no helper is registered.
    job: UnsafeCell<Option<JobRef>>,
    /// Tasks in the current region.
    n_tasks: AtomicUsize,
    /// Next unclaimed task.
    next: AtomicUsize,
    /// The first panic of the region's tasks, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Helpers asleep (or about to be).
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    /// Set when the pool is dropped: helpers exit.
    shutdown: AtomicBool,
}

// SAFETY: `job` is written by the single caller holding `ComputePool::submit`
// while no helper is registered, and read by helpers only between their
// registration (Acquire on `state`) and deregistration, which the caller waits
// for; the function it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs tasks of the current region until none is left.
    fn run_tasks(&self, job: JobRef) {
        let n = self.n_tasks.load(Ordering::Relaxed);
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            // SAFETY: see `JobRef`: the region (and so the function) outlives this call.
            let f = unsafe { &*job.0 };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                let mut first = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                if first.is_none() {
                    *first = Some(payload);
                } else {
                    // Dropping a payload may itself panic; this one is not reported anyway.
                    std::mem::forget(payload);
                }
            }
        }
    }

    /// A helper's life: join each open region once, spin between regions, sleep when idle.
    fn helper_loop(&self) {
        IN_TASK.with(|f| f.set(true));
        let mut seen = self.state.load(Ordering::Acquire) >> 32;
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let s = self.state.load(Ordering::Acquire);
            if s >> 32 != seen {
                if s & OPEN != 0 {
                    if self
                        .state
                        .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                        .is_err()
                    {
                        continue;
                    }
                    // SAFETY: registered while open: the caller set `job` before
                    // opening and keeps it until this helper deregisters.
                    if let Some(job) = unsafe { *self.job.get() } {
                        self.run_tasks(job);
                    }
                    self.state.fetch_sub(1, Ordering::Release);
                }
                seen = s >> 32;
                idle_since = Instant::now();
                spins = 0;
                continue;
            }
            spins = spins.saturating_add(1);
            if spins < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else if idle_since.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                self.sleep_until_changed(seen);
                idle_since = Instant::now();
                spins = 0;
            }
        }
    }

    /// Sleeps until the region number differs from `seen`.
    fn sleep_until_changed(&self, seen: u64) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
        while self.state.load(Ordering::SeqCst) >> 32 == seen
            && !self.shutdown.load(Ordering::SeqCst)
        {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fixed set of threads that run parallel regions (see the module docs).
pub struct ComputePool {
    shared: Arc<Shared>,
    /// Held by the caller of the region in progress.
    submit: Mutex<()>,
    threads: usize,
}

impl std::fmt::Debug for ComputePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputePool")
            .field("threads", &self.threads)
            .finish()
    }
}

impl ComputePool {
    /// A pool of `threads` threads in all: the caller of each region and
    /// `threads - 1` helper threads (named `compute-N`), which exit when the
    /// pool is dropped. `threads` 0 is taken as 1.
    pub fn new(threads: usize) -> ComputePool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        for i in 1..threads {
            let s = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("compute-{i}"))
                .spawn(move || s.helper_loop())
                .expect("spawning a compute thread");
        }
        ComputePool {
            shared,
            submit: Mutex::new(()),
            threads,
        }
    }

    /// Threads that run a region (the caller included).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(0)`, ..., `f(n_tasks - 1)`, each exactly once, on the calling
    /// thread and the helpers, and returns when all are done. A region
    /// started from inside a task runs inline on that thread; one started
    /// while another thread's region is in progress waits for it.
    ///
    /// A panic in a task is re-raised here after the other tasks have run.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 || n_tasks <= 1 || IN_TASK.with(|t| t.get()) {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        }
        let submit = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY (lifetime erasure): every helper that reads this pointer registered
        // while the region was open, and `Region::drop` below waits for all of them
        // to deregister before this function returns or unwinds, so `f` outlives
        // every use.
        let job: JobRef = JobRef(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(
                f as *const _,
            )
        });
        // SAFETY: no helper is registered (the last region waited for all), so
        // nobody reads `job` now.
        unsafe { *sh.job.get() = Some(job) };
        sh.n_tasks.store(n_tasks, Ordering::Relaxed);
        sh.next.store(0, Ordering::Relaxed);
        let region = (sh.state.load(Ordering::Relaxed) >> 32) + 1;
        sh.state.store((region << 32) | OPEN, Ordering::SeqCst);
        let close = Region(sh);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _lock = sh.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        IN_TASK.with(|t| t.set(true));
        sh.run_tasks(job);
        IN_TASK.with(|t| t.set(false));
        drop(close);
        let panic = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(submit);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }

    /// Runs `f(i, chunk_i)` for every `chunk`-long piece of `data` (the
    /// last may be shorter), in parallel as [`Self::run`], with no allocation.
    ///
    /// Panics if `chunk` is 0.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        assert!(chunk > 0, "for_each_chunk_mut: chunk of 0");
        let len = data.len();
        let shared = DisjointSlice::new(data);
        self.run(len.div_ceil(chunk), &|i| {
            let start = i * chunk;
            // SAFETY: `run` calls each index exactly once, so the pieces
            // `start..start + chunk` are disjoint.
            let piece = unsafe { shared.piece(start..(start + chunk).min(len)) };
            f(i, piece)
        });
    }
}

/// A mutable slice whose disjoint pieces are written by the
/// tasks of one parallel region ([`ComputePool::run`]): the one type behind every in-place
/// parallel write of the forward pass (`for_each_chunk_mut`, the matmul's output columns,
/// the split attention's scores and values). It borrows the slice mutably for `'a`, so
/// nothing else touches it meanwhile; the `unsafe` accessors leave only disjointness
/// between tasks to the caller, and check bounds themselves.
pub struct DisjointSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _slice: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> Clone for DisjointSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DisjointSlice<'_, T> {}

// SAFETY: tasks only write disjoint pieces (the contract of `piece`), and the
// elements may move between threads (`T: Send`).
unsafe impl<T: Send> Sync for DisjointSlice<'_, T> {}
unsafe impl<T: Send> Send for DisjointSlice<'_, T> {}

impl<'a, T> DisjointSlice<'a, T> {
    /// Shares `data` for one region's tasks.
    pub fn new(data: &'a mut [T]) -> DisjointSlice<'a, T> {
        DisjointSlice {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _slice: std::marker::PhantomData,
        }
    }

    /// Elements in the slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements `range` of the slice. Panics if `range` is out of bounds.
    ///
    /// # Safety
    /// No two pieces in use at the same time may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn piece(&self, range: std::ops::Range<usize>) -> &'a mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "DisjointSlice: range {range:?} out of 0..{}",
            self.len
        );
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len())
    }
}

/// An open region: dropping it (at the end of [`ComputePool::run`], or while
/// unwinding) closes the region to late helpers and waits for the registered
/// ones to finish, so none still uses the region's function afterwards.
struct Region<'a>(&'a Shared);

impl Drop for Region<'_> {
    fn drop(&mut self) {
        let sh = self.0;
        sh.state.fetch_and(!OPEN, Ordering::AcqRel);
        // A registered helper may have been preempted: spin briefly, then yield the core to it.
        let mut spins = 0u32;
        while sh.state.load(Ordering::Acquire) & ACTIVE != 0 {
            spins = spins.saturating_add(1);
            if spins < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: no helper is registered and the region is closed.
        unsafe { *sh.job.get() = None };
    }
}

impl Drop for ComputePool {
    /// Stops the helpers (they exit at their next check; none is in a region,
    /// since `run` waits for them).
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        let _lock = sh.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
        sh.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[test]
    fn disjoint_slice_pieces_and_elements_land_in_place() {
        let pool = ComputePool::new(3);
        let mut data = vec![0u32; 100];
        let shared = DisjointSlice::new(&mut data);
        assert_eq!(shared.len(), 100);
        pool.run(10, &|i| {
            // SAFETY: task i alone writes elements 10i..10i+10.
            let piece = unsafe { shared.piece(10 * i..10 * i + 9) };
            piece.fill(i as u32);
            let last = unsafe { shared.piece(10 * i + 9..10 * i + 10) };
            last[0] = 1000 + i as u32;
        });
        for (j, &v) in data.iter().enumerate() {
            let i = (j / 10) as u32;
            assert_eq!(v, if j % 10 == 9 { 1000 + i } else { i }, "element {j}");
        }
    }

    #[test]
    #[should_panic(expected = "out of 0..4")]
    fn disjoint_slice_checks_bounds() {
        let mut data = [0.0f32; 4];
        let shared = DisjointSlice::new(&mut data);
        // SAFETY: the only piece in use.
        let _ = unsafe { shared.piece(2..5) };
    }

    #[test]
    fn every_task_runs_exactly_once() {
        let pool = ComputePool::new(3);
        for n in [0, 1, 2, 7, 100] {
            let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            pool.run(n, &|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        let pool = ComputePool::new(2);
        for (len, chunk) in [(50, 7), (48, 8), (3, 10), (0, 4)] {
            let mut out = vec![0usize; len];
            pool.for_each_chunk_mut(&mut out, chunk, |i, piece| {
                for (j, v) in piece.iter_mut().enumerate() {
                    *v += i * chunk + j + 1;
                }
            });
            assert!(
                out.iter().enumerate().all(|(i, &v)| v == i + 1),
                "{len}/{chunk}"
            );
        }
    }

    #[test]
    fn helpers_wake_after_sleeping_and_nested_regions_run_inline() {
        let pool = ComputePool::new(2);
        let total = AtomicU32::new(0);
        pool.run(4, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        // Long enough for the helper to go to sleep.
        std::thread::sleep(SPIN * 4);
        pool.run(8, &|_| {
            // A region started from inside a task runs on that thread.
            pool.run(2, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 + 16);
    }

    #[test]
    fn two_callers_share_the_pool_and_a_dropped_pool_lets_go() {
        let pool = ComputePool::new(2);
        let total = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..200 {
                        pool.run(5, &|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 2 * 200 * 5);
        drop(pool);
    }

    #[test]
    fn a_task_panic_reaches_the_caller_and_the_pool_stays_usable() {
        let pool = ComputePool::new(2);
        let ran = AtomicU32::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 5, "task five fails");
            })
        }));
        assert!(result.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 16, "the other tasks still ran");
        let after = AtomicU32::new(0);
        pool.run(10, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 10);
    }
}
