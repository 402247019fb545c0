//! The Smart SSD paper's synthetic tables (Do et al., *Query Processing on Smart SSDs*, SIGMOD
//! 2013, section 4.1.1): Synthetic4, Synthetic16 and Synthetic64 have 4, 16 and 64 integer
//! columns (400M rows in the paper) and are queried with
//! `SELECT SecondColumn FROM SyntheticTable WHERE FirstColumn < [VALUE]` and its `AVG` variant
//! at selectivities from 0.1% to 100%.
//!
//! The paper names neither the columns (beyond "FirstColumn"/"SecondColumn") nor the value
//! distribution. Here the columns are `col1`..`colN`, `Int32`, every value independent and
//! uniform over `0..`[`SYNTHETIC_VALUE_RANGE`], so `col1 < c` selects a fraction
//! `c / SYNTHETIC_VALUE_RANGE` of the rows (0.1% is `col1 < 100_000`).

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use rand::distr::{Distribution, Uniform};

use crate::{BATCH_ROWS, CHUNK_ROWS_TARGET, TableGenerator, chunk_rng, chunks_for};

/// Values are uniform over `0..SYNTHETIC_VALUE_RANGE`: `colK < c` has selectivity
/// `c / SYNTHETIC_VALUE_RANGE`.
pub const SYNTHETIC_VALUE_RANGE: i32 = 100_000_000;

/// Seed-stream identity of the synthetic tables ("SYNTH").
const SYNTHETIC_TAG: u64 = 0x53_594e_5448;

/// A synthetic table `name` of `columns` uniform `Int32` columns `col1`..`colN` and `rows` rows.
///
/// The paper's tables have 4, 16 or 64 columns; any positive count works. The data is a pure
/// function of `(columns, rows, seed)`.
///
/// # Panics
/// If `columns` is zero.
pub fn synthetic_table(
    name: &str,
    columns: usize,
    rows: u64,
    seed: u64,
) -> Box<dyn TableGenerator> {
    Box::new(Synthetic::new(name, columns, rows, seed, CHUNK_ROWS_TARGET))
}

/// A SyntheticN table, or the text table.
struct Synthetic {
    name: String,
    rows: u64,
    seed: u64,
    chunk_rows: u64,
    schema: SchemaRef,
    text: bool,
}

impl Synthetic {
    fn new(name: &str, columns: usize, rows: u64, seed: u64, chunk_rows: u64) -> Self {
        assert!(columns > 0, "a synthetic table needs at least one column");
        let fields: Vec<Field> = (1..=columns)
            .map(|i| Field::new(format!("col{i}"), DataType::Int32, false))
            .collect();
        Self {
            name: name.to_string(),
            rows,
            seed,
            chunk_rows: chunk_rows.max(1),
            schema: Arc::new(Schema::new(fields)),
            text: false,
        }
    }

    /// The text table ([`text_table`]) in chunks of `chunk_rows`.
    fn text(name: &str, rows: u64, seed: u64, chunk_rows: u64) -> Self {
        let schema = Arc::new(Schema::new(vec![Field::new("code", DataType::Int32, false), Field::new("text", DataType::Utf8, false)]));
        Self { name: name.to_string(), rows, seed, chunk_rows: chunk_rows.max(1), schema, text: true }
    }

