//! A Bloom filter over vertex ids: Algorithm 4's set of the vertices that may affect a vertex
//! whose value changed (Jun 2018, sec. 9.4). It answers "maybe" for every inserted id and, with
//! a small probability, for others; a false "maybe" only makes a vertex scatter needlessly.

/// Bits per expected member: about 0.8% false positives with four hashes.
const BITS_PER_MEMBER: u64 = 10;
/// Hash functions (double hashing of one 64-bit mix).
const HASHES: u32 = 4;

/// A fixed-size Bloom filter of `u64` vertex ids.
#[derive(Debug, Clone)]
pub(crate) struct BloomFilter {
    words: Vec<u64>,
    /// Bit count minus one (a power of two minus one).
    mask: u64,
}

impl BloomFilter {
    /// A filter for up to `members` ids in at most `max_bytes` bytes (at least 64 bits).
    pub(crate) fn new(members: u64, max_bytes: usize) -> Self {
        let wanted = members.saturating_mul(BITS_PER_MEMBER).max(64);
        let cap = (max_bytes as u64).saturating_mul(8).max(64);
        // The largest power of two not above the cap, or the smallest one covering `wanted`.
        let bits = wanted.next_power_of_two().min(1 << (63 - cap.leading_zeros()));
        BloomFilter { words: vec![0; (bits / 64) as usize], mask: bits - 1 }
    }

    /// Bytes the filter holds.
    pub(crate) fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    #[inline]
    fn positions(&self, id: u64) -> impl Iterator<Item = u64> + '_ {
        // SplitMix64 finalizer: two independent halves drive the double hashing.
        let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let (h1, h2) = (z, (z >> 32) | 1);
        (0..HASHES as u64).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & self.mask)
    }

    /// Adds `id`.
    #[inline]
    pub(crate) fn insert(&mut self, id: u64) {
        let positions: [u64; HASHES as usize] = {
            let mut p = [0; HASHES as usize];
            for (slot, bit) in p.iter_mut().zip(self.positions(id)) {
                *slot = bit;
            }
            p
        };
        for bit in positions {
            self.words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    /// Whether `id` may have been added (never false for an added id).
    #[inline]
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.positions(id).all(|bit| self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_always_found_and_others_rarely() {
        let mut filter = BloomFilter::new(10_000, 1 << 20);
        for id in (0..10_000u64).map(|i| i * 7919) {
            filter.insert(id);
        }
        assert!((0..10_000u64).all(|i| filter.contains(i * 7919)));
        let false_positives = (0..100_000u64).map(|i| i * 7919 + 1).filter(|&id| filter.contains(id)).count();
        assert!(false_positives < 2_000, "{false_positives} of 100000");
    }

    #[test]
    fn size_is_capped_by_the_budget() {
        let filter = BloomFilter::new(1 << 30, 4096);
        assert_eq!(filter.bytes(), 4096);
        assert_eq!(BloomFilter::new(3, 1 << 20).bytes(), 8);
    }
}
