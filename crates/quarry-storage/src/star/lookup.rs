//! Dimension tables as the fact side probes them: a foreign key maps to the group code of its
//! dimension row, or to nothing (no such row, or the row was filtered out).

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, HashMap, Result, plan_err};

use super::key_codes;
use super::wire::{WireReader, WireWriter};
use crate::page_reader::NO_CODE;

/// A dense table is used when the keys fill at least this share of their range, or when the
/// range is at most `DENSE_ALWAYS_ENTRIES` (16 KB of codes). Sparser keys are ranked
/// ([`RankedKeys`]), whose bitmap is 1/21 of the dense table's bytes: SSB q2.3's 828 brand
/// parts among 800K made a 3.2 MB table that every `lineorder` row missed the cache in.
const DENSE_MIN_FILL: f64 = 1.0 / 16.0;
const DENSE_ALWAYS_ENTRIES: usize = 1 << 12;
/// Entries of a dense table at most; a sparser or larger key range is hashed.
pub const DENSE_MAX_ENTRIES: usize = 1 << 26;

/// Key to group code.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyLookup {
    /// `codes[key - min]` (Crystal's and HeavyDB's directly indexed dimension).
    Dense { min: i64, codes: DenseCodes },
    /// Sparse integer keys ranked in a bitmap over their range (see [`RankedKeys`]).
    Ranked(RankedKeys),
    /// Integer keys hashed, where their range is too wide for [`RankedKeys`].
    Ints(HashMap<i64, u32>),
    /// String keys hashed.
    Strings(HashMap<Box<[u8]>, u32>),
}

/// A dense table's codes, in the narrowest form that holds the dimension's codes and
/// [`NO_CODE`]: a fact row's probe misses the cache less in a smaller table. SSB q4.1's part
/// dimension (320K keys among 800K, one group) took 3.2 MB as `u32`s, and mapping each segment's
/// dictionary of `lo_partkey` through it was 17% of the query's samples; as bits it takes 100 KB.
#[derive(Debug, Clone, PartialEq)]
pub enum DenseCodes {
    /// One group: bit `slot` is set for a key of the dimension (code 0).
    Bits { words: Vec<u64>, slots: usize },
    /// Fewer than 255 groups; `u8::MAX` is no code.
    U8(Vec<u8>),
    /// Fewer than 65535 groups; `u16::MAX` is no code.
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl DenseCodes {
    /// `table` (a code or [`NO_CODE`] per slot) in the narrowest form for its largest code.
    fn narrow(table: Vec<u32>) -> DenseCodes {
        let groups = table.iter().filter(|&&c| c != NO_CODE).max().map_or(0, |&c| c as u64 + 1);
        let narrowed = |none: u32| table.iter().map(move |&c| if c == NO_CODE { none } else { c });
        match groups {
            0 | 1 => {
                let mut words = vec![0u64; table.len().div_ceil(64)];
                for (slot, _) in table.iter().enumerate().filter(|(_, c)| **c != NO_CODE) {
                    words[slot / 64] |= 1 << (slot % 64);
                }
                DenseCodes::Bits { words, slots: table.len() }
            }
            g if g < u8::MAX as u64 => DenseCodes::U8(narrowed(u8::MAX as u32).map(|c| c as u8).collect()),
            g if g < u16::MAX as u64 => DenseCodes::U16(narrowed(u16::MAX as u32).map(|c| c as u16).collect()),
            _ => DenseCodes::U32(table),
        }
    }

    /// The code in `slot`, or [`NO_CODE`] (also past the end).
    #[inline]
    fn get(&self, slot: u64) -> u32 {
        let Ok(slot) = usize::try_from(slot) else { return NO_CODE };
        match self {
            DenseCodes::Bits { words, slots } => Self::bit_code(words, *slots, slot),
            DenseCodes::U8(codes) => Self::byte_code(codes, slot),
            DenseCodes::U16(codes) => codes.get(slot).map_or(NO_CODE, |&c| if c == u16::MAX { NO_CODE } else { c as u32 }),
            DenseCodes::U32(codes) => codes.get(slot).copied().unwrap_or(NO_CODE),
        }
    }

    /// [`Self::get`] of a `Bits` table.
    #[inline]
    fn bit_code(words: &[u64], slots: usize, slot: usize) -> u32 {
        if slot < slots && words[slot / 64] & (1 << (slot % 64)) != 0 { 0 } else { NO_CODE }
    }

    /// [`Self::get`] of a `U8` table.
    #[inline]
    fn byte_code(codes: &[u8], slot: usize) -> u32 {
        codes.get(slot).map_or(NO_CODE, |&c| if c == u8::MAX { NO_CODE } else { c as u32 })
    }

    /// Slots, with a code or not.
    fn slots(&self) -> usize {
        match self {
            DenseCodes::Bits { slots, .. } => *slots,
            DenseCodes::U8(codes) => codes.len(),
            DenseCodes::U16(codes) => codes.len(),
            DenseCodes::U32(codes) => codes.len(),
        }
    }

    /// The first and last slot with a code, if one has.
    fn first_and_last(&self) -> Option<(usize, usize)> {
        match self {
            DenseCodes::Bits { words, .. } => {
                let first = words.iter().position(|&w| w != 0)?;
                let last = words.iter().rposition(|&w| w != 0)?;
                Some((first * 64 + words[first].trailing_zeros() as usize, last * 64 + 63 - words[last].leading_zeros() as usize))
            }
            _ => {
                let has = |slot: &usize| self.get(*slot as u64) != NO_CODE;
                Some(((0..self.slots()).find(has)?, (0..self.slots()).rev().find(has)?))
            }
        }
    }

    /// Slots with a code.
    fn present(&self) -> usize {
        match self {
            DenseCodes::Bits { words, .. } => words.iter().map(|w| w.count_ones() as usize).sum(),
            _ => (0..self.slots() as u64).filter(|&slot| self.get(slot) != NO_CODE).count(),
        }
    }
}

/// Bytes per key a [`RankedKeys`] may take, or [`RANKED_ANY_BYTES`] whatever the keys' number;
/// a wider range of keys is hashed (a hash map takes about 18 bytes per key).
const RANKED_MAX_BYTES_PER_KEY: f64 = 36.0;
const RANKED_ANY_BYTES: f64 = (1 << 20) as f64;

/// Sparse integer keys as a bitmap over their range, with the keys before each 64-bit word
/// counted: a key's code sits at its rank among the keys. A key without a row is rejected by
/// one bit test, and a fact table stored in key order probes the bitmap sequentially (TPC-H
/// Q10's 573K order keys among 60M: a hash lookup was a cache miss per `lineitem` row).
#[derive(Debug, Clone, PartialEq)]
pub struct RankedKeys {
    min: i64,
    /// Bit `k - min` is set for each key `k`.
    words: Vec<u64>,
    /// Keys in the words before each word.
    ranks: Vec<u32>,
    /// Codes in key order.
    codes: Vec<u32>,
}

impl RankedKeys {
    /// Bytes per value of the range: a word and its rank per 64 values.
    const BYTES_PER_SLOT: f64 = 12.0 / 64.0;

