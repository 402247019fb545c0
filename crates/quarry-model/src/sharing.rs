//! Fragments that run at once share the link and the host's threads: the placement model
//! prices each fragment alone, and this model stretches those times over a run's schedule.
//!
//! Each fragment brings its demand as priced alone: its time, the part of it on the link, the
//! part decoding on the host (passthrough) and the host threads that decoding keeps busy. While
//! others run, a fragment's link time stretches by the share of the link they use (each the
//! share of its own time alone it spends on the link, times its transfers in flight on it,
//! its partitions, over the fragment's own: the link is shared per transfer, so two link-bound
//! fragments of one partition halve each other's bandwidth and one of two partitions takes two
//! thirds of it beside one of one), and its decoding by how far the host threads it and the
//! others keep busy exceed the host's. A passthrough fragment takes the link and its decoding
//! in turns (as the placement model prices it); a pushdown fragment overlaps them, so only a
//! link that now takes longer than the whole fragment did lengthens it. What is not shared (a
//! pushdown fragment's fixed cost, a device's CPU) keeps its time; a passthrough fragment's
//! fixed cost is the host's work (the placement model counts it in `host_s`), paid first, on
//! one thread, before its first transfer: fragments that start together contend for the host
//! then, not over their whole time (TPC-H SF 10 q08 under kim-isp-2015: `region` and `nation`,
//! 0.6 ms of fixed cost each, took 1.2-1.4 ms opening beside `customer` and `part`). An
//! opening that starts right after another's ended, with no other fragment running, pays less
//! of it, as calibrated (SSB SF 10: `date` opening right after `supplier` took 0.3-0.45 ms,
//! 0.6-0.7 ms as a query's first).
//!
//! The schedule is the run's: when each fragment started (its consumer's first request). From
//! there the fragments progress at their stretched rates, recomputed whenever one starts or
//! ends, so a fragment's own measured time never enters its prediction.

/// A fragment's demand as the placement model priced it alone, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// Its predicted time alone.
    pub seconds: f64,
    /// Of that, sending its bytes over the link.
    pub link_s: f64,
    /// Of that, the host's work (passthrough: decoding, spread over `decode_threads`, and the
    /// fixed cost).
    pub host_s: f64,
    /// Host threads its decoding keeps busy.
    pub decode_threads: f64,
    /// Whether its link time overlaps its other work (pushdown) rather than taking turns with
    /// it (passthrough: a row group's chunks are fetched, then decoded).
    pub overlapped: bool,
    /// Its transfers in flight on the link while it sends: its partitions, each a stream
    /// (below 1 counts as 1).
    pub link_streams: f64,
    /// Of `host_s`, the fixed cost a passthrough fragment pays first, on one host thread.
    pub fixed_s: f64,
    /// How much less that fixed cost is when it opens right after another fragment opened
    /// (within [`WARM_GAP_S`]).
    pub warm_saving_s: f64,
}

/// How soon after another passthrough fragment's opening ended a fragment's opening counts as
/// right after it (warm), seconds, if no other fragment runs as it starts. Not fitted: on SSB
/// SF 10 an opening came 0.1-0.5 ms after another (a star query's dimension scans one after
/// another) or 5 ms and more after, behind the host's other work (a hash table's build, a
/// scan's decoding), which costs it its whole fixed cost, as another fragment running beside
/// it does (TPC-H SF 10 q02 under kim-isp-2015: `nation` and `region` opening one after another
/// beside `part`'s pushdown took 0.7-0.9 ms, the fixed cost 0.6 ms); any gap from 1 to 5 ms
/// tells SSB's and TPC-H's openings apart alike.
pub const WARM_GAP_S: f64 = 2e-3;

impl Demand {
    /// The share of its time alone that it holds the link.
    fn link_use(&self) -> f64 {
        if self.seconds > 0.0 { (self.link_s / self.seconds).min(1.0) } else { 0.0 }
    }

    fn streams(&self) -> f64 {
        self.link_streams.max(1.0)
    }

