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

/// The waits of a fragment's partitions, as they happen, in bounded memory: a partition's
/// first wait (which holds its admission) is kept until its admission is known; the later
/// waits are merged as they come, and folded into a total once no wait can overlap them.
#[derive(Debug, Default)]
pub struct FragmentTiming {
    state: Mutex<Waits>,
}

#[derive(Debug, Default)]
struct Waits {
    /// Asks not yet answered: the partition and when it asked (at most one each).
    pending: Vec<(usize, Instant)>,
    /// Each partition's first wait: the partition, when it asked, when its first item came.
    first: Vec<(usize, Instant, Instant)>,
    /// Per partition that ended, when its node admitted it.
    admitted: Vec<(usize, Instant)>,
    /// The later waits' union, disjoint and in order, not yet folded.
    later: Vec<(Instant, Instant)>,
    /// The later waits folded away: after every first wait, before every pending ask.
    folded: Duration,
    /// The first ask of any partition and the last item of any: when the fragment ran.
    span: Option<(Instant, Instant)>,
}

/// Later waits kept before they are folded.
const LATER_WAITS_KEPT: usize = 64;

impl Waits {
    fn ask(&mut self, partition: usize, at: Instant) {
        self.span = Some(self.span.map_or((at, at), |(start, end)| (start.min(at), end)));
        self.pending.retain(|(p, _)| *p != partition);
        self.pending.push((partition, at));
    }

    /// Partition `partition`'s item came at `at`; `first` if it was its first.
    fn came(&mut self, partition: usize, first: bool, at: Instant) {
        let Some(i) = self.pending.iter().position(|(p, _)| *p == partition) else { return };
        let (_, asked) = self.pending.swap_remove(i);
        self.span = self.span.map(|(start, end)| (start, end.max(at)));
        if first {
            self.first.push((partition, asked, at));
            return;
        }
        // Items come in time order (under the lock): a later wait ends after every one kept,
        // and merges with those it overlaps at the end.
        let mut from = asked;
        while let Some(&(start, end)) = self.later.last() {
            if end < from {
                break;
            }
            from = from.min(start);
            self.later.pop();
        }
        self.later.push((from, at));
        if self.later.len() > LATER_WAITS_KEPT {
            self.fold(at);
        }
    }

    /// Folds the later waits no wait still to come or kept apart can overlap: those after
    /// every first wait (which may yet be cut at its admission) and before every pending ask.
    fn fold(&mut self, now: Instant) {
        let horizon = self.pending.iter().map(|(_, at)| *at).fold(now, Instant::min);
        let Some(after_first) = self.first.iter().map(|(_, _, came)| *came).max() else { return };
        let mut folded = Duration::ZERO;
        self.later.retain(|&(start, end)| {
            let fold = start >= after_first && end <= horizon;
            if fold {
                folded += end - start;
            }
            !fold
        });
        self.folded += folded;
    }
}