    /// The keys of `pairs`, which lie in `min..min + range`; `Err` with a key that repeats.
    fn build(pairs: &[(i64, u32)], min: i64, range: u64) -> std::result::Result<RankedKeys, i64> {
        let slot = |key: i64| key.wrapping_sub(min) as u64;
        let words = key_bits(pairs, min, range as usize)?;
        let mut ranks = Vec::with_capacity(words.len());
        let mut total = 0u32;
        for word in &words {
            ranks.push(total);
            total += word.count_ones();
        }
        let mut ranked = RankedKeys { min, words, ranks, codes: vec![NO_CODE; pairs.len()] };
        for &(key, code) in pairs {
            let rank = ranked.rank(slot(key)).expect("a key set above");
            ranked.codes[rank] = code;
        }
        Ok(ranked)
    }

    /// The rank of the key in `slot` among the keys, if it is one.
    #[inline]
    fn rank(&self, slot: u64) -> Option<usize> {
        let word = usize::try_from(slot / 64).ok()?;
        let bits = *self.words.get(word)?;
        let bit = 1u64 << (slot % 64);
        (bits & bit != 0).then(|| self.ranks[word] as usize + (bits & (bit - 1)).count_ones() as usize)
    }

    #[inline]
    fn code(&self, key: i64) -> u32 {
        self.rank(key.wrapping_sub(self.min) as u64).map_or(NO_CODE, |rank| self.codes[rank])
    }

    /// The keys in increasing order.
    fn keys(&self) -> Vec<i64> {
        let mut keys = Vec::with_capacity(self.codes.len());
        for (w, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                keys.push(self.min.wrapping_add((w as u64 * 64 + bits.trailing_zeros() as u64) as i64));
                bits &= bits - 1;
            }
        }
        keys
    }

    fn bounds(&self) -> KeyBounds {
        let first = self.words.iter().position(|&w| w != 0);
        let last = self.words.iter().rposition(|&w| w != 0);
        match (first, last) {
            (Some(first), Some(last)) => {
                let at = |word: usize, bit: u32| self.min.wrapping_add((word as u64 * 64 + bit as u64) as i64);
                KeyBounds::Within(at(first, self.words[first].trailing_zeros()), at(last, 63 - self.words[last].leading_zeros()))
            }
            _ => KeyBounds::Empty,
        }
    }
}