    /// The transfers it keeps in flight on the link on average over its time alone.
    fn link_load(&self) -> f64 {
        self.link_use() * self.streams()
    }

    /// The host threads it keeps busy on average over its time alone.
    fn host_use(&self) -> f64 {
        if self.seconds > 0.0 { self.decode_threads * (self.host_s / self.seconds).min(1.0) } else { 0.0 }
    }

    /// Its fixed cost paid apart, first: a passthrough fragment's (a pushdown fragment's
    /// overlaps the rest of its work).
    fn opening_s(&self) -> f64 {
        if self.overlapped { 0.0 } else { self.fixed_s.clamp(0.0, self.host_s.min(self.seconds)) }
    }

    /// Its parts in the order they run: a passthrough fragment's opening (its fixed cost, less
    /// `warm_saving_s` if `warm`: host work on one thread), then the rest; a pushdown fragment
    /// in one. Any may take no time.
    fn phases(&self, warm: bool) -> Vec<Demand> {
        let fixed = self.opening_s();
        if fixed <= 0.0 {
            return vec![*self];
        }
        let paid = if warm { (fixed - self.warm_saving_s).max(0.0) } else { fixed };
        let opening = Demand { seconds: paid, link_s: 0.0, host_s: paid, decode_threads: 1.0, overlapped: false, link_streams: 1.0, fixed_s: 0.0, warm_saving_s: 0.0 };
        let rest = Demand { seconds: self.seconds - fixed, host_s: self.host_s - fixed, fixed_s: 0.0, warm_saving_s: 0.0, ..*self };
        vec![opening, rest]
    }

    /// Its time were it to run as long as beside others keeping `link_others` transfers in
    /// flight on the link and `threads_others` of the host's `host_threads` busy.
    fn stretched(&self, link_others: f64, threads_others: f64, host_threads: f64) -> f64 {
        let link = self.link_s * (1.0 + link_others / self.streams());
        let decode = self.host_s * ((self.decode_threads + threads_others) / host_threads.max(1.0)).max(1.0);
        if self.overlapped {
            self.seconds.max(link)
        } else {
            self.seconds - self.link_s - self.host_s + link + decode
        }
    }
}

/// A fragment's way through a run: its phases, set when it starts (whether its opening is
/// warm depends on the openings before it), whether the first is an opening, the one it is in,
/// its progress through that one (0 to 1), and when its opening and it ended.
#[derive(Default)]
struct Progress {
    phases: Vec<Demand>,
    opens_apart: bool,
    phase: usize,
    done: f64,
    opened: Option<f64>,
    ended: Option<f64>,
}

impl Progress {
    fn started(&self) -> bool {
        !self.phases.is_empty()
    }

    fn current(&self) -> &Demand {
        &self.phases[self.phase]
    }

    /// Moves on past the phases it has finished at `now` (and any that take no time).
    fn pass_finished(&mut self, now: f64) {
        // A relative slack: progress summed over steps lands a rounding short of 1.
        while self.ended.is_none() && (self.done >= 1.0 - 1e-9 || self.current().seconds <= 0.0) {
            if self.phase == 0 && self.opens_apart {
                self.opened = Some(now);
            }
            if self.phase + 1 < self.phases.len() {
                (self.phase, self.done) = (self.phase + 1, 0.0);
            } else {
                self.ended = Some(now);
            }
        }
    }
}

