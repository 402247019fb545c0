//! A fragment's measured time, which `quarry model check` sets against the placement model's
//! prediction: the time during which at least one of its partitions' consumers was waiting
//! for it (asked for a batch that had not come), from each partition's admission on its node.
//!
//! Why the union of the waits: a fragment's partitions run at once and share the device's link
//! and threads. While one partition's consumer works on a batch (a star probe, a join), the
//! other partition's transfer holds the link, so each partition alone waits for less than the
//! fragment took (SSB q1.1 under kim-isp-2015: the longest partition's waits 1.19 s, the link
//! 1.4 s). The fragment is done in the time some consumer was kept waiting for it; the time
//! every consumer spent elsewhere is theirs. Admission queueing (a node's slots held by other
//! fragments of the query) is left out: the model prices a fragment as it runs.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use datafusion::error::Result;
use datafusion::physical_plan::metrics::Time;
use futures::{Stream, StreamExt};
use quarry_storage::ScanMessage;

/// The waits of a fragment's partitions, as they happen.
#[derive(Debug, Default)]
pub struct FragmentTiming {
    state: Mutex<Waits>,
}

#[derive(Debug, Default)]
struct Waits {
    /// Each wait: the partition, when its consumer asked, when the item came.
    intervals: Vec<(usize, Instant, Instant)>,
    /// Per partition that ended, when its node admitted it (its first ask plus its queueing).
    admitted: Vec<(usize, Instant)>,
}

impl FragmentTiming {
    /// The fragment's measured time: the union of its partitions' waits, each from the
    /// partition's admission on; `None` before any partition ended.
    pub fn measured(&self) -> Option<Duration> {
        let state = self.state.lock().expect("timing lock");
        if state.admitted.is_empty() {
            return None;
        }
        let admitted = |partition: usize| state.admitted.iter().find(|(p, _)| *p == partition).map(|(_, at)| *at);
        let mut waits: Vec<(Instant, Instant)> = state
            .intervals
            .iter()
            .filter_map(|&(partition, from, to)| {
                let from = admitted(partition).map_or(from, |at| from.max(at));
                (from < to).then_some((from, to))
            })
            .collect();
        waits.sort_unstable();
        let mut total = Duration::ZERO;
        let mut current: Option<(Instant, Instant)> = None;
        for (from, to) in waits {
            current = match current {
                Some((start, end)) if from <= end => Some((start, end.max(to))),
                Some((start, end)) => {
                    total += end - start;
                    Some((from, to))
                }
                None => Some((from, to)),
            };
        }
        Some(total + current.map_or(Duration::ZERO, |(start, end)| end - start))
    }

    /// Partition `partition`'s response stream, timed into this fragment's waits; the time
    /// spent in its polls goes to `time` (the host's own work on the fragment's output: a poll
    /// that waits for the node returns at once).
    pub fn timed<S>(self: &Arc<Self>, partition: usize, inner: S, time: Time) -> TimedPolls<S> {
        TimedPolls { inner, time, partition, first_ask: None, asked: None, queued: Duration::ZERO, timing: Arc::clone(self) }
    }
}

/// A partition's response stream, timed (see [`FragmentTiming::timed`]).
pub struct TimedPolls<S> {
    inner: S,
    time: Time,
    partition: usize,
    /// When the consumer first asked (the fragment's request went out).
    first_ask: Option<Instant>,
    /// When the consumer asked for the item not yet delivered.
    asked: Option<Instant>,
    /// How long the node queued the partition before admitting it (from its statistics).
    queued: Duration,
    timing: Arc<FragmentTiming>,
}

impl<S: Stream<Item = Result<ScanMessage>> + Unpin> Stream for TimedPolls<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let asked = *this.asked.get_or_insert_with(Instant::now);
        this.first_ask.get_or_insert(asked);
        let polled = {
            let _timer = this.time.timer();
            this.inner.poll_next_unpin(cx)
        };
        if let Poll::Ready(item) = &polled {
            let now = Instant::now();
            this.asked = None;
            let mut state = this.timing.state.lock().expect("timing lock");
            state.intervals.push((this.partition, asked, now));
            match item {
                Some(Ok(ScanMessage::Finished(stats))) => this.queued = Duration::from_nanos(stats.queued_ns),
                None => {
                    let first = this.first_ask.unwrap_or(asked);
                    state.admitted.push((this.partition, first + this.queued));
                }
                _ => {}
            }
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(origin: Instant, ms: u64) -> Instant {
        origin + Duration::from_millis(ms)
    }

    /// Overlapping waits of two partitions count once, gaps not at all, and a partition's
    /// waits before its admission are left out.
    #[test]
    fn measured_is_the_union_of_waits_after_admission() {
        let o = Instant::now();
        let timing = FragmentTiming::default();
        assert_eq!(timing.measured(), None);
        {
            let mut state = timing.state.lock().unwrap();
            // Partition 0 waits 0-100 (admitted at 40), then 150-200; partition 1 waits
            // 180-260 and 300-310.
            state.intervals.extend([(0, at(o, 0), at(o, 100)), (0, at(o, 150), at(o, 200)), (1, at(o, 180), at(o, 260)), (1, at(o, 300), at(o, 310))]);
            state.admitted.push((0, at(o, 40)));
        }
        // 40-100, 150-260, 300-310.
        assert_eq!(timing.measured(), Some(Duration::from_millis(60 + 110 + 10)));
        timing.state.lock().unwrap().admitted.push((1, at(o, 250)));
        // Partition 1 from 250: 40-100, 150-200, 250-260, 300-310.
        assert_eq!(timing.measured(), Some(Duration::from_millis(60 + 50 + 10 + 10)));
    }
}