/// Where a lookup's integer keys lie: fact rows whose foreign keys fall outside join nothing
/// (see `StarProbeExec::key_bounds_predicate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyBounds {
    /// No key has a code.
    Empty,
    /// Every key with a code is within `lo..=hi`.
    Within(i64, i64),
    /// Not integer keys: no bound.
    Any,
}

/// A loop over integer keys, given a lookup's code function (see [`KeyLookup::with_int_code`]).
pub trait IntCodeVisitor {
    type Output;
    fn visit(self, code: impl Fn(i64) -> u32) -> Self::Output;
}

/// What building a lookup found.
#[derive(Debug)]
pub enum Built {
    /// Every non-NULL key once.
    Unique(KeyLookup),
    /// A key that appears twice: the star join does not apply (it would drop a match).
    Duplicate(String),
}

impl KeyLookup {
    /// The lookup of `keys` (NULLs skipped: they join nothing), the `i`th key mapping to
    /// `codes[i]`.
    pub fn build(keys: &ArrayRef, codes: &[u32]) -> Result<Built> {
        debug_assert_eq!(keys.len(), codes.len());
        if is_string(keys.data_type()) {
            let strings = arrow::compute::cast(keys, &DataType::Utf8View)?;
            let strings = strings.as_string_view();
            let mut map = HashMap::with_capacity(keys.len());
            for (i, &code) in codes.iter().enumerate() {
                if strings.is_null(i) {
                    continue;
                }
                let key: Box<[u8]> = strings.value(i).as_bytes().into();
                if map.insert(key, code).is_some() {
                    return Ok(Built::Duplicate(strings.value(i).to_string()));
                }
            }
            return Ok(Built::Unique(KeyLookup::Strings(map)));
        }
        let ints = int_values(keys)?;
        let present: Vec<(i64, u32)> = ints.iter().zip(codes).filter_map(|(k, &c)| k.map(|k| (k, c))).collect();
        Ok(match Self::from_int_pairs(&present) {
            Ok(lookup) => Built::Unique(lookup),
            Err(key) => Built::Duplicate(key.to_string()),
        })
    }

    /// The lookup of integer `(key, code)` pairs in the form their number and range call for:
    /// a dense table, else ranked or hashed ([`Self::sparse`]). The same pairs always make the
    /// same form, so a lookup rebuilt from its pairs on a node is the host's. `Err` with a key
    /// that repeats.
    fn from_int_pairs(present: &[(i64, u32)]) -> std::result::Result<KeyLookup, i64> {
        let Some((min, max)) = key_bounds(present) else { return Ok(KeyLookup::Ints(HashMap::new())) };
        let range = (max as i128 - min as i128 + 1) as u128;
        let dense = range <= DENSE_MAX_ENTRIES as u128
            && (range <= DENSE_ALWAYS_ENTRIES as u128 || present.len() as f64 >= DENSE_MIN_FILL * range as f64);
        if dense {
            let mut table = vec![NO_CODE; range as usize];
            for &(key, code) in present {
                let slot = &mut table[(key - min) as usize];
                if *slot != NO_CODE {
                    return Err(key);
                }
                *slot = code;
            }
            return Ok(KeyLookup::Dense { min, codes: DenseCodes::narrow(table) });
        }
        Self::sparse(present, Some((min, max)))
    }

    /// The `(key, code)` pairs of an integer lookup, in key order.
    fn sorted_pairs(&self) -> Vec<(i64, u32)> {
        match self {
            KeyLookup::Dense { min, codes } => (0..codes.slots())
                .filter_map(|slot| {
                    let code = codes.get(slot as u64);
                    (code != NO_CODE).then(|| (min.wrapping_add(slot as i64), code))
                })
                .collect(),
            KeyLookup::Ranked(ranked) => ranked.keys().into_iter().zip(ranked.codes.iter().copied()).collect(),
            KeyLookup::Ints(map) => {
                let mut pairs: Vec<(i64, u32)> = map.iter().map(|(k, c)| (*k, *c)).collect();
                pairs.sort_unstable();
                pairs
            }
            KeyLookup::Strings(_) => Vec::new(),
        }
    }

