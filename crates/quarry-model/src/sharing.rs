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
//! 0.6 ms of fixed cost each, took 1.2-1.4 ms opening beside `customer` and `part`).
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
}

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

    /// Its parts in the order they run: a passthrough fragment's fixed cost (host work on one
    /// thread), then the rest; a pushdown fragment in one.
    fn phases(&self) -> Vec<Demand> {
        let fixed = self.fixed_s.clamp(0.0, self.host_s.min(self.seconds));
        if self.overlapped || fixed <= 0.0 {
            return vec![*self];
        }
        let opening = Demand { seconds: fixed, link_s: 0.0, host_s: fixed, decode_threads: 1.0, overlapped: false, link_streams: 1.0, fixed_s: 0.0 };
        let rest = Demand { seconds: self.seconds - fixed, host_s: self.host_s - fixed, fixed_s: 0.0, ..*self };
        if rest.seconds > 0.0 { vec![opening, rest] } else { vec![opening] }
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

/// Each fragment's predicted time in a run where fragment `i` started at `starts[i]` seconds,
/// on a host of `host_threads` threads; `demands` and `starts` have one entry per fragment.
pub fn in_run(demands: &[Demand], starts: &[f64], host_threads: f64) -> Vec<f64> {
    assert_eq!(demands.len(), starts.len(), "a start per fragment");
    let n = demands.len();
    let phases: Vec<Vec<Demand>> = demands.iter().map(Demand::phases).collect();
    // Each fragment's current phase, its progress through it (0 to 1), and when it ended.
    let mut phase = vec![0_usize; n];
    let mut done = vec![0.0_f64; n];
    let mut ended: Vec<Option<f64>> = vec![None; n];
    let mut now = starts.iter().copied().fold(f64::INFINITY, f64::min);
    for i in 0..n {
        // A fragment that asks nothing ends where it starts.
        if demands[i].seconds <= 0.0 {
            ended[i] = Some(starts[i]);
        }
    }
    while ended.iter().any(Option::is_none) {
        let running: Vec<usize> = (0..n).filter(|&i| ended[i].is_none() && starts[i] <= now).collect();
        let next_start = (0..n).filter(|&i| starts[i] > now).map(|i| starts[i]).fold(f64::INFINITY, f64::min);
        if running.is_empty() {
            now = next_start;
            continue;
        }
        let current = |i: usize| &phases[i][phase[i]];
        let (link_all, threads_all): (f64, f64) = running.iter().fold((0.0, 0.0), |(l, t), &i| (l + current(i).link_load(), t + current(i).host_use()));
        // Each running fragment's rate of progress through its phase while the running set
        // and their phases stay as they are.
        let rates: Vec<f64> = running
            .iter()
            .map(|&i| {
                let d = current(i);
                1.0 / d.stretched(link_all - d.link_load(), threads_all - d.host_use(), host_threads)
            })
            .collect();
        let to_end = running.iter().zip(&rates).map(|(&i, rate)| (1.0 - done[i]) / rate).fold(f64::INFINITY, f64::min);
        let step = to_end.min(next_start - now);
        now += step;
        for (&i, rate) in running.iter().zip(&rates) {
            done[i] += rate * step;
            // A relative slack: progress summed over steps lands a rounding short of 1.
            if done[i] >= 1.0 - 1e-9 {
                if phase[i] + 1 < phases[i].len() {
                    (phase[i], done[i]) = (phase[i] + 1, 0.0);
                } else {
                    ended[i] = Some(now);
                }
            }
        }
    }
    ended.iter().zip(starts).map(|(end, start)| end.expect("every fragment ended") - start).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passthrough(seconds: f64, link_s: f64, host_s: f64, decode_threads: f64) -> Demand {
        Demand { seconds, link_s, host_s, decode_threads, overlapped: false, link_streams: 1.0, fixed_s: 0.0 }
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
        let pushdown = Demand { seconds: 1.0, link_s: 0.2, host_s: 0.0, decode_threads: 0.0, overlapped: true, link_streams: 1.0, fixed_s: 0.0 };
        let times = in_run(&[pushdown, passthrough(10.0, 10.0, 0.0, 1.0)], &[0.0, 0.0], 2.0);
        assert!(close(times[0], 1.0), "{times:?}");
        // The passthrough sends at 1/1.2 of its rate for that second: 1/12 of it is done, then
        // the rest alone.
        assert!(close(times[1], 1.0 + 10.0 * (1.0 - 1.0 / 12.0)), "{times:?}");
    }
}