    /// `n` rows of uniform columns, from `rng`.
    fn uniform_batch(&self, n: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<ArrayRef> {
        let values = Uniform::new(0, SYNTHETIC_VALUE_RANGE).expect("non-empty range");
        // Column by column: each column of the batch is one run of the chunk's stream.
        (0..self.schema.fields().len())
            .map(|_| {
                let column: Int32Array = (0..n).map(|_| values.sample(rng)).collect();
                Arc::new(column) as ArrayRef
            })
            .collect()
    }

    /// `n` rows of the text table, from `rng`, its words drawn from `vocabulary`.
    fn text_batch(n: usize, vocabulary: &[String], rng: &mut rand_chacha::ChaCha8Rng) -> Vec<ArrayRef> {
        let codes = Uniform::new(0, TEXT_CODES).expect("non-empty range");
        let lengths = Uniform::new_inclusive(10usize, 90).expect("non-empty range");
        let words = Uniform::new(0, vocabulary.len()).expect("a vocabulary");
        let code: Int32Array = (0..n).map(|_| codes.sample(rng)).collect();
        let mut text = StringBuilder::with_capacity(n, n * 50);
        let mut value = String::with_capacity(96);
        for _ in 0..n {
            value.clear();
            let length = lengths.sample(rng);
            while value.len() < length {
                if !value.is_empty() {
                    value.push(' ');
                }
                value.push_str(&vocabulary[words.sample(rng)]);
            }
            value.truncate(length);
            text.append_value(&value);
        }
        vec![Arc::new(code), Arc::new(text.finish())]
    }

    /// The text table's words: [`TEXT_WORDS`] of 2 to 9 random lowercase letters, the same in
    /// every chunk of a table (of its seed).
    fn vocabulary(&self) -> Vec<String> {
        let mut rng = chunk_rng(self.seed, VOCABULARY_TAG, 0);
        let word_lengths = Uniform::new_inclusive(2usize, 9).expect("non-empty range");
        let letters = Uniform::new_inclusive(b'a', b'z').expect("non-empty range");
        (0..TEXT_WORDS).map(|_| (0..word_lengths.sample(&mut rng)).map(|_| char::from(letters.sample(&mut rng))).collect()).collect()
    }
}

impl TableGenerator for Synthetic {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn estimated_rows(&self) -> u64 {
        self.rows
    }

    fn chunk_count(&self) -> usize {
        chunks_for(self.rows, self.chunk_rows)
    }

    fn chunk(&self, index: usize) -> Box<dyn Iterator<Item = RecordBatch> + Send + '_> {
        let start = (index as u64 * self.chunk_rows).min(self.rows);
        let mut remaining = (start + self.chunk_rows).min(self.rows) - start;
        let mut rng = chunk_rng(self.seed, if self.text { TEXT_TAG } else { SYNTHETIC_TAG }, index);
        let vocabulary = if self.text { self.vocabulary() } else { Vec::new() };
        Box::new(std::iter::from_fn(move || {
            if remaining == 0 {
                return None;
            }
            let n = remaining.min(BATCH_ROWS as u64) as usize;
            remaining -= n as u64;
            let columns = if self.text { Self::text_batch(n, &vocabulary, &mut rng) } else { self.uniform_batch(n, &mut rng) };
            Some(RecordBatch::try_new(self.schema.clone(), columns).expect("columns match schema"))
        }))
    }
}

/// Seed-stream identity of the text table ("TEXT").
const TEXT_TAG: u64 = 0x54_4558_54;

/// Seed-stream identity of the text table's vocabulary ("VOCAB").
const VOCABULARY_TAG: u64 = 0x56_4f43_4142;

/// Words in the text table's vocabulary. Text of random letters is stored as it is (Snappy
/// finds no repeats in it), while prose repeats its words and is stored compressed, at 2 to 3
/// times the decoding cost a byte: a column of random letters decoded at the rate calibrated
/// on it, one of 300 repeated words of the same lengths at 3 times that (2M rows, one thread,
/// 33 ms against 100 ms), and TPC-H's comments at 2 times (`o_comment`, 15M rows, one
/// thread: 607 ms where the random-letter rate predicted 327 ms).
const TEXT_WORDS: usize = 300;

/// Distinct values of the text table's `code` column: few enough to be dictionary-encoded.
pub const TEXT_CODES: i32 = 1000;