impl FragmentTiming {
    /// The fragment's measured time: the union of its partitions' waits, each partition's from
    /// its admission on; `None` before any partition ended.
    pub fn measured(&self) -> Option<Duration> {
        let state = self.state.lock().expect("timing lock");
        if state.admitted.is_empty() {
            return None;
        }
        let admitted = |partition: usize| state.admitted.iter().find(|(p, _)| *p == partition).map(|(_, at)| *at);
        let firsts = state.first.iter().filter_map(|&(partition, from, to)| {
            let from = admitted(partition).map_or(from, |at| from.max(at));
            (from < to).then_some((from, to))
        });
        let mut waits: Vec<(Instant, Instant)> = firsts.chain(state.later.iter().copied()).collect();
        waits.sort_unstable();
        let mut total = state.folded;
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

    /// When the fragment ran: its first partition's first ask to its last item.
    pub fn span(&self) -> Option<(Instant, Instant)> {
        self.state.lock().expect("timing lock").span
    }

    /// Partition `partition`'s response stream, timed into this fragment's waits; the time
    /// spent in its polls goes to `time` (the host's own work on the fragment's output: a poll
    /// that waits for the node returns at once).
    pub fn timed<S>(self: &Arc<Self>, partition: usize, inner: S, time: Time) -> TimedPolls<S> {
        TimedPolls { inner, time, partition, first_ask: None, asked: None, delivered: false, queued: Duration::ZERO, timing: Arc::clone(self) }
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
    /// Whether an item came already.
    delivered: bool,
    /// How long the node queued the partition before admitting it (from its statistics).
    queued: Duration,
    timing: Arc<FragmentTiming>,
}

impl<S: Stream<Item = Result<ScanMessage>> + Unpin> Stream for TimedPolls<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.asked.is_none() {
            let now = Instant::now();
            this.asked = Some(now);
            this.first_ask.get_or_insert(now);
            this.timing.state.lock().expect("timing lock").ask(this.partition, now);
        }
        let polled = {
            let _timer = this.time.timer();
            this.inner.poll_next_unpin(cx)
        };
        if let Poll::Ready(item) = &polled {
            let now = Instant::now();
            this.asked = None;
            let mut state = this.timing.state.lock().expect("timing lock");
            state.came(this.partition, !this.delivered, now);
            this.delivered = true;
            match item {
                Some(Ok(ScanMessage::Finished(stats))) => this.queued = Duration::from_nanos(stats.queued_ns),
                None => {
                    let first = this.first_ask.unwrap_or(now);
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
    /// first wait counts from its admission.
    #[test]
    fn measured_is_the_union_of_waits_after_admission() {
        let o = Instant::now();
        let timing = FragmentTiming::default();
        assert_eq!(timing.measured(), None);
        {
            let mut state = timing.state.lock().unwrap();
            // Partition 0 waits 0-100 (its first item; admitted at 40), then 150-200;
            // partition 1 waits 180-260 (its first) and 300-310.
            state.ask(0, at(o, 0));
            state.ask(1, at(o, 180));
            state.came(0, true, at(o, 100));
            state.ask(0, at(o, 150));
            state.came(0, false, at(o, 200));
            state.came(1, true, at(o, 260));
            state.ask(1, at(o, 300));
            state.came(1, false, at(o, 310));
            state.admitted.push((0, at(o, 40)));
        }
        // 40-100, 150-260, 300-310.
        assert_eq!(timing.measured(), Some(Duration::from_millis(60 + 110 + 10)));
        timing.state.lock().unwrap().admitted.push((1, at(o, 250)));
        // Partition 1 from 250: 40-100, 150-200, 250-260, 300-310.
        assert_eq!(timing.measured(), Some(Duration::from_millis(60 + 50 + 10 + 10)));
    }

    /// Many waits are folded as they come, keeping memory bounded, and add up the same.
    #[test]
    fn later_waits_fold_into_the_same_total() {
        let o = Instant::now();
        let timing = FragmentTiming::default();
        {
            let mut state = timing.state.lock().unwrap();
            state.ask(0, at(o, 0));
            state.came(0, true, at(o, 5));
            state.ask(1, at(o, 0));
            state.came(1, true, at(o, 7));
            // Partition 0 waits 10-12, 20-22, ...; partition 1 waits 11-14, 21-24, ...: each
            // period of 10 ms holds 4 ms of waiting.
            for period in 1..=1000u64 {
                let base = period * 10;
                state.ask(0, at(o, base));
                state.ask(1, at(o, base + 1));
                state.came(0, false, at(o, base + 2));
                state.came(1, false, at(o, base + 4));
                assert!(state.later.len() <= LATER_WAITS_KEPT + 1, "{} waits kept", state.later.len());
            }
            assert!(state.folded > Duration::ZERO);
            state.admitted.extend([(0, at(o, 0)), (1, at(o, 0))]);
        }
        assert_eq!(timing.measured(), Some(Duration::from_millis(7 + 1000 * 4)));
    }
}
