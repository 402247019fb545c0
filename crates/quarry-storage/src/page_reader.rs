//! Reading a Parquet column chunk page by page, for scans that touch only the rows they need.
//!
//! arrow-rs decodes whole pages into Arrow arrays; a star join that keeps 1% of the fact rows
//! after its first probe needs the other columns' values for that 1% only. A [`ColumnChunk`]
//! holds a row group's column decompressed (by the parquet crate's page reader) but not decoded:
//! PLAIN values are read at their offsets, dictionary indices (the RLE / bit-packed hybrid) by
//! position, and a predicate or dimension lookup on a dictionary-encoded column runs once per
//! dictionary entry rather than once per row (HippogriffDB's evaluation on compressed data).
//!
//! Supported: flat columns, required or optional, INT32, INT64 and BYTE_ARRAY physical types,
//! PLAIN and dictionary encodings, data pages v1, any codec the parquet crate reads. Anything
//! else is [`Unsupported`]: the caller scans such a segment the ordinary way. A page of an
//! optional column that holds NULLs stores values for its valid rows only; the page keeps
//! which rows are valid and how many are before each 64 rows ([`Validity`]), by which a row
//! finds its value. A NULL row never passes a test (`keep_*`: a comparison or lookup of NULL is
//! not true) and is NULL when gathered.

use std::sync::Arc;

use arrow::array::builder::make_view;
use arrow::array::{ArrayRef, Date32Array, Decimal128Array, Int32Array, Int64Array, StringViewArray};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::array::BooleanBufferBuilder;
use arrow::datatypes::DataType;
use bytes::Bytes;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use datafusion::common::DataFusionError;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::file::metadata::{ColumnChunkMetaData, FooterTail, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

/// A chunk this reader cannot read; the message says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, Unsupported>;

fn unsupported<T>(what: impl Into<String>) -> Result<T> {
    Err(Unsupported(what.into()))
}

/// Marks "no value" in code tables (a dictionary entry or row that fails a lookup).
pub const NO_CODE: u32 = u32::MAX;

/// A column chunk's values as they are stored, decompressed.
#[derive(Debug)]
pub struct ColumnChunk {
    rows: usize,
    kind: ValueKind,
    dictionary: Option<Dictionary>,
    pages: Vec<DataPage>,
}

/// How values are represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// 4-byte little-endian integers (INT32: Int32, Date32, small decimals).
    Int32,
    /// 8-byte little-endian integers (INT64: Int64, decimals up to 18 digits).
    Int64,
    /// Length-prefixed byte strings (BYTE_ARRAY: Utf8).
    Bytes,
}

/// A dictionary page's values.
#[derive(Debug)]
enum Dictionary {
    Ints(Vec<i64>),
    Bytes(ByteValues),
}

/// Byte strings as offsets into one buffer.
#[derive(Debug, Default)]
struct ByteValues {
    data: Bytes,
    /// `offsets[i]..offsets[i + 1]` is value `i`.
    offsets: Vec<u32>,
    /// Whether every value is UTF-8, once checked: a dictionary is gathered from batch after
    /// batch.
    utf8: std::sync::OnceLock<bool>,
}

impl ByteValues {
    /// Checks that every value is UTF-8: the whole buffer is, and no value starts inside a
    /// character.
    fn check_utf8(&self) -> Result<()> {
        let utf8 = *self
            .utf8
            .get_or_init(|| std::str::from_utf8(&self.data).is_ok() && !self.offsets.iter().any(|&o| self.data.get(o as usize).is_some_and(|&b| (b as i8) < -0x40)));
        if !utf8 {
            return unsupported("a string that is not UTF-8");
        }
        Ok(())
    }

    /// Parses `count` PLAIN byte arrays (4-byte length, then the bytes).
    fn parse(data: Bytes, count: usize) -> Result<Self> {
        let mut offsets = Vec::with_capacity(count + 1);
        let mut starts = Vec::with_capacity(count + 1);
        let mut pos = 0usize;
        for _ in 0..count {
            let Some(len) = data.get(pos..pos + 4) else { return unsupported("a byte array page ends early") };
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            if pos + 4 + len > data.len() {
                return unsupported("a byte array page ends early");
            }
            starts.push((pos + 4, len));
            pos += 4 + len;
        }
        // Values are stored between length prefixes: copy them together so that value `i` is
        // `offsets[i]..offsets[i + 1]`.
        let mut packed = Vec::with_capacity(pos - 4 * count);
        offsets.push(0);
        for (start, len) in starts {
            packed.extend_from_slice(&data[start..start + len]);
            offsets.push(packed.len() as u32);
        }
        Ok(ByteValues { data: Bytes::from(packed), offsets, utf8: std::sync::OnceLock::new() })
    }

    fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    fn value(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

#[derive(Debug)]
struct DataPage {
    /// Row (within the row group) of the page's first value.
    first_row: usize,
    rows: usize,
    /// The values: one per row, or with `valid`, one per valid row.
    body: PageBody,
    /// Which of the page's rows are not NULL (`None`: all of them).
    valid: Option<Validity>,
}

/// The valid (not NULL) rows of a page that has NULLs: a bit per row, and the valid rows before
/// each word of 64, so that a row's value is found in constant time.
#[derive(Debug)]
struct Validity {
    words: Vec<u64>,
    /// Valid rows before word `w`.
    ranks: Vec<u32>,
    rows: usize,
    /// Valid rows: the values the page holds.
    values: usize,
}

impl Validity {
    fn new(bits: &BooleanBuffer) -> Self {
        let words: Vec<u64> = bits.bit_chunks().iter_padded().collect();
        let mut ranks = Vec::with_capacity(words.len());
        let mut valid = 0u32;
        for word in &words {
            ranks.push(valid);
            valid += word.count_ones();
        }
        Validity { words, ranks, rows: bits.len(), values: valid as usize }
    }

    /// The position among the page's values of row `row` (of the page), if it is valid.
    #[inline]
    fn position(&self, row: usize) -> Option<u32> {
        let (w, bit) = (row / 64, row % 64);
        let word = self.words[w];
        (word >> bit & 1 == 1).then(|| self.ranks[w] + (word & ((1u64 << bit) - 1)).count_ones())
    }

    fn is_valid(&self, row: usize) -> bool {
        self.words[row / 64] >> (row % 64) & 1 == 1
    }

    /// The valid rows, each plus `base`, in order: row of each value.
    fn rows_of_values(&self, base: u32) -> Vec<u32> {
        let mut rows = Vec::with_capacity(self.values);
        for (w, &word) in self.words.iter().enumerate() {
            let first = base + (w * 64) as u32;
            // A word with no NULL (most of them where NULLs are rare) is a run of 64 rows.
            if word == u64::MAX {
                rows.extend(first..first + 64);
                continue;
            }
            let mut bits = word;
            while bits != 0 {
                rows.push(first + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        debug_assert!(rows.last().is_none_or(|&r| ((r - base) as usize) < self.rows));
        rows
    }
}

#[derive(Debug)]
enum PageBody {
    /// Fixed-width values, `width` bytes each.
    Plain { data: Bytes, width: usize },
    /// Byte strings.
    PlainBytes(ByteValues),
    /// Dictionary indices.
    Indices(Indices),
}

/// The dictionary indices of a page: runs of the RLE / bit-packed hybrid encoding.
#[derive(Debug)]
struct Indices {
    data: Bytes,
    bit_width: u8,
    runs: Vec<Run>,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    /// Position (within the page) of the run's first value.
    first: u32,
    len: u32,
    kind: RunKind,
}

#[derive(Debug, Clone, Copy)]
enum RunKind {
    /// One value repeated.
    Repeated(u32),
    /// Bit-packed values starting at this byte of the page's data.
    Packed(u32),
}

impl Indices {
    /// Parses the hybrid runs of `count` values (the bit width is the data's first byte).
    fn parse(data: Bytes, count: usize) -> Result<Self> {
        let Some(&bit_width) = data.first() else { return unsupported("an empty dictionary index page") };
        if bit_width > 32 {
            return unsupported(format!("dictionary indices of {bit_width} bits"));
        }
        let mut runs = Vec::new();
        visit_runs(&data, 1, bit_width, count, |run| runs.push(run))?;
        Ok(Indices { data, bit_width, runs })
    }

    /// How many values the page holds.
    fn len(&self) -> usize {
        self.runs.last().map_or(0, |run| (run.first + run.len) as usize)
    }

    /// The index of the value at `position` within `run`.
    #[inline]
    fn get(&self, run: &Run, position: usize) -> u32 {
        match run.kind {
            RunKind::Repeated(v) => v,
            RunKind::Packed(start) => read_bits(&self.data, start as usize * 8 + (position - run.first as usize) * self.bit_width as usize, self.bit_width),
        }
    }

    /// Appends `value(index)` for the indices of `page` (which these are) at `rows`
    /// (increasing, within the page) to `out`; false if an index has no value (past the
    /// dictionary). Only the rows asked for are looked up, so a large dictionary costs nothing
    /// per batch. Where most of the page is wanted, it is decoded whole (into `scratch`) and
    /// picked from: a run search and a bit extraction per row cost more than that.
    fn gather<T>(&self, rows: &[u32], first_row: usize, value: impl Fn(u32) -> Option<T>, scratch: &mut Vec<u32>, out: &mut Vec<T>) -> bool {
        let mut ok = true;
        let mut push = |i: u32| match value(i) {
            Some(v) => out.push(v),
            None => ok = false,
        };
        if !decode_whole_page(rows.len(), self.len()) {
            self.for_positions(rows.iter().map(|&r| r as usize - first_row), |_, i| push(i));
            return ok;
        }
        self.decode_all(scratch);
        if rows.len() == scratch.len() {
            scratch.iter().for_each(|&i| push(i));
        } else {
            rows.iter().for_each(|&r| push(scratch[r as usize - first_row]));
        }
        ok
    }

    /// Every index of the page, in order, into `out` (cleared first).
    fn decode_all(&self, out: &mut Vec<u32>) {
        out.clear();
        for run in &self.runs {
            let len = run.len as usize;
            match run.kind {
                RunKind::Repeated(v) => out.extend(std::iter::repeat_n(v, len)),
                RunKind::Packed(start) => unpack_run(&self.data[start as usize..], self.bit_width, len, out),
            }
        }
    }

    /// Calls `f(k, index)` for the values at `positions` (increasing, within the page).
    fn for_positions(&self, positions: impl Iterator<Item = usize>, mut f: impl FnMut(usize, u32)) {
        let mut run = 0usize;
        for (k, p) in positions.enumerate() {
            while (self.runs[run].first + self.runs[run].len) as usize <= p {
                run += 1;
            }
            f(k, self.get(&self.runs[run], p));
        }
    }
}

/// Appends the `len` values of a bit-packed run of `width`-bit values (at most 32) starting
/// at `data`'s first byte to `out`: eight at a time by an unpacker for that width, which reads
/// eight bytes past each group's start, then the rest one by one.
fn unpack_run(data: &[u8], width: u8, len: usize, out: &mut Vec<u32>) {
    macro_rules! by_width {
        ($($w:literal)*) => {
            match width {
                0 => { out.extend(std::iter::repeat_n(0, len)); return; }
                $($w => unpack_groups::<$w>(data, len, out),)*
                _ => unreachable!("bit widths over 32 are rejected when parsed"),
            }
        };
    }
    let done = out.len();
    by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
    let unpacked = out.len() - done;
    out.extend((unpacked..len).map(|i| read_bits(data, i * width as usize, width)));
}

/// Unpacks whole groups of eight `W`-bit values while eight bytes can be read past each
/// group's start (its `W` bytes and some of the next); returns having appended a multiple of 8.
#[inline(always)]
fn unpack_groups<const W: usize>(data: &[u8], len: usize, out: &mut Vec<u32>) {
    let mask = if W == 32 { u32::MAX as u64 } else { (1u64 << W) - 1 };
    let groups = (len / 8).min(data.len().saturating_sub(8) / W);
    out.reserve(groups * 8);
    for g in 0..groups {
        // Each 8-byte read starts at byte (i * W) / 8 < W of the window: inside it.
        let window = &data[g * W..g * W + W + 8];
        let mut values = [0u32; 8];
        for (i, value) in values.iter_mut().enumerate() {
            let bit = i * W;
            let word = u64::from_le_bytes(window[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
            *value = ((word >> (bit % 8)) & mask) as u32;
        }
        out.extend_from_slice(&values);
    }
}

/// Whether `wanted` of a page's `rows` dictionary indices are better unpacked all, eight at a
/// time, than found one by one (a run search and a bit extraction each): from one row in 16
/// (TPC-H Q6 keeps one row in 7 after its first column; at one in 4, the threshold before, both
/// its later columns took the slow path).
#[inline]
fn decode_whole_page(wanted: usize, rows: usize) -> bool {
    wanted * 16 >= rows
}

/// `width` bits (at most 32) starting at bit `bit` of `data`, least significant bit first.
#[inline]
fn read_bits(data: &[u8], bit: usize, width: u8) -> u32 {
    if width == 0 {
        return 0;
    }
    let byte = bit / 8;
    let word = match data.get(byte..byte + 8) {
        Some(eight) => u64::from_le_bytes(eight.try_into().expect("8 bytes")),
        None => {
            let mut tail = [0u8; 8];
            let available = &data[byte.min(data.len())..];
            tail[..available.len()].copy_from_slice(available);
            u64::from_le_bytes(tail)
        }
    };
    ((word >> (bit % 8)) & ((1u64 << width) - 1)) as u32
}

fn read_uleb128(data: &[u8]) -> Result<(u64, usize)> {
    let mut value = 0u64;
    for (i, &byte) in data.iter().enumerate().take(10) {
        value |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    unsupported("a malformed run header")
}

/// A column chunk's bytes at their offset in the file (the page reader asks by file offset).
pub(crate) struct ChunkBytes {
    pub(crate) start: u64,
    pub(crate) data: Bytes,
}

/// The footer of the Parquet file at `path` (`size` bytes) and the bytes read for it: the last
/// 8 bytes give the length of the metadata before them.
pub async fn read_footer(store: &dyn ObjectStore, path: &ObjectPath, size: u64) -> datafusion::error::Result<(ParquetMetaData, u64)> {
    const TAIL: u64 = 8;
    let failed = |e: String| DataFusionError::Execution(format!("reading {path}: {e}"));
    let short = || failed(format!("{size} bytes is too short for a Parquet file"));
    let tail_start = size.checked_sub(TAIL).ok_or_else(short)?;
    let tail = store.get_range(path, tail_start..size).await.map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
    let tail: [u8; TAIL as usize] = tail[..].try_into().map_err(|_| short())?;
    let footer = FooterTail::try_new(&tail).map_err(|e| failed(e.to_string()))?;
    let start = tail_start.checked_sub(footer.metadata_length() as u64).ok_or_else(short)?;
    let bytes = store.get_range(path, start..tail_start).await.map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
    let metadata = ParquetMetaDataReader::decode_metadata(&bytes).map_err(|e| failed(e.to_string()))?;
    Ok((metadata, TAIL + bytes.len() as u64))
}

impl Length for ChunkBytes {
    fn len(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

impl ChunkReader for ChunkBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(bytes::Buf::reader(self.get_bytes(start, (self.len() - start.min(self.len())) as usize)?))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let from = start.checked_sub(self.start).map(|f| f as usize);
        match from {
            Some(from) if from + length <= self.data.len() => Ok(self.data.slice(from..from + length)),
            _ => Err(parquet::errors::ParquetError::EOF(format!("bytes {start}..{} are outside the column chunk", start + length as u64))),
        }
    }
}

impl ColumnChunk {
    /// Whether this reader can read `column` (from its metadata alone; a page may still turn
    /// out unsupported when read).
    pub fn supports(column: &ColumnChunkMetaData) -> Result<ValueKind> {
        let descr = column.column_descr();
        if descr.max_rep_level() > 0 || descr.max_def_level() > 1 {
            return unsupported(format!("column {} is nested", descr.path()));
        }
        let integers = matches!(column.column_type(), PhysicalType::INT32 | PhysicalType::INT64);
        for encoding in column.encodings() {
            let delta = encoding == Encoding::DELTA_BINARY_PACKED && integers;
            if !delta && !matches!(encoding, Encoding::PLAIN | Encoding::RLE | Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY) {
                return unsupported(format!("column {} uses the {encoding} encoding", descr.path()));
            }
        }
        match column.column_type() {
            PhysicalType::INT32 => Ok(ValueKind::Int32),
            PhysicalType::INT64 => Ok(ValueKind::Int64),
            PhysicalType::BYTE_ARRAY => Ok(ValueKind::Bytes),
            other => unsupported(format!("column {} has physical type {other}", descr.path())),
        }
    }

    /// Reads the chunk of `column` from `data`, the chunk's bytes (`column.byte_range()`).
    /// With `wanted` (rows, increasing), a data page holding none of them is skipped without
    /// being decompressed: only the rows listed may be asked of the chunk afterwards.
    pub fn read(column: &ColumnChunkMetaData, rows: usize, data: Bytes, wanted: Option<&[u32]>) -> Result<Self> {
        let kind = Self::supports(column)?;
        let max_def = column.column_descr().max_def_level();
        let chunk = Arc::new(ChunkBytes { start: column.byte_range().0, data });
        let mut pages = SerializedPageReader::new(chunk, column, rows, None).map_err(|e| Unsupported(e.to_string()))?;
        let mut dictionary = None;
        let mut data_pages = Vec::new();
        let mut next_row = 0usize;
        let mut wanted_cursor = 0usize;
        loop {
            if let Some(wanted) = wanted {
                let Some(next) = pages.peek_next_page().map_err(|e| Unsupported(e.to_string()))? else { break };
                if let (false, Some(count)) = (next.is_dict, next.num_levels) {
                    let end = next_row + count;
                    while wanted_cursor < wanted.len() && (wanted[wanted_cursor] as usize) < next_row {
                        wanted_cursor += 1;
                    }
                    if wanted.get(wanted_cursor).is_none_or(|&r| r as usize >= end) {
                        pages.skip_next_page().map_err(|e| Unsupported(e.to_string()))?;
                        next_row = end;
                        continue;
                    }
                }
            }
            let Some(page) = pages.get_next_page().map_err(|e| Unsupported(e.to_string()))? else { break };
            match page {
                Page::DictionaryPage { buf, num_values, encoding, .. } => {
                    if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                        return unsupported(format!("a dictionary page encoded {encoding}"));
                    }
                    dictionary = Some(match kind {
                        ValueKind::Int32 => Dictionary::Ints(plain_ints(&buf, 4, num_values as usize)?),
                        ValueKind::Int64 => Dictionary::Ints(plain_ints(&buf, 8, num_values as usize)?),
                        ValueKind::Bytes => Dictionary::Bytes(ByteValues::parse(buf, num_values as usize)?),
                    });
                }
                Page::DataPage { buf, num_values, encoding, .. } => {
                    let rows_in_page = num_values as usize;
                    let (values, valid) = if max_def == 1 { split_definition_levels(buf, rows_in_page)? } else { (buf, None) };
                    // Values stored: one per valid row.
                    let count = valid.as_ref().map_or(rows_in_page, BooleanBuffer::count_set_bits);
                    let body = match encoding {
                        _ if count == 0 => PageBody::Plain { data: Bytes::new(), width: 0 },
                        Encoding::PLAIN => match kind {
                            ValueKind::Int32 | ValueKind::Int64 => {
                                let width = if kind == ValueKind::Int32 { 4 } else { 8 };
                                if values.len() < count * width {
                                    return unsupported("a PLAIN page ends early");
                                }
                                PageBody::Plain { data: values, width }
                            }
                            ValueKind::Bytes => PageBody::PlainBytes(ByteValues::parse(values, count)?),
                        },
                        Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => PageBody::Indices(Indices::parse(values, count)?),
                        // Decoded whole into PLAIN form: deltas have no random access.
                        Encoding::DELTA_BINARY_PACKED if kind != ValueKind::Bytes => {
                            let width = if kind == ValueKind::Int32 { 4 } else { 8 };
                            PageBody::Plain { data: delta_binary_packed(&values, count, width)?, width }
                        }
                        other => return unsupported(format!("a data page encoded {other}")),
                    };
                    data_pages.push(DataPage { first_row: next_row, rows: rows_in_page, body, valid: valid.as_ref().map(Validity::new) });
                    next_row += rows_in_page;
                }
                Page::DataPageV2 { .. } => return unsupported("data page v2"),
            }
        }
        if next_row != rows {
            return unsupported(format!("the pages hold {next_row} values for {rows} rows"));
        }
        if data_pages.iter().any(|p| matches!(p.body, PageBody::Indices(_))) && dictionary.is_none() {
            return unsupported("dictionary indices without a dictionary page");
        }
        Ok(ColumnChunk { rows, kind, dictionary, pages: data_pages })
    }

    /// Rows in the chunk.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The row after the last of the page holding `row` (`None` if no page read holds it).
    pub fn page_end(&self, row: usize) -> Option<usize> {
        let page = &self.pages[self.pages.partition_point(|p| p.first_row + p.rows <= row).min(self.pages.len().checked_sub(1)?)];
        (page.first_row <= row && row < page.first_row + page.rows).then_some(page.first_row + page.rows)
    }

    /// How the values are represented.
    pub fn kind(&self) -> ValueKind {
        self.kind
    }

    /// For integer columns: `codes(value)` for every dictionary entry, or `None` if the chunk
    /// has no dictionary. Lets a caller evaluate a function once per distinct value.
    fn dictionary_codes_int(&self, code: &impl Fn(i64) -> u32) -> Option<Vec<u32>> {
        match &self.dictionary {
            Some(Dictionary::Ints(values)) => Some(values.iter().map(|&v| code(v)).collect()),
            _ => None,
        }
    }

    fn dictionary_codes_bytes(&self, code: &impl Fn(&[u8]) -> u32) -> Option<Vec<u32>> {
        match &self.dictionary {
            Some(Dictionary::Bytes(values)) => Some((0..values.len()).map(|i| code(values.value(i))).collect()),
            _ => None,
        }
    }

    /// Keeps the rows (all rows if `selection` is `None`, else those listed, increasing) whose
    /// value `code` maps to something other than [`NO_CODE`]: their rows go to `rows_out`, their
    /// codes to `codes_out`. Integer columns only. A dictionary index past the dictionary (a
    /// damaged file) maps to nothing.
    pub fn keep_int(&self, selection: Option<&[u32]>, code: impl Fn(i64) -> u32, rows_out: &mut Vec<u32>, codes_out: &mut Vec<u32>) {
        debug_assert!(self.kind != ValueKind::Bytes);
        let table = self.dictionary_codes_int(&code);
        self.for_page_values(selection, rows_out, codes_out, |body, base, in_page, rows_out, codes_out| match body {
            PageBody::Indices(indices) => keep_indices(indices, table.as_deref().unwrap_or(&[]), base, in_page, rows_out, codes_out),
            PageBody::Plain { data, width: 4 } => keep_plain(data, 4, |b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64, &code, base, in_page, rows_out, codes_out),
            PageBody::Plain { data, width: 8 } => keep_plain(data, 8, |b| i64::from_le_bytes(b.try_into().expect("8 bytes")), &code, base, in_page, rows_out, codes_out),
            // A page of NULLs only holds no values.
            PageBody::Plain { .. } => {}
            PageBody::PlainBytes(_) => unreachable!("an integer column"),
        });
    }

    /// [`Self::keep_int`] for byte-string columns.
    pub fn keep_bytes(&self, selection: Option<&[u32]>, code: impl Fn(&[u8]) -> u32, rows_out: &mut Vec<u32>, codes_out: &mut Vec<u32>) {
        debug_assert!(self.kind == ValueKind::Bytes);
        let table = self.dictionary_codes_bytes(&code);
        self.for_page_values(selection, rows_out, codes_out, |body, base, in_page, rows_out, codes_out| match body {
            PageBody::Indices(indices) => keep_indices(indices, table.as_deref().unwrap_or(&[]), base, in_page, rows_out, codes_out),
            PageBody::PlainBytes(values) => match in_page {
                None => append_kept(rows_out, codes_out, values.len(), |p| (base + p as u32, code(values.value(p)))),
                Some(rows) => append_kept(rows_out, codes_out, rows.len(), |k| (rows[k], code(values.value((rows[k] - base) as usize)))),
            },
            // A page of NULLs only holds no values.
            PageBody::Plain { width: 0, .. } => {}
            PageBody::Plain { .. } => unreachable!("a byte-string column"),
        });
    }

    /// Runs `keep(body, base, selection, rows_out, codes_out)`, which keeps values of a page's
    /// body by position (`base` + position, or the positions listed), for every page holding
    /// a selected row (every page, with `None`). For a page with NULLs, `keep` sees the valid
    /// selected rows' value positions, and what it keeps is mapped back to rows.
    #[allow(clippy::type_complexity)]
    fn for_page_values(
        &self,
        selection: Option<&[u32]>,
        rows_out: &mut Vec<u32>,
        codes_out: &mut Vec<u32>,
        mut keep: impl FnMut(&PageBody, u32, Option<&[u32]>, &mut Vec<u32>, &mut Vec<u32>),
    ) {
        let mut positions = Vec::new();
        let mut rows = Vec::new();
        self.for_page_selections(selection, |page, in_page| {
            let base = page.first_row as u32;
            let Some(valid) = &page.valid else { return keep(&page.body, base, in_page, rows_out, codes_out) };
            let from = rows_out.len();
            match in_page {
                None => {
                    keep(&page.body, 0, None, rows_out, codes_out);
                    let rows = valid.rows_of_values(base);
                    rows_out[from..].iter_mut().for_each(|p| *p = rows[*p as usize]);
                }
                Some(selected) => {
                    positions.clear();
                    rows.clear();
                    for &r in selected {
                        if let Some(p) = valid.position((r - base) as usize) {
                            positions.push(p);
                            rows.push(r);
                        }
                    }
                    keep(&page.body, 0, Some(&positions), rows_out, codes_out);
                    // What was kept is a subsequence of `positions`: walk both.
                    let mut j = 0usize;
                    for p in &mut rows_out[from..] {
                        while positions[j] != *p {
                            j += 1;
                        }
                        *p = rows[j];
                    }
                }
            }
        });
    }

    /// Calls `f(page, rows selected in it)` for every page holding a selected row (every page,
    /// with `None`, when there is no selection).
    fn for_page_selections(&self, selection: Option<&[u32]>, mut f: impl FnMut(&DataPage, Option<&[u32]>)) {
        match selection {
            None => self.pages.iter().for_each(|page| f(page, None)),
            Some(rows) => self.visit_pages(rows, |page, in_page| f(page, Some(in_page))),
        }
    }

    /// The values at `rows` (increasing) as an Arrow array of `data_type` (Int32, Date32,
    /// Int64, Decimal128 from INT32/INT64, or Utf8View from byte strings).
    pub fn gather(&self, rows: &[u32], data_type: &DataType) -> Result<ArrayRef> {
        let nulls = self.gather_nulls(rows);
        match (self.kind, data_type) {
            (ValueKind::Bytes, DataType::Utf8View | DataType::Utf8) => {
                let array: ArrayRef = Arc::new(self.gather_views(rows, nulls)?);
                Ok(if data_type == &DataType::Utf8 { arrow::compute::cast(&array, data_type).map_err(|e| Unsupported(e.to_string()))? } else { array })
            }
            (ValueKind::Bytes, other) => unsupported(format!("byte strings as {other}")),
            (_, DataType::Int32) => Ok(Arc::new(Int32Array::new(self.gather_ints(rows, |v| v as i32)?.into(), nulls))),
            (_, DataType::Date32) => Ok(Arc::new(Date32Array::new(self.gather_ints(rows, |v| v as i32)?.into(), nulls))),
            (_, DataType::Int64) => Ok(Arc::new(Int64Array::new(self.gather_ints(rows, |v| v)?.into(), nulls))),
            (_, DataType::Decimal128(p, s)) => Ok(Arc::new(
                Decimal128Array::new(self.gather_ints(rows, |v| v as i128)?.into(), nulls).with_precision_and_scale(*p, *s).map_err(|e| Unsupported(e.to_string()))?,
            )),
            (_, other) => unsupported(format!("integers as {other}")),
        }
    }

    /// Which of `rows` (increasing) are not NULL; `None` if all of them are.
    fn gather_nulls(&self, rows: &[u32]) -> Option<NullBuffer> {
        if self.pages.iter().all(|p| p.valid.is_none()) {
            return None;
        }
        let mut valid = BooleanBufferBuilder::new(rows.len());
        self.visit_pages(rows, |page, in_page| match &page.valid {
            Some(bits) => in_page.iter().for_each(|&r| valid.append(bits.is_valid(r as usize - page.first_row))),
            None => valid.append_n(in_page.len(), true),
        });
        Some(NullBuffer::new(valid.finish())).filter(|n| n.null_count() > 0)
    }

    /// The integer values at `rows` (increasing), each converted. A page whose rows are all
    /// wanted is decoded in one pass; others value by value.
    fn gather_ints<T: Copy + Default>(&self, rows: &[u32], convert: impl Fn(i64) -> T) -> Result<Vec<T>> {
        let dictionary: &[i64] = match &self.dictionary {
            Some(Dictionary::Ints(values)) => values,
            _ => &[],
        };
        let mut out = Vec::with_capacity(rows.len());
        let mut bad = false;
        let mut scratch = Vec::new();
        self.visit_page_values(rows, T::default(), &mut out, |body, first_row, values, in_page, out| match body {
            PageBody::Plain { width: 0, .. } => {}
            PageBody::Plain { data, width } if in_page.len() == values => out.extend(data.chunks_exact(*width).take(values).map(|b| convert(int_at(b, *width, 0)))),
            PageBody::Plain { data, width } => out.extend(in_page.iter().map(|&r| convert(int_at(data, *width, r as usize - first_row)))),
            PageBody::Indices(indices) => bad |= !indices.gather(in_page, first_row, |i| dictionary.get(i as usize).map(|&v| convert(v)), &mut scratch, out),
            PageBody::PlainBytes(_) => unreachable!("an integer column"),
        });
        if bad { unsupported("a dictionary index past the dictionary") } else { Ok(out) }
    }

    /// Runs `gather(body, first_row, values, rows, out)`, which appends the values of a page's
    /// body (of `values` values) at `rows` (less `first_row`: positions), for the pages holding
    /// some of `rows`. For a page with NULLs, `gather` sees the valid rows' value positions (and a
    /// `first_row` of 0), and a NULL row gets `placeholder`.
    fn visit_page_values<T: Copy>(&self, rows: &[u32], placeholder: T, out: &mut Vec<T>, mut gather: impl FnMut(&PageBody, usize, usize, &[u32], &mut Vec<T>)) {
        let mut positions = Vec::new();
        let mut values = Vec::new();
        self.visit_pages(rows, |page, in_page| {
            let Some(valid) = &page.valid else { return gather(&page.body, page.first_row, page.rows, in_page, out) };
            positions.clear();
            positions.extend(in_page.iter().filter_map(|&r| valid.position(r as usize - page.first_row)));
            values.clear();
            gather(&page.body, 0, valid.values, &positions, &mut values);
            let mut next = values.iter();
            out.extend(in_page.iter().map(|&r| if valid.is_valid(r as usize - page.first_row) { *next.next().expect("a value per valid row") } else { placeholder }));
        });
    }

    /// The byte strings at `rows` (increasing) as views into the chunk's buffers (the
    /// dictionary's and the PLAIN pages'), each buffer checked to be UTF-8 once.
    fn gather_views(&self, rows: &[u32], nulls: Option<NullBuffer>) -> Result<StringViewArray> {
        let mut buffers: Vec<Buffer> = Vec::new();
        let dictionary = match &self.dictionary {
            Some(Dictionary::Bytes(values)) => {
                values.check_utf8()?;
                buffers.push(Buffer::from(values.data.clone()));
                Some(values)
            }
            _ => None,
        };
        // Block 0 is the dictionary's buffer.
        let dictionary_view = |i: u32| dictionary.filter(|d| (i as usize) < d.len()).map(|d| make_view(d.value(i as usize), 0, d.offsets[i as usize]));
        let mut views = Vec::with_capacity(rows.len());
        let mut bad = false;
        let mut scratch = Vec::new();
        let mut failed = None;
        self.visit_page_values(rows, 0u128, &mut views, |body, first_row, _, in_page, views| match body {
            PageBody::PlainBytes(values) => {
                if let Err(e) = values.check_utf8() {
                    failed = Some(e);
                    return;
                }
                let block = buffers.len() as u32;
                buffers.push(Buffer::from(values.data.clone()));
                views.extend(in_page.iter().map(|&r| {
                    let i = r as usize - first_row;
                    make_view(values.value(i), block, values.offsets[i])
                }));
            }
            PageBody::Indices(indices) => bad |= !indices.gather(in_page, first_row, dictionary_view, &mut scratch, views),
            // A page of NULLs only holds no values.
            PageBody::Plain { width: 0, .. } => {}
            PageBody::Plain { .. } => unreachable!("a byte-string column"),
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if bad {
            return unsupported("a dictionary index past the dictionary");
        }
        // SAFETY: every view was made by `make_view` from a value lying in the buffer it names,
        // at its offset, and every buffer's values were checked to be UTF-8.
        Ok(unsafe { StringViewArray::new_unchecked(views.into(), buffers, nulls) })
    }

    /// Calls `f(page, rows in that page)` for the pages holding some of `rows` (increasing).
    fn visit_pages(&self, rows: &[u32], mut f: impl FnMut(&DataPage, &[u32])) {
        let mut cursor = 0usize;
        for page in &self.pages {
            let end = page.first_row + page.rows;
            let start = cursor;
            while cursor < rows.len() && (rows[cursor] as usize) < end {
                cursor += 1;
            }
            if cursor > start {
                // A row before this page lies in a page `read` skipped: it was not wanted then.
                assert!(rows[start] as usize >= page.first_row, "row {} of a page skipped as unwanted", rows[start]);
                f(page, &rows[start..cursor]);
            }
        }
    }
}

/// Appends `f(i) = (row, code)` for `i` in `0..n` to `rows_out` and `codes_out` where the code is
/// not [`NO_CODE`]. Each pair is written, and kept by advancing the length, so there is no branch
/// per value to mispredict when about half the values pass.
#[inline]
fn append_kept(rows_out: &mut Vec<u32>, codes_out: &mut Vec<u32>, n: usize, mut f: impl FnMut(usize) -> (u32, u32)) {
    rows_out.reserve(n);
    codes_out.reserve(n);
    let (rows_len, codes_len) = (rows_out.len(), codes_out.len());
    let rows_spare = &mut rows_out.spare_capacity_mut()[..n];
    let codes_spare = &mut codes_out.spare_capacity_mut()[..n];
    let mut kept = 0usize;
    for i in 0..n {
        let (row, code) = f(i);
        rows_spare[kept].write(row);
        codes_spare[kept].write(code);
        kept += (code != NO_CODE) as usize;
    }
    // SAFETY: the first `kept` spare slots of each vector were written above (kept <= i + 1
    // after step i, and every step writes slot `kept` before advancing it).
    unsafe {
        rows_out.set_len(rows_len + kept);
        codes_out.set_len(codes_len + kept);
    }
}

/// Visits, in order, the runs of the RLE / bit-packed hybrid encoding of `count` values
/// `bit_width` bits wide that `data` holds from byte `pos` on (a packed run's position is a
/// byte of `data`).
fn visit_runs(data: &[u8], mut pos: usize, bit_width: u8, count: usize, mut visit: impl FnMut(Run)) -> Result<()> {
    let mut first = 0usize;
    while first < count {
        let (header, used) = read_uleb128(&data[pos.min(data.len())..])?;
        pos += used;
        if header & 1 == 1 {
            let groups = (header >> 1) as usize;
            let len = (groups * 8).min(count - first);
            let bytes = groups * bit_width as usize;
            if pos + bytes > data.len() {
                return unsupported("bit-packed run past the end of the page");
            }
            visit(Run { first: first as u32, len: len as u32, kind: RunKind::Packed(pos as u32) });
            pos += bytes;
            first += len;
        } else {
            let len = ((header >> 1) as usize).min(count - first);
            if len == 0 {
                return unsupported("an empty repeated run");
            }
            let width = (bit_width as usize).div_ceil(8);
            let Some(raw) = data.get(pos..pos + width) else { return unsupported("repeated run past the end of the page") };
            // Little-endian, assembled in registers: copying 1-4 bytes into an array and
            // reading it back as a u32 called memcpy and stalled on the store; with the short
            // runs of definition levels, that was 60% of the parsing (perf, TPC-DS SF 1).
            let value = raw.iter().rev().fold(0u32, |value, &byte| (value << 8) | u32::from(byte));
            visit(Run { first: first as u32, len: len as u32, kind: RunKind::Repeated(value) });
            pos += width;
            first += len;
        }
    }
    Ok(())
}

/// `keep_*` over a page of dictionary indices: `table` is the code of each entry.
fn keep_indices(indices: &Indices, table: &[u32], base: u32, in_page: Option<&[u32]>, rows_out: &mut Vec<u32>, codes_out: &mut Vec<u32>) {
    let lookup = |index: u32| table.get(index as usize).copied().unwrap_or(NO_CODE);
    match in_page {
        None => {
            let mut unpacked = Vec::new();
            for run in &indices.runs {
                let first = base + run.first;
                match run.kind {
                    RunKind::Repeated(index) => {
                        let code = lookup(index);
                        if code != NO_CODE {
                            rows_out.extend(first..first + run.len);
                            codes_out.extend(std::iter::repeat_n(code, run.len as usize));
                        }
                    }
                    RunKind::Packed(start) => {
                        // Eight at a time by the unpacker, then looked up (reading bits one by
                        // one took 29% of a scan filtering on a dictionary column).
                        unpacked.clear();
                        unpack_run(&indices.data[start as usize..], indices.bit_width, run.len as usize, &mut unpacked);
                        append_kept(rows_out, codes_out, unpacked.len(), |i| (first + i as u32, lookup(unpacked[i])));
                    }
                }
            }
        }
        Some(rows) if decode_whole_page(rows.len(), indices.len()) => {
            let mut all = Vec::with_capacity(indices.len());
            indices.decode_all(&mut all);
            append_kept(rows_out, codes_out, rows.len(), |k| (rows[k], lookup(all[(rows[k] - base) as usize])));
        }
        Some(rows) => {
            let mut run = 0usize;
            append_kept(rows_out, codes_out, rows.len(), |k| {
                let p = (rows[k] - base) as usize;
                while (indices.runs[run].first + indices.runs[run].len) as usize <= p {
                    run += 1;
                }
                (rows[k], lookup(indices.get(&indices.runs[run], p)))
            });
        }
    }
}

/// `keep_int` over a page of PLAIN values `width` bytes wide, read by `value`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn keep_plain(data: &[u8], width: usize, value: impl Fn(&[u8]) -> i64, code: &impl Fn(i64) -> u32, base: u32, in_page: Option<&[u32]>, rows_out: &mut Vec<u32>, codes_out: &mut Vec<u32>) {
    match in_page {
        None => append_kept(rows_out, codes_out, data.len() / width, |p| (base + p as u32, code(value(&data[p * width..p * width + width])))),
        Some(rows) => append_kept(rows_out, codes_out, rows.len(), |k| {
            let at = (rows[k] - base) as usize * width;
            (rows[k], code(value(&data[at..at + width])))
        }),
    }
}

#[inline]
fn int_at(data: &[u8], width: usize, position: usize) -> i64 {
    let at = position * width;
    if width == 4 {
        i32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as i64
    } else {
        i64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"))
    }
}

fn plain_ints(data: &[u8], width: usize, count: usize) -> Result<Vec<i64>> {
    if data.len() < count * width {
        return unsupported("a dictionary page ends early");
    }
    Ok((0..count).map(|i| int_at(data, width, i)).collect())
}

/// Data page v1 of an optional column: the definition levels (a 4-byte length, then the
/// hybrid encoding at bit width 1) and the values after them; which of the page's `rows` are
/// valid (`None` when all of them are). A bit-packed run of levels is already a validity
/// bitmap, least significant bit first: it is copied as it is.
fn split_definition_levels(page: Bytes, rows: usize) -> Result<(Bytes, Option<BooleanBuffer>)> {
    let Some(len) = page.get(..4) else { return unsupported("a page without its definition levels") };
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    let Some(levels) = page.get(4..4 + len) else { return unsupported("definition levels past the end of the page") };
    // Decoded as the runs are read, with no list of them kept.
    let mut valid = BooleanBufferBuilder::new(rows);
    visit_runs(levels, 0, 1, rows, |run| match run.kind {
        RunKind::Repeated(level) => valid.append_n(run.len as usize, level == 1),
        RunKind::Packed(start) => {
            let first = start as usize * 8;
            valid.append_packed_range(first..first + run.len as usize, levels);
        }
    })?;
    let valid = valid.finish();
    let values = page.slice(4 + len..);
    Ok(if valid.count_set_bits() == rows { (values, None) } else { (values, Some(valid)) })
}

/// The `count` values of a DELTA_BINARY_PACKED page (the Parquet format's specification:
/// a header of block size, miniblocks per block, value count and first value, then blocks of a
/// minimum delta, each miniblock's bit width and the miniblocks' bit-packed deltas), as
/// `width`-byte little-endian integers. Sums wrap, as the writer's differences did.
fn delta_binary_packed(page: &[u8], count: usize, width: usize) -> Result<Bytes> {
    let mut at = 0usize;
    let varint = |at: &mut usize| -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let &byte = page.get(*at).ok_or_else(|| Unsupported("a DELTA_BINARY_PACKED page ends early".into()))?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        unsupported("a DELTA_BINARY_PACKED varint is too long")
    };
    let zigzag = |v: u64| ((v >> 1) as i64) ^ -((v & 1) as i64);
    let block = varint(&mut at)? as usize;
    let miniblocks = varint(&mut at)? as usize;
    let total = varint(&mut at)? as usize;
    let mut value = zigzag(varint(&mut at)?);
    if total != count || miniblocks == 0 || block == 0 || block % miniblocks != 0 || (block / miniblocks) % 8 != 0 {
        return unsupported(format!("a DELTA_BINARY_PACKED page of {total} values in blocks of {block} / {miniblocks} for {count} rows"));
    }
    let per_miniblock = block / miniblocks;
    let mut out = Vec::with_capacity(count * width);
    let mut push = |v: i64| if width == 4 { out.extend_from_slice(&(v as i32).to_le_bytes()) } else { out.extend_from_slice(&v.to_le_bytes()) };
    if count > 0 {
        push(value);
    }
    let mut left = count.saturating_sub(1);
    let mut padded = Vec::new();
    while left > 0 {
        let min_delta = zigzag(varint(&mut at)?);
        let widths = page.get(at..at + miniblocks).ok_or_else(|| Unsupported("a DELTA_BINARY_PACKED block ends early".into()))?.to_vec();
        at += miniblocks;
        for bits in widths {
            if left == 0 {
                break;
            }
            let bits = bits as usize;
            if bits > 64 {
                return unsupported(format!("a DELTA_BINARY_PACKED miniblock of {bits}-bit deltas"));
            }
            let bytes = per_miniblock * bits / 8;
            let packed = page.get(at..at + bytes).ok_or_else(|| Unsupported("a DELTA_BINARY_PACKED miniblock ends early".into()))?;
            at += bytes;
            // Padded so that every field is read as one unaligned 16-byte load (a per-value
            // copy into a window took 30% of SSB q2.1's samples over delta pages).
            padded.clear();
            padded.extend_from_slice(packed);
            padded.resize(bytes + 16, 0);
            let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            for j in 0..per_miniblock.min(left) {
                // The j-th `bits`-bit field, least significant bit first.
                let (first, shift) = ((j * bits) / 8, (j * bits) % 8);
                let field = if bits <= 56 {
                    u64::from_le_bytes(padded[first..first + 8].try_into().expect("8 bytes")) >> shift
                } else {
                    (u128::from_le_bytes(padded[first..first + 16].try_into().expect("16 bytes")) >> shift) as u64
                };
                value = value.wrapping_add(min_delta).wrapping_add((field & mask) as i64);
                push(value);
            }
            left -= per_miniblock.min(left);
        }
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray, Int32Array, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// Rows whose values repeat (dictionary pages), a column too varied for its dictionary
    /// (the writer falls back to PLAIN pages), and strings.
    fn batch(rows: usize, nullable: bool) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("small", DataType::Int32, nullable),
            Field::new("wide", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let small = Int32Array::from_iter_values((0..rows).map(|i| ((i * 7919) % 97) as i32 - 40));
        let wide = Int64Array::from_iter_values((0..rows).map(|i| (i as i64).wrapping_mul(2_654_435_761) % 1_000_000_007));
        let name = StringArray::from_iter_values((0..rows).map(|i| format!("name-{}", (i * 31) % 53)));
        RecordBatch::try_new(schema, vec![Arc::new(small), Arc::new(wide), Arc::new(name)]).unwrap()
    }

    fn write(batch: &RecordBatch, props: WriterProperties) -> Bytes {
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        Bytes::from(out)
    }

    fn chunks(file: &Bytes) -> Vec<Result<ColumnChunk>> {
        chunks_wanted(file, None)
    }

    fn chunks_wanted(file: &Bytes, wanted: Option<&[u32]>) -> Vec<Result<ColumnChunk>> {
        let metadata = ParquetMetaDataReader::new().parse_and_finish(file).unwrap();
        let group = metadata.row_group(0);
        (0..group.num_columns())
            .map(|c| {
                let column = group.column(c);
                let (start, len) = column.byte_range();
                ColumnChunk::read(column, group.num_rows() as usize, file.slice(start as usize..(start + len) as usize), wanted)
            })
            .collect()
    }

    /// DELTA_BINARY_PACKED pages of values whose differences overflow (and of one value, and
    /// of runs of equal ones) read back as written.
    #[test]
    fn delta_pages_read_back_at_the_extremes() {
        let wide: Vec<i64> = (0..5_000).map(|i| [i64::MAX, i64::MIN, 0, -1, i * 1_000_003, 7][i as usize % 6]).chain([42; 300]).collect();
        let narrow: Vec<i32> = wide.iter().map(|&v| v as i32).collect();
        let schema = Arc::new(Schema::new(vec![Field::new("wide", DataType::Int64, false), Field::new("narrow", DataType::Int32, false)]));
        let data = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(wide.clone())), Arc::new(Int32Array::from(narrow.clone()))]).unwrap();
        for page_rows in [1, 700, 20_000] {
            let props = WriterProperties::builder()
                .set_dictionary_enabled(false)
                .set_encoding(parquet::basic::Encoding::DELTA_BINARY_PACKED)
                .set_data_page_row_count_limit(page_rows)
                .set_write_batch_size(page_rows)
                .build();
            let file = write(&data, props);
            let chunks: Vec<ColumnChunk> = chunks(&file).into_iter().map(|c| c.unwrap()).collect();
            let all: Vec<u32> = (0..wide.len() as u32).collect();
            assert_eq!(chunks[0].gather(&all, &DataType::Int64).unwrap().as_primitive::<arrow::datatypes::Int64Type>().values().to_vec(), wide, "{page_rows} rows a page");
            assert_eq!(chunks[1].gather(&all, &DataType::Int32).unwrap().as_primitive::<arrow::datatypes::Int32Type>().values().to_vec(), narrow, "{page_rows} rows a page");
        }
    }

    /// Repeated runs of dictionary indices one to three bytes wide (dictionaries of up to 70,000
    /// entries) read back as written: a run's value is stored little-endian in as many bytes as
    /// its bit width needs.
    #[test]
    fn repeated_runs_of_wide_indices_read_back() {
        for distinct in [200i64, 5_000, 70_000] {
            // Each value ten times in a row: the writer stores repeated runs.
            let values: Vec<i64> = (0..distinct * 10).map(|i| (i / 10) * 7 + 1).collect();
            let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
            let data = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.clone()))]).unwrap();
            let props = WriterProperties::builder().set_dictionary_page_size_limit(1 << 24).build();
            let file = write(&data, props);
            let chunk = chunks(&file).remove(0).unwrap();
            assert!(chunk.pages.iter().all(|p| matches!(&p.body, PageBody::Indices(i) if i.runs.iter().any(|r| matches!(r.kind, RunKind::Repeated(_))))), "{distinct} values: not repeated runs of indices");
            let all: Vec<u32> = (0..values.len() as u32).collect();
            assert_eq!(chunk.gather(&all, &DataType::Int64).unwrap().as_primitive::<arrow::datatypes::Int64Type>().values().to_vec(), values, "{distinct} distinct values");
        }
    }

    /// Every configuration: the values gathered at a selection and the rows a lookup keeps are
    /// those of the batch written.
    #[test]
    fn reads_what_arrow_wrote() {
        let rows = 50_000;
        let data = batch(rows, false);
        let configs = [
            WriterProperties::builder().set_compression(Compression::SNAPPY).set_data_page_row_count_limit(4_000).build(),
            WriterProperties::builder().set_dictionary_enabled(false).set_data_page_row_count_limit(3_000).build(),
            WriterProperties::builder().set_compression(Compression::ZSTD(Default::default())).set_dictionary_page_size_limit(1024).build(),
            WriterProperties::builder()
                .set_dictionary_enabled(false)
                .set_encoding(parquet::basic::Encoding::DELTA_BINARY_PACKED)
                .set_column_encoding("name".into(), parquet::basic::Encoding::PLAIN)
                .set_data_page_row_count_limit(3_000)
                .build(),
        ];
        // Dense and sparse selections: pages are decoded whole for one, value by value for the other.
        let dense: Vec<u32> = (0..rows as u32).filter(|r| r % 13 == 0 || r % 1000 < 3).collect();
        let sparse: Vec<u32> = (0..rows as u32).filter(|r| r % 97 == 0).collect();
        for props in configs {
            let file = write(&data, props);
            let chunks: Vec<ColumnChunk> = chunks(&file).into_iter().map(|c| c.unwrap()).collect();
            for (c, chunk) in chunks.iter().enumerate() {
                assert_eq!(chunk.rows(), rows);
                for selection in [&dense, &sparse] {
                    let expected = arrow::compute::take(data.column(c), &arrow::array::UInt32Array::from(selection.clone()), None).unwrap();
                    let target = if c == 2 { DataType::Utf8 } else { data.column(c).data_type().clone() };
                    assert_eq!(chunk.gather(selection, &target).unwrap().as_ref(), expected.as_ref(), "column {c}");
                }
            }
            // Keep the even values of `small`, coded as value + 100.
            let small = data.column(0).as_primitive::<arrow::datatypes::Int32Type>();
            let code = |v: i64| if v % 2 == 0 { (v + 100) as u32 } else { NO_CODE };
            let (mut kept, mut codes) = (Vec::new(), Vec::new());
            chunks[0].keep_int(None, code, &mut kept, &mut codes);
            let want: Vec<u32> = (0..rows as u32).filter(|&r| small.value(r as usize) % 2 == 0).collect();
            assert_eq!(kept, want);
            assert!(codes.iter().zip(&kept).all(|(&c, &r)| c == (small.value(r as usize) + 100) as u32));
            // Then, among those, the wide values below 1e8 (a plain column for most pages).
            let wide = data.column(1).as_primitive::<arrow::datatypes::Int64Type>();
            let (mut kept2, mut codes2) = (Vec::new(), Vec::new());
            chunks[1].keep_int(Some(&kept), |v| if v < 100_000_000 { 1 } else { NO_CODE }, &mut kept2, &mut codes2);
            let want2: Vec<u32> = want.iter().copied().filter(|&r| wide.value(r as usize) < 100_000_000).collect();
            assert_eq!(kept2, want2);
            // Strings, by dictionary entry.
            let names = data.column(2).as_string::<i32>();
            let (mut kept3, mut codes3) = (Vec::new(), Vec::new());
            chunks[2].keep_bytes(Some(&want2), |b| if b.ends_with(b"7") { 7 } else { NO_CODE }, &mut kept3, &mut codes3);
            let want3: Vec<u32> = want2.iter().copied().filter(|&r| names.value(r as usize).ends_with('7')).collect();
            assert_eq!(kept3, want3);
            let (mut kept4, mut codes4) = (Vec::new(), Vec::new());
            chunks[2].keep_bytes(Some(&sparse), |b| if b.ends_with(b"7") { 7 } else { NO_CODE }, &mut kept4, &mut codes4);
            let want4: Vec<u32> = sparse.iter().copied().filter(|&r| names.value(r as usize).ends_with('7')).collect();
            assert_eq!(kept4, want4);
        }
    }

    /// With wanted rows, only the pages holding them are kept, and they read as written.
    #[test]
    fn pages_without_wanted_rows_are_skipped() {
        let rows = 50_000;
        let data = batch(rows, false);
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).set_data_page_row_count_limit(4_000).set_write_batch_size(1_000).build();
        let file = write(&data, props);
        let wanted: Vec<u32> = (100..110).chain(45_000..45_003).collect();
        for (c, chunk) in chunks_wanted(&file, Some(&wanted)).into_iter().enumerate() {
            let chunk = chunk.unwrap();
            assert_eq!(chunk.rows(), rows);
            assert_eq!(chunk.pages.len(), 2, "column {c}: pages kept");
            let expected = arrow::compute::take(data.column(c), &arrow::array::UInt32Array::from(wanted.clone()), None).unwrap();
            let target = if c == 2 { DataType::Utf8 } else { data.column(c).data_type().clone() };
            assert_eq!(chunk.gather(&wanted, &target).unwrap().as_ref(), expected.as_ref(), "column {c}");
        }
        let all = chunks(&file).into_iter().next().unwrap().unwrap();
        assert!(all.pages.len() > 10, "{} pages", all.pages.len());
    }

