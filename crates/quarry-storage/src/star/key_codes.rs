//! Integer keys with their group codes, in the fewest bytes that travel well: the keys as a
//! bitmap over their range where that is smaller than listing them, the codes packed in as few
//! bits as the groups need. Both a dimension a node builds for the host and a lookup the host
//! ships back in a fragment travel this way: SSB q4.2's 320K part keys among 800K, in ten
//! groups, take 100 KB of bits and 160 KB of codes, where a dense byte table was 800 KB and the
//! keys as Arrow `Int32`s 1.3 MB.

use datafusion::common::{Result, plan_err};

use super::wire::{WireReader, WireWriter};

/// A bitmap is used while it takes at most a listing's bytes (8 per key): a range up to 64
/// slots per key.
const SLOTS_PER_KEY: u128 = 64;

const BITMAP: u8 = 0;
const LIST: u8 = 1;

/// Bits a code below `groups` takes (none for one group).
pub fn code_bits(groups: u32) -> u32 {
    if groups <= 1 { 0 } else { u32::BITS - (groups - 1).leading_zeros() }
}

/// Writes `pairs` (sorted by key, keys unique), whose codes are below `groups`.
pub fn encode(out: &mut WireWriter, pairs: &[(i64, u32)], groups: u32) {
    debug_assert!(pairs.windows(2).all(|w| w[0].0 < w[1].0), "keys sorted and unique");
    debug_assert!(pairs.iter().all(|&(_, c)| c < groups.max(1)), "codes below {groups}");
    out.u64(pairs.len() as u64);
    let range = match (pairs.first(), pairs.last()) {
        (Some(first), Some(last)) => (last.0 as i128 - first.0 as i128 + 1) as u128,
        _ => u128::MAX,
    };
    if range <= SLOTS_PER_KEY * pairs.len() as u128 {
        let min = pairs[0].0;
        let mut words = vec![0u64; (range as usize).div_ceil(64)];
        for &(key, _) in pairs {
            let slot = key.wrapping_sub(min) as u64 as usize;
            words[slot / 64] |= 1 << (slot % 64);
        }
        out.u8(BITMAP);
        out.i64(min);
        out.u64(range as u64);
        out.u64s(&words);
    } else {
        out.u8(LIST);
        out.i64s(&pairs.iter().map(|&(k, _)| k).collect::<Vec<_>>());
    }
    let bits = code_bits(groups);
    out.u8(bits as u8);
    out.u64s(&pack(pairs.iter().map(|&(_, c)| c), pairs.len(), bits));
}

/// Reads what [`encode`] wrote, from untrusted bytes: keys ascending and unique, every code
/// below `groups`.
pub fn decode(input: &mut WireReader, groups: u32) -> Result<Vec<(i64, u32)>> {
    let count = input.u64()?;
    let keys = match input.u8()? {
        BITMAP => {
            let min = input.i64()?;
            let slots = input.u64()?;
            let words = input.u64s()?;
            if words.len() as u64 != slots.div_ceil(64) || words.last().is_some_and(|&w| slots % 64 != 0 && w >> (slots % 64) != 0) {
                return plan_err!("fragment: a key bitmap of {} words for {slots} slots", words.len());
            }
            if slots > 0 && min.checked_add((slots - 1) as i64).is_none() {
                return plan_err!("fragment: a key bitmap from {min} over {slots} slots overflows");
            }
            let set: u64 = words.iter().map(|w| w.count_ones() as u64).sum();
            if set != count {
                return plan_err!("fragment: a key bitmap of {set} keys where {count} were announced");
            }
            let mut keys = Vec::with_capacity(count as usize);
            for (w, &word) in words.iter().enumerate() {
                let mut bits = word;
                while bits != 0 {
                    keys.push(min + (w as u64 * 64 + bits.trailing_zeros() as u64) as i64);
                    bits &= bits - 1;
                }
            }
            keys
        }
        LIST => {
            let keys = input.i64s()?;
            if keys.len() as u64 != count || keys.windows(2).any(|w| w[0] >= w[1]) {
                return plan_err!("fragment: a key list of {} keys, {count} announced, must ascend", keys.len());
            }
            keys
        }
        other => return plan_err!("fragment: unknown key encoding {other}"),
    };
    let bits = input.u8()? as u32;
    if bits != code_bits(groups) {
        return plan_err!("fragment: codes of {bits} bits for {groups} groups");
    }
    let packed = input.u64s()?;
    let codes = unpack(&packed, keys.len(), bits)?;
    if keys.len() as u64 > 0 && groups == 0 {
        return plan_err!("fragment: keys with codes of no groups");
    }
    if let Some(code) = codes.iter().find(|&&c| c >= groups) {
        return plan_err!("fragment: a dimension code {code} of {groups} groups");
    }
    Ok(keys.into_iter().zip(codes).collect())
}