    /// The lookup of sparse integer `(key, code)` pairs: ranked where the bitmap over their
    /// range takes at most [`RANKED_MAX_BYTES_PER_KEY`] bytes per key (or [`RANKED_ANY_BYTES`]),
    /// else hashed. `bounds` are the keys' ([`key_bounds`]). `Err` with a key that repeats.
    fn sparse(pairs: &[(i64, u32)], bounds: Option<(i64, i64)>) -> std::result::Result<KeyLookup, i64> {
        if let Some((min, max)) = bounds {
            let range = max as i128 - min as i128 + 1;
            let bytes = RANKED_MAX_BYTES_PER_KEY * pairs.len() as f64;
            if range <= (bytes.max(RANKED_ANY_BYTES) / RankedKeys::BYTES_PER_SLOT) as i128 {
                if pairs.iter().all(|&(_, code)| code == 0) {
                    // One group: the bitmap alone, without ranks or codes.
                    return one_group_bits(pairs, min, range as usize).map(|codes| KeyLookup::Dense { min, codes });
                }
                return RankedKeys::build(pairs, min, range as u64).map(KeyLookup::Ranked);
            }
        }
        let mut map = HashMap::with_capacity(pairs.len());
        for &(key, code) in pairs {
            if map.insert(key, code).is_some() {
                return Err(key);
            }
        }
        Ok(KeyLookup::Ints(map))
    }

    /// The integer keys this lookup can match (see [`KeyBounds`]).
    pub fn bounds(&self) -> KeyBounds {
        match self {
            KeyLookup::Dense { min, codes } => match codes.first_and_last() {
                // Saturating: a table from the wire may place its slots past i64::MAX.
                Some((first, last)) => KeyBounds::Within(min.saturating_add(first as i64), min.saturating_add(last as i64)),
                None => KeyBounds::Empty,
            },
            KeyLookup::Ranked(ranked) => ranked.bounds(),
            KeyLookup::Ints(map) => match (map.keys().min(), map.keys().max()) {
                (Some(&lo), Some(&hi)) => KeyBounds::Within(lo, hi),
                _ => KeyBounds::Empty,
            },
            KeyLookup::Strings(_) => KeyBounds::Any,
        }
    }

    /// How many keys lie in `lo..=hi`; `None` for string keys, or where the part of the range
    /// the keys span is too wide to count (more than 2^24 values and more than the keys).
    pub fn count_in(&self, lo: i64, hi: i64) -> Option<u64> {
        let (lo, hi) = match self.bounds() {
            KeyBounds::Any => return None,
            KeyBounds::Empty => return Some(0),
            KeyBounds::Within(a, b) => (lo.max(a), hi.min(b)),
        };
        if lo > hi {
            return Some(0);
        }
        let width = (hi as i128 - lo as i128 + 1) as u128;
        if let KeyLookup::Ints(map) = self
            && width > map.len() as u128
        {
            return Some(map.keys().filter(|&&k| (lo..=hi).contains(&k)).count() as u64);
        }
        if width > 1 << 24 {
            return None;
        }
        Some((lo..=hi).filter(|&key| self.code_int(key) != NO_CODE).count() as u64)
    }