    /// Optional columns with NULLs (some pages holding none, one holding only NULLs), in
    /// dictionary and PLAIN pages: gathered, NULLs are NULL; kept, a NULL row never passes,
    /// even a test its placeholder would pass.
    #[test]
    fn optional_columns_read_with_their_nulls() {
        let rows = 30_000usize;
        let null_at = |i: usize| (i < 10_000 && i % 7 == 3) || (12_500..15_000).contains(&i) || i >= 29_990;
        let schema = Arc::new(Schema::new(vec![
            Field::new("small", DataType::Int32, true),
            Field::new("wide", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let small = Int32Array::from_iter((0..rows).map(|i| (!null_at(i)).then_some(((i * 7919) % 97) as i32 - 40)));
        let wide = Int64Array::from_iter((0..rows).map(|i| (!null_at(i)).then_some((i as i64).wrapping_mul(2_654_435_761) % 1_000_000_007)));
        let name = StringArray::from_iter((0..rows).map(|i| (!null_at(i)).then(|| format!("name-{}", (i * 31) % 53))));
        let data = RecordBatch::try_new(schema, vec![Arc::new(small), Arc::new(wide), Arc::new(name)]).unwrap();
        for dictionary in [true, false] {
            let props = WriterProperties::builder().set_dictionary_enabled(dictionary).set_data_page_row_count_limit(2_500).set_write_batch_size(500).build();
            let file = write(&data, props);
            let chunks: Vec<ColumnChunk> = chunks(&file).into_iter().map(|c| c.unwrap()).collect();
            assert!(chunks[0].pages.iter().any(|p| p.valid.is_none()) && chunks[0].pages.iter().any(|p| p.valid.as_ref().is_some_and(|v| v.values == 0)));
            let selections: [Vec<u32>; 3] = [(0..rows as u32).collect(), (0..rows as u32).filter(|r| r % 13 == 0 || r % 1000 < 3).collect(), (0..rows as u32).filter(|r| r % 97 == 0).collect()];
            for selection in &selections {
                for (c, chunk) in chunks.iter().enumerate() {
                    let expected = arrow::compute::take(data.column(c), &arrow::array::UInt32Array::from(selection.clone()), None).unwrap();
                    let target = if c == 2 { DataType::Utf8 } else { data.column(c).data_type().clone() };
                    assert_eq!(chunk.gather(selection, &target).unwrap().as_ref(), expected.as_ref(), "column {c}, dictionary {dictionary}");
                }
                // Every value passes, and 0 (a NULL's placeholder) too: only the NULL rows do not.
                let want: Vec<u32> = selection.iter().copied().filter(|&r| !null_at(r as usize)).collect();
                for (c, chunk) in chunks.iter().enumerate() {
                    let (mut kept, mut codes) = (Vec::new(), Vec::new());
                    if c == 2 {
                        chunk.keep_bytes(Some(selection), |_| 1, &mut kept, &mut codes);
                    } else {
                        chunk.keep_int(Some(selection), |_| 1, &mut kept, &mut codes);
                    }
                    assert_eq!(kept, want, "column {c}, dictionary {dictionary}");
                    assert_eq!(codes.len(), kept.len());
                }
                let (mut kept, mut codes) = (Vec::new(), Vec::new());
                chunks[0].keep_int(None, |v| if v == 0 || v % 2 == 0 { 5 } else { NO_CODE }, &mut kept, &mut codes);
                let small = data.column(0).as_primitive::<arrow::datatypes::Int32Type>();
                let even: Vec<u32> = (0..rows as u32).filter(|&r| small.is_valid(r as usize) && small.value(r as usize) % 2 == 0).collect();
                assert_eq!(kept, even, "dictionary {dictionary}");
            }
        }
    }

    #[test]
    fn gathered_indices_are_looked_up_and_one_past_the_dictionary_fails() {
        // 64 two-bit indices cycling 0, 1, 2, 3 in one bit-packed run (8 groups), then padding
        // for the unpacker's reads past a group's start.
        let mut page = vec![2u8, (8 << 1) | 1];
        page.extend([0b11_10_01_00u8; 16]);
        page.extend([0u8; 8]);
        let indices = Indices::parse(Bytes::from(page), 64).expect("a valid page");
        let gather = |dictionary: &[i64], rows: &[u32]| {
            let mut out = Vec::new();
            let ok = indices.gather(rows, 0, |i| dictionary.get(i as usize).copied(), &mut Vec::new(), &mut out);
            ok.then_some(out)
        };
        let all: Vec<u32> = (0..64).collect();
        let full = [10, 20, 30, 40];
        assert_eq!(gather(&full, &all), Some((0..64).map(|i| 10 * (i % 4 + 1)).collect()));
        // One row of 64 is looked up by its run, not by decoding the page.
        assert!(!decode_whole_page(1, 64));
        assert_eq!(gather(&full, &[6]), Some(vec![30]));
        // A damaged page's index 3 has no value in a dictionary of three, whichever way it is read.
        assert_eq!(gather(&full[..3], &all), None);
        assert_eq!(gather(&full[..3], &[7]), None);
        assert_eq!(gather(&full[..3], &[6]), Some(vec![30]));
    }

    #[test]
    fn bit_reads_cross_byte_and_buffer_ends() {
        let data = [0b1010_1100u8, 0b0101_0011, 0xFF];
        assert_eq!(read_bits(&data, 0, 3), 0b100);
        assert_eq!(read_bits(&data, 6, 5), 0b01110);
        assert_eq!(read_bits(&data, 16, 8), 0xFF);
        assert_eq!(read_bits(&data, 20, 0), 0);
        assert_eq!(read_uleb128(&[0x80, 0x01]), Ok((128, 2)));
        assert!(read_uleb128(&[0x80; 12]).is_err());
    }
}