/// `count` codes of `bits` bits each, packed low bits first into words.
fn pack(codes: impl Iterator<Item = u32>, count: usize, bits: u32) -> Vec<u64> {
    let mut words = vec![0u64; (count * bits as usize).div_ceil(64)];
    if bits == 0 {
        return words;
    }
    for (i, code) in codes.enumerate() {
        let at = i * bits as usize;
        let (word, shift) = (at / 64, at % 64);
        words[word] |= (code as u64) << shift;
        if shift + bits as usize > 64 {
            words[word + 1] |= (code as u64) >> (64 - shift);
        }
    }
    words
}

/// The `count` codes [`pack`] packed into `words`.
fn unpack(words: &[u64], count: usize, bits: u32) -> Result<Vec<u32>> {
    if bits > u32::BITS || words.len() != (count * bits as usize).div_ceil(64) {
        return plan_err!("fragment: {} words of codes for {count} codes of {bits} bits", words.len());
    }
    if bits == 0 {
        return Ok(vec![0; count]);
    }
    let mask = (1u64 << bits) - 1;
    Ok((0..count)
        .map(|i| {
            let at = i * bits as usize;
            let (word, shift) = (at / 64, at % 64);
            let mut value = words[word] >> shift;
            if shift + bits as usize > 64 {
                value |= words[word + 1] << (64 - shift);
            }
            (value & mask) as u32
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(pairs: &[(i64, u32)], groups: u32) -> Vec<u8> {
        let mut out = WireWriter::default();
        encode(&mut out, pairs, groups);
        let bytes = out.finish();
        let mut input = WireReader::new(&bytes);
        assert_eq!(decode(&mut input, groups).unwrap(), pairs, "{groups} groups");
        assert!(input.is_done());
        bytes
    }

    /// Dense keys travel as bits, sparse ones as a list; codes in exactly the bits their groups
    /// need (a code straddling two words included), and keys at the ends of `i64`.
    #[test]
    fn keys_and_codes_round_trip_in_few_bytes() {
        let dense: Vec<(i64, u32)> = (0..320_000).map(|i| (1 + i * 5 / 2, (i % 10) as u32)).collect();
        let bytes = round_trip(&dense, 10);
        // 800K slots as bits (100 KB) and 4-bit codes (160 KB).
        assert!(bytes.len() < 261_000, "{} bytes", bytes.len());
        let one_group: Vec<(i64, u32)> = dense.iter().map(|&(k, _)| (k, 0)).collect();
        assert!(round_trip(&one_group, 1).len() < 101_000, "one group: the keys' bits alone");

        let sparse = [(-5, 2), (7, 0), (1_000_000_000, 1)];
        assert_eq!(round_trip(&sparse, 3).len(), 8 + 1 + 8 + 3 * 8 + 1 + 8 + 8, "a list of three keys, 2-bit codes");
        round_trip(&[(i64::MIN, 0), (i64::MAX, 1)], 2);
        round_trip(&[(i64::MAX - 1, 4), (i64::MAX, 0)], 5);
        round_trip(&[], 1);
        for groups in [2, 3, 255, 256, 70_000, u32::MAX] {
            let pairs: Vec<(i64, u32)> = (0..1000).map(|i| (i * 3, (i as u32).wrapping_mul(2_654_435_761) % groups)).collect();
            round_trip(&pairs, groups);
        }
    }

    #[test]
    fn malformed_keys_and_codes_are_rejected() {
        let mut out = WireWriter::default();
        encode(&mut out, &[(10, 0), (11, 2), (13, 1)], 3);
        let bytes = out.finish();
        assert!(decode(&mut WireReader::new(&bytes), 2).is_err(), "code 2 of 2 groups (and 1-bit codes)");
        for cut in [1, 9, bytes.len() - 1] {
            assert!(decode(&mut WireReader::new(&bytes[..cut]), 3).is_err(), "cut at {cut}");
        }
        let mut miscounted = bytes.clone();
        miscounted[0] = 4;
        assert!(decode(&mut WireReader::new(&miscounted), 3).is_err(), "four keys announced, three set");

        let mut out = WireWriter::default();
        out.u64(2);
        out.u8(LIST);
        out.i64s(&[5, 5]);
        out.u8(0);
        out.u64s(&[]);
        assert!(decode(&mut WireReader::new(&out.finish()), 1).is_err(), "a repeated key");

        let mut out = WireWriter::default();
        out.u64(1);
        out.u8(BITMAP);
        out.i64(i64::MAX);
        out.u64(2);
        out.u64s(&[2]);
        out.u8(0);
        out.u64s(&[]);
        assert!(decode(&mut WireReader::new(&out.finish()), 1).is_err(), "slots past i64::MAX");
    }
}