    /// How the keys are looked up, as EXPLAIN names it.
    pub fn kind(&self) -> &'static str {
        match self {
            KeyLookup::Dense { codes: DenseCodes::Bits { .. }, .. } => "bitmap",
            KeyLookup::Dense { .. } => "dense",
            KeyLookup::Ranked(_) => "ranked",
            KeyLookup::Ints(_) => "hashed",
            KeyLookup::Strings(_) => "string",
        }
    }

    /// Whether keys are strings.
    pub fn is_strings(&self) -> bool {
        matches!(self, KeyLookup::Strings(_))
    }

    /// Keys with a group code.
    pub fn len(&self) -> usize {
        match self {
            KeyLookup::Dense { codes, .. } => codes.present(),
            KeyLookup::Ranked(ranked) => ranked.codes.len(),
            KeyLookup::Ints(map) => map.len(),
            KeyLookup::Strings(map) => map.len(),
        }
    }

    /// Whether no key has a code.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands `visit` this lookup's integer-key code function for its form, so a loop over
    /// keys is compiled once per form instead of branching on the form for every key: on SSB
    /// q2.3, `code_int` over the plain `lo_partkey` pages was 18% of the samples.
    pub fn with_int_code<V: IntCodeVisitor>(&self, visit: V) -> V::Output {
        match self {
            // A slot past `usize` (a 32-bit target) wraps to a small one: `get`'s `try_from`
            // check is kept there, and a 64-bit `usize` holds every slot.
            KeyLookup::Dense { min, codes: DenseCodes::Bits { words, slots } } if usize::BITS == 64 => {
                let (min, slots) = (*min, *slots);
                visit.visit(move |key: i64| DenseCodes::bit_code(words, slots, key.wrapping_sub(min) as u64 as usize))
            }
            KeyLookup::Dense { min, codes: DenseCodes::U8(codes) } if usize::BITS == 64 => {
                let min = *min;
                visit.visit(move |key: i64| DenseCodes::byte_code(codes, key.wrapping_sub(min) as u64 as usize))
            }
            KeyLookup::Ranked(ranked) => visit.visit(|key: i64| ranked.code(key)),
            other => visit.visit(|key: i64| other.code_int(key)),
        }
    }

    /// The code of an integer key, or [`NO_CODE`].
    #[inline]
    pub fn code_int(&self, key: i64) -> u32 {
        match self {
            KeyLookup::Dense { min, codes } => codes.get(key.wrapping_sub(*min) as u64),
            KeyLookup::Ranked(ranked) => ranked.code(key),
            KeyLookup::Ints(map) => map.get(&key).copied().unwrap_or(NO_CODE),
            KeyLookup::Strings(_) => NO_CODE,
        }
    }

    /// The code of a string key, or [`NO_CODE`].
    #[inline]
    pub fn code_bytes(&self, key: &[u8]) -> u32 {
        match self {
            KeyLookup::Strings(map) => map.get(key).copied().unwrap_or(NO_CODE),
            _ => NO_CODE,
        }
    }

    /// Codes of the rows of `keys` (an array of the fact's foreign key; NULL has no code).
    pub fn codes_of(&self, keys: &ArrayRef, rows: &[u32], out_rows: &mut Vec<u32>, out_codes: &mut Vec<u32>) -> Result<()> {
        let mut push = |row: u32, code: u32| {
            if code != NO_CODE {
                out_rows.push(row);
                out_codes.push(code);
            }
        };
        if self.is_strings() {
            let strings = arrow::compute::cast(keys, &DataType::Utf8View)?;
            let strings = strings.as_string_view();
            for &row in rows {
                if strings.is_valid(row as usize) {
                    push(row, self.code_bytes(strings.value(row as usize).as_bytes()));
                }
            }
            return Ok(());
        }
        let ints = int_values(keys)?;
        for &row in rows {
            if let Some(key) = ints[row as usize] {
                push(row, self.code_int(key));
            }
        }
        Ok(())
    }

    /// Writes the lookup, whose codes are below `groups`.
    pub(super) fn encode(&self, out: &mut WireWriter, groups: u32) {
        match self {
            // One group's bits travel as they are; other integer keys as their pairs, compactly
            // (`key_codes`), the node choosing the form from them as the host did.
            KeyLookup::Dense { min, codes: DenseCodes::Bits { words, slots } } => {
                out.u8(3);
                out.i64(*min);
                out.u64(*slots as u64);
                out.u64s(words);
            }
            KeyLookup::Dense { .. } | KeyLookup::Ranked(_) | KeyLookup::Ints(_) => {
                out.u8(5);
                key_codes::encode(out, &self.sorted_pairs(), groups);
            }
            KeyLookup::Strings(map) => {
                out.u8(2);
                out.u64(map.len() as u64);
                for (key, code) in map {
                    out.bytes(key);
                    out.u32(*code);
                }
            }
        }
    }

    /// Decodes a lookup whose codes must be below `groups`.
    pub(super) fn decode(input: &mut WireReader, groups: u32) -> Result<Self> {
        let check = |code: u32| if code < groups { Ok(code) } else { plan_err!("fragment: a dimension code {code} of {groups} groups") };
        match input.u8()? {
            3 => {
                let min = input.i64()?;
                let slots = input.u64()?;
                let words = input.u64s()?;
                if slots > DENSE_MAX_ENTRIES as u64 || words.len() as u64 != slots.div_ceil(64) {
                    return plan_err!("fragment: a dimension bitmap of {} words for {slots} keys", words.len());
                }
                if words.last().is_some_and(|&w| slots % 64 != 0 && w >> (slots % 64) != 0) {
                    return plan_err!("fragment: a dimension bitmap with bits past its {slots} keys");
                }
                if groups == 0 && words.iter().any(|&w| w != 0) {
                    return plan_err!("fragment: a dimension code 0 of 0 groups");
                }
                Ok(KeyLookup::Dense { min, codes: DenseCodes::Bits { words, slots: slots as usize } })
            }
            5 => {
                let pairs = key_codes::decode(input, groups)?;
                Self::from_int_pairs(&pairs).or_else(|key| plan_err!("fragment: dimension key {key} appears twice"))
            }
            2 => {
                let count = input.len_prefix()?;
                let mut map = HashMap::with_capacity(count);
                for _ in 0..count {
                    let key: Box<[u8]> = input.bytes()?.into();
                    map.insert(key, check(input.u32()?)?);
                }
                Ok(KeyLookup::Strings(map))
            }
            other => plan_err!("fragment: unknown dimension lookup kind {other}"),
        }
    }
}

