//! The k-way merge-reducer: a loser tree over sorted inputs that applies the reduce function to
//! records with equal keys as they leave the tree.
//!
//! **Errata (Jun 2018, sec. 7.2.2).** The paper's hardware merger "flushes without comparison" the
//! remaining input once the other is empty. Taken literally in a merge *tree* that is unsafe: an
//! input that is empty *for now* is not necessarily finished, and a subtree that flushes its
//! survivor can emit keys out of order with respect to a sibling that still holds smaller keys.
//! Here an exhausted input never leaves the tree: its head becomes `None`, which compares as
//! +infinity against every key, so it simply loses every match. The merge ends only when the
//! overall winner is `None`, i.e. every input is exhausted. No input is ever drained without
//! comparison.

use crate::budget::Reservation;
use crate::codec::{Key, Value};
use crate::error::Result;
use crate::run::RunReader;

/// One sorted input of a merge.
pub(crate) enum Input<K, V> {
    /// A run file being streamed.
    Run(RunReader<K, V>),
    /// `mem[pos..end]` of the merger's in-memory buffer.
    Mem { pos: usize, end: usize },
    /// Exhausted (a run reader is dropped, deleting its file and releasing its buffer).
    Done,
}

/// Merges sorted inputs, reducing equal keys with the caller's function.
pub(crate) struct Merger<K, V> {
    inputs: Vec<Input<K, V>>,
    /// Current head of each input; `None` is +infinity (exhausted).
    heads: Vec<Option<(K, V)>>,
    /// `tree[0]` is the index of the winning input, `tree[1..k]` hold the losers of each match.
    tree: Vec<usize>,
    mem: Vec<(K, V)>,
    mem_reservation: Option<Reservation>,
    /// Bytes read by run readers already closed.
    closed_bytes_read: u64,
}

impl<K: Key, V: Value> Merger<K, V> {
    /// A merger over `inputs`; `Input::Mem` ranges index into `mem`, whose memory is accounted by
    /// `mem_reservation` (released with the merger).
    pub(crate) fn new(
        inputs: Vec<Input<K, V>>,
        mem: Vec<(K, V)>,
        mem_reservation: Option<Reservation>,
    ) -> Result<Self> {
        let k = inputs.len();
        let mut merger = Merger {
            inputs,
            heads: vec![None; k],
            tree: vec![0; k.max(1)],
            mem,
            mem_reservation,
            closed_bytes_read: 0,
        };
        for i in 0..k {
            merger.heads[i] = merger.pull(i)?;
        }
        if k > 0 {
            merger.tree[0] = merger.build(1);
        }
        Ok(merger)
    }

    /// Plays the matches of the subtree rooted at `node`, returning its winner.
    fn build(&mut self, node: usize) -> usize {
        let k = self.inputs.len();
        if node >= k {
            return node - k;
        }
        let left = self.build(2 * node);
        let right = self.build(2 * node + 1);
        if self.beats(left, right) {
            self.tree[node] = right;
            left
        } else {
            self.tree[node] = left;
            right
        }
    }

    /// Whether input `a`'s head goes out before input `b`'s. Exhausted inputs are +infinity;
    /// ties go to the lower input index, so the merge is deterministic.
    #[inline(always)]
    fn beats(&self, a: usize, b: usize) -> bool {
        match (&self.heads[a], &self.heads[b]) {
            (Some(x), Some(y)) => x.0 < y.0 || (x.0 == y.0 && a < b),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => a < b,
        }
    }

    /// Re-plays the path from input `leaf` (whose head changed) to the root.
    #[inline(always)]
    fn replay(&mut self, leaf: usize) {
        let mut winner = leaf;
        let mut node = (leaf + self.inputs.len()) / 2;
        while node > 0 {
            let other = self.tree[node];
            if self.beats(other, winner) {
                self.tree[node] = winner;
                winner = other;
            }
            node /= 2;
        }
        self.tree[0] = winner;
    }

    /// The next record of input `i`, closing it when exhausted.
    #[inline(always)]
    fn pull(&mut self, i: usize) -> Result<Option<(K, V)>> {
        match &mut self.inputs[i] {
            Input::Mem { pos, end } => {
                if *pos < *end {
                    let item = self.mem[*pos];
                    *pos += 1;
                    Ok(Some(item))
                } else {
                    Ok(None)
                }
            }
            Input::Run(reader) => {
                let item = reader.next()?;
                if item.is_none() {
                    self.closed_bytes_read += reader.bytes_read();
                    self.inputs[i] = Input::Done;
                }
                Ok(item)
            }
            Input::Done => Ok(None),
        }
    }

    /// Advances input `i` past its head.
    #[inline(always)]
    fn advance(&mut self, i: usize) -> Result<()> {
        self.heads[i] = self.pull(i)?;
        self.replay(i);
        Ok(())
    }