/// A table `name` of `rows` rows for measuring decoding by column kind: `code`, an `Int32` of
/// [`TEXT_CODES`] distinct values (dictionary-encoded, as most stored columns are), and `text`,
/// 10 to 90 bytes of words of a vocabulary (50 on average: as long and as varied as TPC-H's
/// comments, too varied for a dictionary, and compressed as prose is).
pub fn text_table(name: &str, rows: u64, seed: u64) -> Box<dyn TableGenerator> {
    Box::new(Synthetic::text(name, rows, seed, CHUNK_ROWS_TARGET))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_util::generate_all as all_rows;

    fn column(batch: &RecordBatch, i: usize) -> &Int32Array {
        batch
            .column(i)
            .as_any()
            .downcast_ref::<Int32Array>()
            .expect("Int32 column")
    }

    #[test]
    fn schema_names_and_types() {
        for columns in [4, 16, 64] {
            let table = synthetic_table(&format!("synthetic{columns}"), columns, 10, 1);
            let schema = table.schema();
            assert_eq!(schema.fields().len(), columns);
            assert_eq!(schema.field(0).name(), "col1");
            assert_eq!(schema.field(columns - 1).name(), &format!("col{columns}"));
            assert!(
                schema
                    .fields()
                    .iter()
                    .all(|f| f.data_type() == &DataType::Int32)
            );
            for batch in table.chunk(0) {
                assert_eq!(batch.schema(), schema);
            }
        }
    }

    /// The text table's codes stay in their range and its strings in 10-90 bytes of words.
    #[test]
    fn text_table_codes_and_strings() {
        let table = text_table("text", 5000, 3);
        let batches: Vec<RecordBatch> = table.chunk(0).collect();
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 5000);
        for batch in &batches {
            assert!(column(batch, 0).iter().all(|c| (0..TEXT_CODES).contains(&c.unwrap())));
            let text = batch.column(1).as_any().downcast_ref::<arrow::array::StringArray>().expect("Utf8 column");
            assert!(text.iter().all(|t| (10..=90).contains(&t.unwrap().len()) && t.unwrap().bytes().all(|b| b == b' ' || b.is_ascii_lowercase())));
        }
    }

    /// Every chunk's text repeats the table's vocabulary's words (a string's last word may be
    /// cut short), so it compresses as prose does.
    #[test]
    fn text_table_words_come_from_one_vocabulary() {
        let table = Synthetic::text("text", 20_000, 3, 10_000);
        let vocabulary: std::collections::HashSet<String> = table.vocabulary().into_iter().collect();
        assert!(vocabulary.len() > TEXT_WORDS / 2, "a vocabulary of distinct words");
        for chunk in 0..table.chunk_count() {
            for batch in table.chunk(chunk) {
                let text = batch.column(1).as_any().downcast_ref::<arrow::array::StringArray>().expect("Utf8 column");
                for value in text.iter().flatten() {
                    let words: Vec<&str> = value.split(' ').collect();
                    assert!(words[..words.len() - 1].iter().all(|w| vocabulary.contains(*w)), "{value}");
                }
            }
        }
    }

    #[test]
    fn row_counts_chunks_and_batches() {
        // Small chunks so that the table spans several chunks and batches.
        let table = Synthetic::new("synthetic4", 4, 250_000, 7, 100_000);
        assert_eq!(table.chunk_count(), 3);
        let per_chunk: Vec<usize> = (0..3)
            .map(|i| table.chunk(i).map(|b| b.num_rows()).sum())
            .collect();
        assert_eq!(per_chunk, vec![100_000, 100_000, 50_000]);
        assert!(table.chunk(0).all(|b| b.num_rows() <= BATCH_ROWS));
        assert_eq!(synthetic_table("s", 4, 0, 7).chunk_count(), 1);
        assert_eq!(synthetic_table("s", 4, 0, 7).chunk(0).count(), 0);
    }

    #[test]
    fn deterministic_and_chunk_order_independent() {
        let a = Synthetic::new("synthetic16", 16, 150_000, 42, 40_000);
        let b = Synthetic::new("synthetic16", 16, 150_000, 42, 40_000);
        assert_eq!(all_rows(&a, false), all_rows(&b, true));
        let other_seed = Synthetic::new("synthetic16", 16, 150_000, 43, 40_000);
        assert_ne!(all_rows(&a, false), all_rows(&other_seed, false));
    }

    #[test]
    fn values_are_uniform_over_the_range() {
        let table = synthetic_table("synthetic4", 4, 200_000, 3);
        let batches: Vec<RecordBatch> = table.chunk(0).collect();
        let rows = 200_000.0;
        for col in 0..4 {
            let values = || {
                batches
                    .iter()
                    .flat_map(move |b| column(b, col).values().iter().copied())
            };
            assert!(values().all(|v| (0..SYNTHETIC_VALUE_RANGE).contains(&v)));
            // Selectivity of `colK < c` for the paper's selectivities: within 5 standard errors.
            for fraction in [0.001, 0.01, 0.1, 0.5, 0.9] {
                let bound = (fraction * SYNTHETIC_VALUE_RANGE as f64) as i32;
                let hits = values().filter(|v| *v < bound).count() as f64;
                let sd = (rows * fraction * (1.0 - fraction)).sqrt();
                assert!(
                    (hits - rows * fraction).abs() < 5.0 * sd,
                    "col{} < {bound}: {hits} rows, expected {}",
                    col + 1,
                    rows * fraction
                );
            }
        }
        // Columns are independent of each other, not copies.
        assert_ne!(column(&batches[0], 0), column(&batches[0], 1));
    }
}