/// The keys of `pairs` (every code 0), in `min..min + slots`, as bits; `Err` with a key that
/// repeats.
fn one_group_bits(pairs: &[(i64, u32)], min: i64, slots: usize) -> std::result::Result<DenseCodes, i64> {
    Ok(DenseCodes::Bits { words: key_bits(pairs, min, slots)?, slots })
}

/// A bitmap of the keys of `pairs` over `min..min + slots` (bit `key - min` set for each key);
/// `Err` with a key that repeats.
fn key_bits(pairs: &[(i64, u32)], min: i64, slots: usize) -> std::result::Result<Vec<u64>, i64> {
    let mut words = vec![0u64; slots.div_ceil(64)];
    for &(key, _) in pairs {
        let slot = key.wrapping_sub(min) as u64 as usize;
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if words[word] & bit != 0 {
            return Err(key);
        }
        words[word] |= bit;
    }
    Ok(words)
}

/// The smallest and largest key of `pairs`, if there is one.
fn key_bounds(pairs: &[(i64, u32)]) -> Option<(i64, i64)> {
    pairs.iter().fold(None, |bounds, &(k, _)| Some(bounds.map_or((k, k), |(lo, hi): (i64, i64)| (lo.min(k), hi.max(k)))))
}

/// Whether a foreign key of this type can be probed.
pub fn supported_key_type(data_type: &DataType) -> bool {
    is_string(data_type) || int_type(data_type)
}

pub(super) fn is_string(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
}

fn int_type(data_type: &DataType) -> bool {
    int_key_range(data_type).is_some()
}