/// Each fragment's predicted time in a run where fragment `i` started at `starts[i]` seconds,
/// on a host of `host_threads` threads; `demands` and `starts` have one entry per fragment.
pub fn in_run(demands: &[Demand], starts: &[f64], host_threads: f64) -> Vec<f64> {
    assert_eq!(demands.len(), starts.len(), "a start per fragment");
    let n = demands.len();
    let mut runs: Vec<Progress> = (0..n).map(|_| Progress::default()).collect();
    let mut now = starts.iter().copied().fold(f64::INFINITY, f64::min);
    while runs.iter().any(|run| run.ended.is_none()) {
        // Steps stop at every start, so a fragment starts at `now`.
        let starting: Vec<usize> = (0..n).filter(|&i| !runs[i].started() && starts[i] <= now).collect();
        // Warm: right after another's opening, with no other fragment on the host.
        let others_running = (0..n).filter(|&i| starts[i] <= now && runs[i].ended.is_none()).count() > 1;
        for i in starting {
            let opens_apart = demands[i].opening_s() > 0.0;
            let warm = opens_apart && !others_running && runs.iter().filter_map(|run| run.opened).any(|at| now - at <= WARM_GAP_S);
            (runs[i].phases, runs[i].opens_apart) = (demands[i].phases(warm), opens_apart);
            runs[i].pass_finished(now);
        }
        let running: Vec<usize> = (0..n).filter(|&i| runs[i].started() && runs[i].ended.is_none()).collect();
        let next_start = (0..n).filter(|&i| starts[i] > now).map(|i| starts[i]).fold(f64::INFINITY, f64::min);
        if running.is_empty() {
            now = next_start;
            continue;
        }
        let (link_all, threads_all): (f64, f64) = running.iter().fold((0.0, 0.0), |(l, t), &i| (l + runs[i].current().link_load(), t + runs[i].current().host_use()));
        // Each running fragment's rate of progress through its phase while the running set
        // and their phases stay as they are.
        let rates: Vec<f64> = running
            .iter()
            .map(|&i| {
                let d = runs[i].current();
                1.0 / d.stretched(link_all - d.link_load(), threads_all - d.host_use(), host_threads)
            })
            .collect();
        let to_end = running.iter().zip(&rates).map(|(&i, rate)| (1.0 - runs[i].done) / rate).fold(f64::INFINITY, f64::min);
        let step = to_end.min(next_start - now);
        now += step;
        for (&i, rate) in running.iter().zip(&rates) {
            runs[i].done += rate * step;
            runs[i].pass_finished(now);
        }
    }
    runs.iter().zip(starts).map(|(run, start)| run.ended.expect("every fragment ended") - start).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passthrough(seconds: f64, link_s: f64, host_s: f64, decode_threads: f64) -> Demand {
        Demand { seconds, link_s, host_s, decode_threads, overlapped: false, link_streams: 1.0, fixed_s: 0.0, warm_saving_s: 0.0 }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn a_fragment_alone_takes_its_time_alone() {
        let times = in_run(&[passthrough(2.0, 1.5, 0.4, 2.0)], &[3.0], 2.0);
        assert!(close(times[0], 2.0), "{times:?}");
    }

    #[test]
    fn two_link_bound_fragments_share_the_link_until_the_shorter_ends() {
        // Both all link, together from 0: the short one sends its 1 s at half the bandwidth
        // (2 s), the long one has 3 s of its 4 left, then sends alone: 5 s.
        let link = |s| passthrough(s, s, 0.0, 1.0);
        let times = in_run(&[link(1.0), link(4.0)], &[0.0, 0.0], 2.0);
        assert!(close(times[0], 2.0) && close(times[1], 5.0), "{times:?}");
    }

    #[test]
    fn the_link_is_shared_per_transfer_in_flight() {
        // A one-partition fragment of 1 s on the link beside a two-partition one of 6 s: it
        // gets a third of the link (3 s); in those 3 s the other sends 2 s of its 6 s at two
        // thirds, then the last 4 s alone (7 s).
        let link = |s, streams| Demand { link_streams: streams, ..passthrough(s, s, 0.0, 1.0) };
        let times = in_run(&[link(1.0, 1.0), link(6.0, 2.0)], &[0.0, 0.0], 2.0);
        assert!(close(times[0], 3.0) && close(times[1], 7.0), "{times:?}");
    }

    #[test]
    fn fragments_opening_together_share_the_host_threads_while_they_open() {
        // Three passthrough fragments of 1 s of fixed cost each open at once on two threads:
        // 1.5 s each. Priced over their whole time, the one with 9 s of link after its opening
        // kept a tenth of a thread busy and slowed the other two by only 5%.
        let opening = Demand { fixed_s: 1.0, ..passthrough(1.0, 0.0, 1.0, 1.0) };
        let long = Demand { fixed_s: 1.0, ..passthrough(10.0, 9.0, 1.0, 1.0) };
        let times = in_run(&[opening, opening, long], &[0.0, 0.0, 0.0], 2.0);
        assert!(close(times[0], 1.5) && close(times[1], 1.5) && close(times[2], 10.5), "{times:?}");
    }

    #[test]
    fn an_opening_right_after_another_pays_less_of_its_fixed_cost() {
        // Openings of 1 s, 0.4 s of it saved warm. The first is cold; the second starts 1 ms
        // after the first's opening ended: 0.6 s; the third starts 0.1 s after the second
        // ended, too late: 1 s. Two opening together on one thread are not after an opening:
        // 2 s each.
        let opening = Demand { fixed_s: 1.0, warm_saving_s: 0.4, ..passthrough(1.0, 0.0, 1.0, 1.0) };
        let times = in_run(&[opening, opening, opening], &[0.0, 1.001, 1.701], 2.0);
        assert!(close(times[0], 1.0) && close(times[1], 0.6) && close(times[2], 1.0), "{times:?}");
        let times = in_run(&[opening, opening], &[0.0, 0.0], 1.0);
        assert!(close(times[0], 2.0) && close(times[1], 2.0), "{times:?}");
        // Right after an opening but beside a fragment still running (from 0 to 10 s on the
        // link): cold.
        let times = in_run(&[opening, passthrough(10.0, 10.0, 0.0, 1.0), opening], &[0.0, 0.0, 1.001], 2.0);
        assert!(close(times[2], 1.0), "{times:?}");
        // A fragment's link time after its opening is not saved.
        let long = Demand { fixed_s: 1.0, warm_saving_s: 0.4, ..passthrough(3.0, 2.0, 1.0, 1.0) };
        let times = in_run(&[opening, long], &[0.0, 1.0], 2.0);
        assert!(close(times[1], 2.6), "{times:?}");
    }

    #[test]
    fn fragments_that_do_not_overlap_do_not_slow_each_other() {
        let link = |s| passthrough(s, s, 0.0, 1.0);
        let times = in_run(&[link(1.0), link(1.0)], &[0.0, 1.5], 2.0);
        assert!(close(times[0], 1.0) && close(times[1], 1.0), "{times:?}");
    }

    #[test]
    fn decoding_stretches_only_when_the_host_threads_run_out() {
        // Two fragments of 1 s of decoding on one thread each fit a two-thread host...
        let decode = passthrough(1.0, 0.0, 1.0, 1.0);
        let times = in_run(&[decode, decode], &[0.0, 0.0], 2.0);
        assert!(close(times[0], 1.0) && close(times[1], 1.0), "{times:?}");
        // ... and on two threads each they want four: each takes twice as long.
        let wide = passthrough(1.0, 0.0, 1.0, 2.0);
        let times = in_run(&[wide, wide], &[0.0, 0.0], 2.0);
        assert!(close(times[0], 2.0) && close(times[1], 2.0), "{times:?}");
    }

    #[test]
    fn a_pushdown_fragment_hides_a_slower_link_behind_its_device_work() {
        // Device-bound (1 s, of which 0.2 s of link overlapped): beside a link-bound passthrough
        // its link time doubles to 0.4 s, still under its device time.
        let pushdown = Demand { seconds: 1.0, link_s: 0.2, host_s: 0.0, decode_threads: 0.0, overlapped: true, link_streams: 1.0, fixed_s: 0.0, warm_saving_s: 0.0 };
        let times = in_run(&[pushdown, passthrough(10.0, 10.0, 0.0, 1.0)], &[0.0, 0.0], 2.0);
        assert!(close(times[0], 1.0), "{times:?}");
        // The passthrough sends at 1/1.2 of its rate for that second: 1/12 of it is done, then
        // the rest alone.
        assert!(close(times[1], 1.0 + 10.0 * (1.0 - 1.0 / 12.0)), "{times:?}");
    }
}