    /// The next key with all of its values (from every input) combined by `reduce`, in input
    /// order; `None` once every input is exhausted.
    #[inline]
    pub(crate) fn next_reduced<F: Fn(V, V) -> V>(&mut self, reduce: &F) -> Result<Option<(K, V)>> {
        if self.inputs.is_empty() {
            return Ok(None);
        }
        let winner = self.tree[0];
        // The winner is +infinity only when every input is.
        let Some((key, mut value)) = self.heads[winner] else {
            return Ok(None);
        };
        self.advance(winner)?;
        loop {
            let winner = self.tree[0];
            match self.heads[winner] {
                Some((k, v)) if k == key => {
                    value = reduce(value, v);
                    self.advance(winner)?;
                }
                _ => return Ok(Some((key, value))),
            }
        }
    }

    /// Bytes read from run files so far.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.closed_bytes_read
            + self
                .inputs
                .iter()
                .map(|input| match input {
                    Input::Run(reader) => reader.bytes_read(),
                    _ => 0,
                })
                .sum::<u64>()
    }

    /// Ends the merge and returns the in-memory buffer and its reservation (for reuse).
    pub(crate) fn into_mem(self) -> (Vec<(K, V)>, Option<Reservation>) {
        (self.mem, self.mem_reservation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Merges sorted slices (stored back to back in one buffer) with a sum.
    fn merge_slices(parts: &[Vec<(u32, u64)>]) -> Vec<(u32, u64)> {
        let mut mem = Vec::new();
        let mut inputs = Vec::new();
        for part in parts {
            let pos = mem.len();
            mem.extend_from_slice(part);
            inputs.push(Input::Mem {
                pos,
                end: mem.len(),
            });
        }
        let mut merger = Merger::new(inputs, mem, None).unwrap();
        let mut out = Vec::new();
        while let Some(item) = merger.next_reduced(&|a: u64, b: u64| a + b).unwrap() {
            out.push(item);
        }
        assert_eq!(merger.next_reduced(&|a: u64, b: u64| a + b).unwrap(), None);
        out
    }

    fn reference(parts: &[Vec<(u32, u64)>]) -> Vec<(u32, u64)> {
        let mut map = std::collections::BTreeMap::new();
        for (k, v) in parts.iter().flatten() {
            *map.entry(*k).or_insert(0) += v;
        }
        map.into_iter().collect()
    }

    #[test]
    fn no_inputs_and_empty_inputs() {
        assert!(merge_slices(&[]).is_empty());
        assert!(merge_slices(&[vec![], vec![], vec![]]).is_empty());
        assert_eq!(merge_slices(&[vec![(4, 1)]]), vec![(4, 1)]);
        assert_eq!(merge_slices(&[vec![], vec![(4, 1)], vec![]]), vec![(4, 1)]);
    }

    /// One input ends long before the others (the errata case): the remaining inputs must still
    /// be compared with each other, and an exhausted input's last key must not leak out of order.
    #[test]
    fn exhausted_input_is_plus_infinity() {
        let short = vec![(1, 1)];
        let a: Vec<_> = (0..200).map(|i| (2 * i, 1)).collect();
        let b: Vec<_> = (0..200).map(|i| (2 * i + 1, 1)).collect();
        let c: Vec<_> = (0..100).map(|i| (4 * i, 10)).collect();
        for order in [
            vec![short.clone(), a.clone(), b.clone(), c.clone()],
            vec![a.clone(), b.clone(), c.clone(), short.clone()],
            vec![a.clone(), short.clone(), b.clone()],
            vec![short.clone(), a.clone()],
            vec![a.clone(), short.clone()],
        ] {
            let out = merge_slices(&order);
            assert_eq!(out, reference(&order));
            assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
        }
        // The last key of the longest input is larger than everything else.
        let tail = vec![(10_000, 5)];
        let parts = vec![a.clone(), tail, b.clone()];
        assert_eq!(merge_slices(&parts).last(), Some(&(10_000, 5)));
    }

    #[test]
    fn duplicates_across_and_within_inputs_are_reduced() {
        let parts = vec![
            vec![(1, 1), (1, 2), (5, 3)],
            vec![(1, 10), (5, 10), (5, 10), (9, 1)],
            vec![(5, 100)],
            vec![(0, 7), (9, 9)],
            vec![(1, 1000)],
        ];
        assert_eq!(
            merge_slices(&parts),
            vec![(0, 7), (1, 1013), (5, 123), (9, 10)]
        );
    }

    #[test]
    fn random_fan_ins_match_reference() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for k in 1..=17 {
            let parts: Vec<Vec<(u32, u64)>> = (0..k)
                .map(|_| {
                    let len = (next() % 300) as usize;
                    let mut v: Vec<_> = (0..len)
                        .map(|_| ((next() % 500) as u32, next() % 1000))
                        .collect();
                    v.sort_by_key(|e| e.0);
                    v
                })
                .collect();
            assert_eq!(merge_slices(&parts), reference(&parts), "k = {k}");
        }
    }
}