/// The values an integer key type holds, as `i64`s; `None` for a type that is not an integer
/// key (the one list of them).
pub fn int_key_range(data_type: &DataType) -> Option<(i64, i64)> {
    Some(match data_type {
        DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 | DataType::Date32 => (i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => (i64::MIN, i64::MAX),
        DataType::UInt8 => (0, u8::MAX.into()),
        DataType::UInt16 => (0, u16::MAX.into()),
        DataType::UInt32 => (0, u32::MAX.into()),
        _ => return None,
    })
}

/// An integer key column as `i64`s (`None` for NULL).
pub(super) fn int_values(keys: &ArrayRef) -> Result<Vec<Option<i64>>> {
    if !int_type(keys.data_type()) {
        return Err(DataFusionError::Internal(format!("a star join key of type {}", keys.data_type())));
    }
    let wide = arrow::compute::cast(keys, &DataType::Int64)?;
    Ok(wide.as_primitive::<arrow::datatypes::Int64Type>().iter().collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};

    use super::*;

    /// A key's code by `code_int` and by the form-specialized `with_int_code`, which must agree.
    fn code_of(lookup: &KeyLookup, key: i64) -> u32 {
        struct One(i64);
        impl IntCodeVisitor for One {
            type Output = u32;
            fn visit(self, code: impl Fn(i64) -> u32) -> u32 {
                code(self.0)
            }
        }
        let code = lookup.code_int(key);
        assert_eq!(lookup.with_int_code(One(key)), code, "{} lookup, key {key}", lookup.kind());
        code
    }

    fn unique(built: Built) -> KeyLookup {
        match built {
            Built::Unique(lookup) => lookup,
            Built::Duplicate(key) => panic!("duplicate {key}"),
        }
    }

    /// 20,000 keys from 50 up, out of order: clusters of four keys 3 apart, 400 apart.
    fn spread_keys() -> Vec<i32> {
        (0..20_000).map(|i| 50 + (i / 4) * 400 + (i % 4) * 3).rev().collect()
    }

    #[test]
    fn dense_sparse_and_string_keys_find_their_codes() {
        let dense: ArrayRef = Arc::new(Int32Array::from(vec![Some(10), Some(12), None, Some(11)]));
        let lookup = unique(KeyLookup::build(&dense, &[0, 1, 2, 3]).unwrap());
        assert!(matches!(lookup, KeyLookup::Dense { min: 10, .. }));
        assert_eq!([9, 10, 11, 12, 13].map(|k| code_of(&lookup, k)), [NO_CODE, 0, 3, 1, NO_CODE]);
        assert_eq!(lookup.bounds(), KeyBounds::Within(10, 12));

        // 20,000 keys among 2M values: too sparse for a dense table, ranked.
        let spread = spread_keys();
        let lookup = unique(KeyLookup::build(&(Arc::new(Int32Array::from(spread.clone())) as ArrayRef), &(0..20_000).rev().collect::<Vec<u32>>()).unwrap());
        assert!(matches!(lookup, KeyLookup::Ranked(_)), "not ranked");
        for (i, &key) in spread.iter().enumerate() {
            assert_eq!(code_of(&lookup, key as i64), 19_999 - i as u32, "key {key}");
            assert_eq!([key as i64 - 1, key as i64 + 1].map(|k| code_of(&lookup, k)), [NO_CODE; 2], "beside key {key}");
        }
        let max = *spread.iter().max().unwrap() as i64;
        assert_eq!([i64::MIN, 49, max + 64, i64::MAX].map(|k| code_of(&lookup, k)), [NO_CODE; 4]);
        assert_eq!((lookup.len(), lookup.bounds()), (20_000, KeyBounds::Within(50, max)));

        // Few keys over a range a dense table would fill with misses: ranked too, or, all of
        // one group, a bitmap.
        let few: ArrayRef = Arc::new(Int32Array::from((0..800).map(|i| i * 1000).collect::<Vec<i32>>()));
        let lookup = unique(KeyLookup::build(&few, &(0..800).map(|i| i % 2).collect::<Vec<u32>>()).unwrap());
        assert_eq!((lookup.kind(), code_of(&lookup, 5000), code_of(&lookup, 6000), code_of(&lookup, 5001)), ("ranked", 1, 0, NO_CODE));
        let lookup = unique(KeyLookup::build(&few, &[0; 800]).unwrap());
        assert_eq!((lookup.kind(), code_of(&lookup, 5000), code_of(&lookup, 5001), code_of(&lookup, 799_001)), ("bitmap", 0, NO_CODE, NO_CODE));
        assert_eq!((lookup.len(), lookup.bounds()), (800, KeyBounds::Within(0, 799_000)));

        let sparse: ArrayRef = Arc::new(Int32Array::from(vec![1, 100_000_000, -5]));
        let lookup = unique(KeyLookup::build(&sparse, &[7, 8, 9]).unwrap());
        assert!(matches!(lookup, KeyLookup::Ints(_)));
        assert_eq!([1, 100_000_000, -5, 2].map(|k| code_of(&lookup, k)), [7, 8, 9, NO_CODE]);
        assert_eq!(lookup.bounds(), KeyBounds::Within(-5, 100_000_000));
        let none: ArrayRef = Arc::new(Int32Array::from(vec![None, None]));
        let empty = unique(KeyLookup::build(&none, &[0, 1]).unwrap());
        assert_eq!(empty.bounds(), KeyBounds::Empty, "no key joins");

        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "bb"]));
        let lookup = unique(KeyLookup::build(&strings, &[0, 1]).unwrap());
        assert_eq!((lookup.code_bytes(b"bb"), lookup.code_bytes(b"c")), (1, NO_CODE));
        assert_eq!(lookup.bounds(), KeyBounds::Any);

        let probe: ArrayRef = Arc::new(StringArray::from(vec![Some("bb"), None, Some("a"), Some("zz")]));
        let (mut rows, mut codes) = (Vec::new(), Vec::new());
        lookup.codes_of(&probe, &[0, 1, 2, 3], &mut rows, &mut codes).unwrap();
        assert_eq!((rows, codes), (vec![0, 2], vec![1, 0]));
    }

    /// A dense table takes the narrowest codes its groups allow, and finds the same codes in
    /// each: bits for one group, bytes below 255 groups, `u16`s below 65535, else `u32`s.
    #[test]
    fn keys_in_a_range_are_counted_in_every_form() {
        let dense: ArrayRef = Arc::new(Int32Array::from(vec![10, 12, 13]));
        let lookup = unique(KeyLookup::build(&dense, &[0, 1, 2]).unwrap());
        assert_eq!([(0, 9), (0, 10), (11, 11), (11, 13), (13, 100)].map(|(lo, hi)| lookup.count_in(lo, hi)), [0, 1, 0, 2, 1].map(Some));
        let spread = spread_keys();
        let lookup = unique(KeyLookup::build(&(Arc::new(Int32Array::from(spread)) as ArrayRef), &[0; 20_000]).unwrap());
        // Keys 50, 53, 56, 59, then 450, ...: a cluster of four per 400 values.
        assert_eq!([(0, 49), (50, 55), (57, 449), (0, 849)].map(|(lo, hi)| lookup.count_in(lo, hi)), [0, 2, 1, 8].map(Some));
        let sparse: ArrayRef = Arc::new(Int32Array::from(vec![1, 100_000_000, -5]));
        let lookup = unique(KeyLookup::build(&sparse, &[7, 8, 9]).unwrap());
        assert_eq!([(-10, 0), (0, i64::MAX), (2, 99_999_999)].map(|(lo, hi)| lookup.count_in(lo, hi)), [1, 2, 0].map(Some));
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        assert_eq!(unique(KeyLookup::build(&strings, &[0]).unwrap()).count_in(0, 10), None);
    }

    #[test]
    fn dense_codes_are_as_narrow_as_the_groups() {
        let keys: ArrayRef = Arc::new(Int32Array::from_iter_values((0..200_000).map(|i| 1_000 + 2 * i)));
        for (groups, form) in [(1u32, "bits"), (2, "u8"), (254, "u8"), (255, "u16"), (65_534, "u16"), (65_535, "u32"), (100_000, "u32")] {
            let codes: Vec<u32> = (0..200_000).map(|i| (i * 7919) % groups).collect();
            let lookup = unique(KeyLookup::build(&keys, &codes).unwrap());
            let KeyLookup::Dense { min: 1_000, codes: table } = &lookup else { panic!("{groups} groups: {lookup:?}") };
            let actual = match table {
                DenseCodes::Bits { .. } => "bits",
                DenseCodes::U8(_) => "u8",
                DenseCodes::U16(_) => "u16",
                DenseCodes::U32(_) => "u32",
            };
            assert_eq!(actual, form, "{groups} groups");
            for (i, &code) in codes.iter().enumerate() {
                let key = 1_000 + 2 * i as i64;
                assert_eq!([key - 1, key, key + 1].map(|k| code_of(&lookup, k)), [NO_CODE, code, NO_CODE], "{groups} groups, key {key}");
            }
            assert_eq!([i64::MIN, 999, 401_000, i64::MAX].map(|k| code_of(&lookup, k)), [NO_CODE; 4], "{groups} groups");
            assert_eq!((lookup.len(), lookup.bounds()), (200_000, KeyBounds::Within(1_000, 400_998)), "{groups} groups");
            let mut out = WireWriter::default();
            lookup.encode(&mut out, groups);
            assert_eq!(KeyLookup::decode(&mut WireReader::new(&out.finish()), groups).unwrap(), lookup, "{groups} groups over the wire");
        }
    }

    #[test]
    fn a_duplicated_key_is_reported() {
        let keys: ArrayRef = Arc::new(Int32Array::from(vec![3, 4, 3]));
        assert!(matches!(KeyLookup::build(&keys, &[0, 1, 2]).unwrap(), Built::Duplicate(k) if k == "3"));
        let repeated = spread_keys()[123];
        let keys: ArrayRef = Arc::new(Int32Array::from(spread_keys().into_iter().chain([repeated]).collect::<Vec<i32>>()));
        let codes: Vec<u32> = (0..20_001).map(|i| i % 3).collect();
        assert!(matches!(KeyLookup::build(&keys, &codes).unwrap(), Built::Duplicate(k) if k == repeated.to_string()), "ranked keys");
        assert!(matches!(KeyLookup::build(&keys, &[0; 20_001]).unwrap(), Built::Duplicate(k) if k == repeated.to_string()), "keys as bits");
        let keys: ArrayRef = Arc::new(StringArray::from(vec!["x", "x"]));
        assert!(matches!(KeyLookup::build(&keys, &[0, 1]).unwrap(), Built::Duplicate(k) if k == "x"));
    }

    #[test]
    fn lookups_round_trip_and_bad_codes_are_rejected() {
        for keys in [
            Arc::new(Int32Array::from(vec![5, 6, 8])) as ArrayRef,
            Arc::new(Int32Array::from(vec![5, 60_000_000, 8])),
            Arc::new(Int32Array::from(spread_keys())),
            Arc::new(StringArray::from(vec!["p", "q", "r"])),
        ] {
            let codes: Vec<u32> = [0, 2, 1].into_iter().cycle().take(keys.len()).collect();
            let lookup = unique(KeyLookup::build(&keys, &codes).unwrap());
            let mut out = WireWriter::default();
            lookup.encode(&mut out, 3);
            let bytes = out.finish();
            assert_eq!(KeyLookup::decode(&mut WireReader::new(&bytes), 3).unwrap(), lookup);
            assert!(KeyLookup::decode(&mut WireReader::new(&bytes), 2).is_err(), "code 2 of 2 groups");
            assert!(KeyLookup::decode(&mut WireReader::new(&bytes[..bytes.len() - 1]), 3).is_err(), "truncated");
        }
        // One group: bits on both sides, dense or not.
        for keys in [Arc::new(Int32Array::from(vec![5, 6, 8])) as ArrayRef, Arc::new(Int32Array::from(spread_keys()))] {
            let lookup = unique(KeyLookup::build(&keys, &vec![0; keys.len()]).unwrap());
            assert_eq!(lookup.kind(), "bitmap");
            let mut out = WireWriter::default();
            lookup.encode(&mut out, 1);
            let bytes = out.finish();
            assert_eq!(KeyLookup::decode(&mut WireReader::new(&bytes), 1).unwrap(), lookup);
            assert!(KeyLookup::decode(&mut WireReader::new(&bytes), 0).is_err(), "code 0 of no groups");
        }
    }
}
