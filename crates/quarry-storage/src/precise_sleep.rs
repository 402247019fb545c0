//! Sleeps that end within tens of microseconds of their deadline, for the device emulation
//! (the link's and the flash's bandwidth, the slower device CPU's pauses).
//!
//! tokio's timer rounds every sleep up to its 1 ms tick, so an emulated 600 MB/s link could
//! not charge a 1 MB read its 1.7 ms: the limiter used to let waits under 2 ms go unslept,
//! for a later wait to pay, and the last read of a fragment never paid (TPC-H SF 10 `supplier`
//! under kim-isp-2015: 1.5 ms measured, 2.7 ms its bytes take on the link). One thread of
//! its own holds the deadlines in a heap and sleeps on a condition variable to the earliest,
//! with the kernel's timer slack set to 1 µs; it runs no work, only wakes the sleepers.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Waits until `deadline`, to within the timer thread's wake-up latency.
pub fn sleep_until(deadline: Instant) -> PreciseSleep {
    PreciseSleep { deadline, slot: None }
}

/// Waits for `duration`, likewise.
pub fn sleep(duration: Duration) -> PreciseSleep {
    sleep_until(Instant::now() + duration)
}

/// The future of [`sleep_until`].
pub struct PreciseSleep {
    deadline: Instant,
    slot: Option<Arc<Slot>>,
}

/// A sleeper's side of the timer: whether its deadline passed, and whom to wake.
#[derive(Default)]
struct Slot {
    due: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Future for PreciseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        let slot = self.slot.get_or_insert_with(|| {
            let slot = Arc::new(Slot::default());
            timer().add(deadline, Arc::clone(&slot));
            slot
        });
        // The waker is stored before `due` is read, and the timer sets `due` before it takes
        // the waker, both under the lock: either it finds this waker or this poll sees `due`.
        *slot.waker.lock().expect("sleep slot lock") = Some(cx.waker().clone());
        if slot.due.load(Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending }
    }
}

struct Entry {
    deadline: Instant,
    /// Orders entries of one deadline (the heap needs a total order; slots have none).
    sequence: u64,
    slot: Arc<Slot>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.sequence) == (other.deadline, other.sequence)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.sequence).cmp(&(other.deadline, other.sequence))
    }
}

struct Timer {
    deadlines: Mutex<BinaryHeap<Reverse<Entry>>>,
    earlier: Condvar,
    sequence: AtomicU64,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer { deadlines: Mutex::new(BinaryHeap::new()), earlier: Condvar::new(), sequence: AtomicU64::new(0) }));
        std::thread::Builder::new().name("quarry-timer".into()).spawn(move || timer.run()).expect("spawning the emulation's timer thread");
        timer
    })
}

impl Timer {
    fn add(&self, deadline: Instant, slot: Arc<Slot>) {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let mut deadlines = self.deadlines.lock().expect("timer lock");
        let first = deadlines.peek().is_none_or(|Reverse(head)| deadline < head.deadline);
        deadlines.push(Reverse(Entry { deadline, sequence, slot }));
        if first {
            self.earlier.notify_one();
        }
    }

    fn run(&self) {
        // The kernel may delay a timed wait by its thread's timer slack (50 µs by default).
        // SAFETY: PR_SET_TIMERSLACK takes a nanosecond count and changes only this thread.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
        }
        let mut deadlines = self.deadlines.lock().expect("timer lock");
        let mut due = Vec::new();
        loop {
            let now = Instant::now();
            while deadlines.peek().is_some_and(|Reverse(head)| head.deadline <= now) {
                due.push(deadlines.pop().expect("peeked").0.slot);
            }
            if !due.is_empty() {
                // Woken outside the lock, so sleepers can add deadlines meanwhile.
                drop(deadlines);
                for slot in due.drain(..) {
                    slot.due.store(true, Ordering::Release);
                    if let Some(waker) = slot.waker.lock().expect("sleep slot lock").take() {
                        waker.wake();
                    }
                }
                deadlines = self.deadlines.lock().expect("timer lock");
                continue;
            }
            deadlines = match deadlines.peek().map(|Reverse(head)| head.deadline) {
                None => self.earlier.wait(deadlines).expect("timer lock"),
                Some(next) => self.earlier.wait_timeout(deadlines, next - now).expect("timer lock").0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sleeps end after their deadline, and close to it: tokio's 1 ms tick would miss a
    /// 300 µs sleep by up to 1 ms.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sleeps_end_soon_after_their_deadline() {
        let mut late = Vec::new();
        for _ in 0..50 {
            let started = Instant::now();
            sleep(Duration::from_micros(300)).await;
            let slept = started.elapsed();
            assert!(slept >= Duration::from_micros(300), "slept {slept:?}");
            late.push(slept - Duration::from_micros(300));
        }
        late.sort();
        assert!(late[late.len() / 2] < Duration::from_micros(500), "median lateness {:?}", late[late.len() / 2]);
    }

    /// Many sleepers added in any order (later deadlines before earlier ones, which must
    /// wake the timer early) each wake, none before its deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_sleepers_each_wake_after_their_deadline() {
        let origin = Instant::now() + Duration::from_millis(20);
        let sleepers: Vec<_> = [7u64, 2, 5, 1, 9, 3, 0, 8]
            .into_iter()
            .map(|ms| {
                let deadline = origin + Duration::from_millis(ms);
                tokio::spawn(async move {
                    sleep_until(deadline).await;
                    Instant::now() >= deadline
                })
            })
            .collect();
        for sleeper in sleepers {
            assert!(tokio::time::timeout(Duration::from_secs(5), sleeper).await.expect("a sleeper was never woken").unwrap());
        }
    }
}
