//! The Star Schema Benchmark (SSB) data set.
//!
//! Follows *Star Schema Benchmark*, revision 3 (P. O'Neil, E. O'Neil, X. Chen, S. Revilak,
//! June 2009) and the value domains of its reference generator `ssb-dbgen`:
//!
//! | table       | rows                                      | key                         |
//! |-------------|-------------------------------------------|-----------------------------|
//! | `lineorder` | 1,500,000 × SF orders of 1–7 lines (≈ 6,000,000 × SF) | `lo_orderkey` (sparse, as dbgen) |
//! | `customer`  | 30,000 × SF                               | `c_custkey` 1..             |
//! | `supplier`  | 2,000 × SF                                | `s_suppkey` 1..             |
//! | `part`      | 200,000 × ⌊1 + log2 SF⌋ (200,000 below SF 2) | `p_partkey` 1..          |
//! | `date`      | every day of 1992-01-01 ..= 1998-12-31 (2,557) | `d_datekey` yyyymmdd   |
//!
//! Every choice is uniform, as in dbgen, so the 13 SSB queries keep their intended
//! selectivities: 25 nations in 5 regions, 10 cities per nation, 5 market segments, 5 order
//! priorities, 7 ship modes, 5 manufacturers × 5 categories × 40 brands, 92 colours, 150 types,
//! 40 containers, quantity 1–50, discount 0–10, tax 0–8. The word lists are TPC-H's (taken from
//! `tpchgen`'s copy of `dists.dss`, which SSB shares).
//!
//! Money is in integer cents, as dbgen prints it: a part's retail price is the TPC-H function of
//! its key ([`part_retail_price_cents`]), `lo_extendedprice = lo_quantity × price`,
//! `lo_revenue = lo_extendedprice × (100 − lo_discount) / 100`, `lo_supplycost = 6 × price / 10`
//! and `lo_ordtotalprice` is the order's sum of `revenue × (100 + tax) / 100` (integer division at
//! each step, as dbgen). Order dates are uniform over dbgen's range 1992-01-01 ..= 1998-08-02
//! (the TPC-H range, which leaves room for the 151 days of shipping TPC-H needs), and the commit
//! date is 30–90 days later, so both always exist in `date`.
//!
//! # Deviations from dbgen
//!
//! * Randomness comes from ChaCha8, one stream per chunk (see the crate docs), instead of
//!   dbgen's per-column Lehmer streams: the distributions are the same, the individual rows are
//!   not byte-identical to dbgen's.
//! * `date` has all 2,557 days of the seven years. The original dbgen stops at 1998-12-30
//!   (2,556 rows, an off-by-one later fixed in some forks); the spec asks for seven years.
//! * `d_dayofweek` is the true weekday (1992-01-01 is a Wednesday). dbgen's names are shifted by
//!   one day. `d_daynuminweek` counts from Sunday = 1 (dbgen's stated intent), so
//!   `d_lastdayinweekfl` marks Saturdays and `d_weekdayfl` Monday to Friday.
//! * The part count uses log2 as the spec says (dbgen uses the natural logarithm).
//! * `p_brand1` has a two-digit brand number (`MFGR#1101` .. `MFGR#5540`), the spec's fixed width
//!   of 9; dbgen writes `MFGR#111` for brand 1. The range predicates of Q2.2 select the same
//!   8 brands either way.
//! * Order customers are uniform over the keys that are not multiples of 3: dbgen's TPC-H rule
//!   that a third of the customers never order, without its slight bias towards the neighbours
//!   of the excluded keys.
//! * Flags (`d_*fl`) are `Int32` 0/1 rather than one-character strings; a fractional SF is
//!   accepted and every count is rounded (at least one row per table).

use std::fmt::Write as _;
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use chrono::{Datelike, Days, NaiveDate, Weekday};
use rand::RngCore;
use rand::distr::{Distribution, Uniform};
use rand_chacha::ChaCha8Rng;
use tpchgen::distribution::Distributions;

use crate::{BATCH_ROWS, CHUNK_ROWS_TARGET, TableGenerator, chunk_rng, chunks_for};

/// Orders per unit of scale factor (each order has 1–7 lineorder rows).
pub const ORDERS_PER_SF: f64 = 1_500_000.0;
/// Customers per unit of scale factor.
pub const CUSTOMERS_PER_SF: f64 = 30_000.0;
/// Suppliers per unit of scale factor.
pub const SUPPLIERS_PER_SF: f64 = 2_000.0;
/// Parts at scale factor 1; the count grows with ⌊1 + log2 SF⌋.
pub const PARTS_BASE: u64 = 200_000;
/// Rows of the `date` table: every day from 1992-01-01 to 1998-12-31.
pub const DATE_ROWS: usize = 2_557;
/// First day of the `date` table (and of the order dates).
pub const FIRST_DATE: NaiveDate = NaiveDate::from_ymd_opt(1992, 1, 1).unwrap();

/// Order dates are day offsets `0..=ORDER_DATE_MAX_OFFSET` from [`FIRST_DATE`]
/// (1992-01-01 ..= 1998-08-02): dbgen's range, total days minus TPC-H's 151 shipping days.
const ORDER_DATE_MAX_OFFSET: u32 = 2_405;
/// The commit date is this many days after the order date.
const COMMIT_DELAY_DAYS: (u32, u32) = (30, 90);
/// Lines per order, uniform.
const LINES_PER_ORDER: (u32, u32) = (1, 7);
/// Expected lines per order, used to size lineorder chunks.
const AVG_LINES_PER_ORDER: u64 = 4;
/// Length range of the random `c_address`/`s_address` strings (dbgen: 0.4 to 1.6 × 15).
const ADDRESS_LEN: (u32, u32) = (6, 24);
/// Characters of addresses: 64 of them, so one 64-bit draw yields ten.
const ADDRESS_CHARS: &[u8; 64] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,.";

/// Table identities mixed into the chunk seeds so tables never share random streams.
const LINEORDER_TAG: u64 = 0x55_5342_4c4f; // "SSBLO"
const CUSTOMER_TAG: u64 = 0x55_5342_4355; // "SSBCU"
const SUPPLIER_TAG: u64 = 0x55_5342_5355; // "SSBSU"
const PART_TAG: u64 = 0x55_5342_5041; // "SSBPA"

/// Row counts of an SSB data set at some scale factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsbScale {
    /// Orders in `lineorder` (its row count is about four times this).
    pub orders: u64,
    /// Rows of `customer`.
    pub customers: u64,
    /// Rows of `supplier`.
    pub suppliers: u64,
    /// Rows of `part`.
    pub parts: u64,
}

impl SsbScale {
    /// The counts at scale factor `sf`, rounded, at least one of each.
    ///
    /// # Panics
    /// If `sf` is not a positive finite number.
    pub fn new(sf: f64) -> Self {
        assert!(
            sf.is_finite() && sf > 0.0,
            "SSB scale factor must be positive, got {sf}"
        );
        let scaled = |per_sf: f64| ((per_sf * sf).round() as u64).max(1);
        // Parts grow logarithmically (spec: 200,000 × ⌊1 + log2 SF⌋); below SF 1 the log is
        // negative, and the spec's minimum of one multiple keeps every brand populated.
        let part_multiple = if sf >= 1.0 {
            (1.0 + sf.log2()).floor() as u64
        } else {
            1
        };
        Self {
            orders: scaled(ORDERS_PER_SF),
            customers: scaled(CUSTOMERS_PER_SF),
            suppliers: scaled(SUPPLIERS_PER_SF),
            parts: PARTS_BASE * part_multiple.max(1),
        }
    }
}

/// The five SSB tables at scale factor `sf`: `lineorder`, `customer`, `supplier`, `part`, `date`.
///
/// The data is a pure function of `(sf, seed)`.
///
/// # Panics
/// If `sf` is not a positive finite number.
pub fn ssb_tables(sf: f64, seed: u64) -> Vec<Box<dyn TableGenerator>> {
    ssb_tables_chunked(sf, seed, CHUNK_ROWS_TARGET)
}

/// [`ssb_tables`] with chunks of about `chunk_rows` rows (tests use small chunks to exercise
/// chunking on small data).
pub fn ssb_tables_chunked(
    sf: f64,
    seed: u64,
    chunk_rows: u64,
) -> Vec<Box<dyn TableGenerator>> {
    let scale = SsbScale::new(sf);
    let chunk_rows = chunk_rows.max(AVG_LINES_PER_ORDER);
    vec![
        Box::new(Lineorder {
            scale,
            seed,
            orders_per_chunk: chunk_rows / AVG_LINES_PER_ORDER,
        }),
        Box::new(Located::customer(scale.customers, seed, chunk_rows)),
        Box::new(Located::supplier(scale.suppliers, seed, chunk_rows)),
        Box::new(Part {
            rows: scale.parts,
            seed,
            chunk_rows,
        }),
        Box::new(DateTable),
    ]
}

/// A part's retail price in cents, a function of its key (TPC-H's formula, used by dbgen for
/// SSB, whose `part` table has no price column): 900.00 + (key/10 mod 20001)/100 +
/// (key mod 1000) dollars.
pub fn part_retail_price_cents(partkey: i64) -> i64 {
    90_000 + (partkey / 10) % 20_001 + (partkey % 1_000) * 100
}

/// dbgen's sparse order keys: of every 32 consecutive keys only the first 8 are used, so
/// `index` 1..=N maps to keys up to about 4N.
fn sparse_order_key(index: u64) -> i64 {
    (((index >> 3) << 5) | (index & 7)) as i64
}

/// The `yyyymmdd` key of each day of the `date` table, by offset from [`FIRST_DATE`].
static DATE_KEYS: LazyLock<Vec<i32>> =
    LazyLock::new(|| (0..DATE_ROWS).map(|offset| date_key(day(offset))).collect());

/// The day `offset` days after [`FIRST_DATE`].
fn day(offset: usize) -> NaiveDate {
    FIRST_DATE + Days::new(offset as u64)
}

fn date_key(date: NaiveDate) -> i32 {
    date.year() * 10_000 + date.month() as i32 * 100 + date.day() as i32
}

/// A nation with what the dimensions derive from it.
struct Nation {
    name: &'static str,
    region: &'static str,
    /// The ten city names `c_city`/`s_city` can take: the first 9 characters of the nation,
    /// space-padded, and a digit (`UNITED KI1`).
    cities: [String; 10],
}

/// The word lists SSB shares with TPC-H, read once from `tpchgen`'s `dists.dss`.
struct Words {
    nations: Vec<Nation>,
    segments: &'static [&'static str],
    priorities: &'static [&'static str],
    ship_modes: &'static [&'static str],
    colors: &'static [&'static str],
    types: &'static [&'static str],
    containers: &'static [&'static str],
}

static WORDS: LazyLock<Words> = LazyLock::new(|| {
    let dists = Distributions::static_default();
    let regions = dists.regions().get_values();
    let nations = dists.nations();
    let nations = (0..nations.size())
        .map(|i| {
            let name = nations.get_value(i);
            // In dists.dss a nation's cumulative weight is its region key.
            let region = regions[nations.get_weight(i) as usize];
            let prefix: String = format!("{:<9.9}", name);
            Nation {
                name,
                region,
                cities: std::array::from_fn(|d| format!("{prefix}{d}")),
            }
        })
        .collect();
    Words {
        nations,
        segments: dists.market_segments().get_values(),
        priorities: dists.order_priority().get_values(),
        ship_modes: dists.ship_modes().get_values(),
        colors: dists.part_colors().get_values(),
        types: dists.part_types().get_values(),
        containers: dists.part_containers().get_values(),
    }
});

/// Uniform over `lo..=hi`.
fn uniform(lo: u32, hi: u32) -> Uniform<u32> {
    Uniform::new_inclusive(lo, hi).expect("non-empty range")
}

/// Uniform over the indexes of a list.
fn index_of(len: usize) -> Uniform<u32> {
    uniform(0, len as u32 - 1)
}

/// Not-null field.
fn field(name: &str, data_type: DataType) -> Field {
    Field::new(name, data_type, false)
}

fn batch(schema: &SchemaRef, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(schema.clone(), columns).expect("columns match the table schema")
}

fn int32(values: Vec<i32>) -> ArrayRef {
    Arc::new(Int32Array::from(values))
}

fn int64(values: Vec<i64>) -> ArrayRef {
    Arc::new(Int64Array::from(values))
}

fn strings(mut builder: StringBuilder) -> ArrayRef {
    Arc::new(builder.finish())
}

/// Keys `first..=last` (1-based) of chunk `index` of a dimension of `rows` rows.
fn chunk_keys(rows: u64, chunk_rows: u64, index: usize) -> Range<u64> {
    let start = index as u64 * chunk_rows + 1;
    start.min(rows + 1)..(start + chunk_rows).min(rows + 1)
}

/// The batches of a dimension chunk: `build` makes the rows of a key range, at most
/// [`BATCH_ROWS`] at a time, all drawing from the chunk's random stream in key order.
fn keyed_batches<'a>(
    mut rng: ChaCha8Rng,
    keys: Range<u64>,
    mut build: impl FnMut(&mut ChaCha8Rng, Range<u64>) -> RecordBatch + Send + 'a,
) -> Box<dyn Iterator<Item = RecordBatch> + Send + 'a> {
    let mut next = keys.start;
    Box::new(std::iter::from_fn(move || {
        if next >= keys.end {
            return None;
        }
        let end = (next + BATCH_ROWS as u64).min(keys.end);
        let rows = build(&mut rng, next..end);
        next = end;
        Some(rows)
    }))
}

// ---------------------------------------------------------------------------------------------
// lineorder

static LINEORDER_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::{Int32, Int64, Utf8};
    Arc::new(Schema::new(vec![
        field("lo_orderkey", Int64),
        field("lo_linenumber", Int32),
        field("lo_custkey", Int32),
        field("lo_partkey", Int32),
        field("lo_suppkey", Int32),
        field("lo_orderdate", Int32),
        field("lo_orderpriority", Utf8),
        field("lo_shippriority", Utf8),
        field("lo_quantity", Int32),
        field("lo_extendedprice", Int64),
        field("lo_ordtotalprice", Int64),
        field("lo_discount", Int32),
        field("lo_revenue", Int64),
        field("lo_supplycost", Int64),
        field("lo_tax", Int32),
        field("lo_commitdate", Int32),
        field("lo_shipmode", Utf8),
    ]))
});

/// The fact table. A chunk is a run of consecutive orders (so a disjoint, increasing range of
/// order keys); each order's lines stay together in one batch because `lo_ordtotalprice` needs
/// all of them.
struct Lineorder {
    scale: SsbScale,
    seed: u64,
    orders_per_chunk: u64,
}

impl TableGenerator for Lineorder {
    fn name(&self) -> &str {
        "lineorder"
    }

    fn schema(&self) -> SchemaRef {
        LINEORDER_SCHEMA.clone()
    }

    /// The expected count (4 lines per order); the exact one is only known once generated.
    fn estimated_rows(&self) -> u64 {
        self.scale.orders * AVG_LINES_PER_ORDER
    }

    fn chunk_count(&self) -> usize {
        chunks_for(self.scale.orders, self.orders_per_chunk)
    }

    fn chunk(&self, index: usize) -> Box<dyn Iterator<Item = RecordBatch> + Send + '_> {
        let first = index as u64 * self.orders_per_chunk + 1;
        let end = (first + self.orders_per_chunk).min(self.scale.orders + 1);
        Box::new(LineorderChunk::new(
            self,
            chunk_rng(self.seed, LINEORDER_TAG, index),
            first,
            end,
        ))
    }

    fn bloom_filter_columns(&self) -> Vec<String> {
        vec![
            "lo_custkey".into(),
            "lo_partkey".into(),
            "lo_suppkey".into(),
        ]
    }

    fn sort_key(&self) -> Vec<String> {
        vec!["lo_orderkey".into()]
    }
}

/// Generates the orders `next..end` of one lineorder chunk, a batch at a time.
struct LineorderChunk {
    rng: ChaCha8Rng,
    next: u64,
    end: u64,
    /// Customer keys not divisible by 3 are numbered 0.. and drawn by that number.
    ordering_customer: Uniform<u32>,
    part: Uniform<u32>,
    supplier: Uniform<u32>,
    order_date: Uniform<u32>,
    priority: Uniform<u32>,
    lines: Uniform<u32>,
    quantity: Uniform<u32>,
    discount: Uniform<u32>,
    tax: Uniform<u32>,
    commit_delay: Uniform<u32>,
    ship_mode: Uniform<u32>,
}

impl LineorderChunk {
    fn new(table: &Lineorder, rng: ChaCha8Rng, first: u64, end: u64) -> Self {
        let scale = table.scale;
        let words = &*WORDS;
        let ordering_customers = scale.customers - scale.customers / 3;
        Self {
            rng,
            next: first,
            end,
            ordering_customer: uniform(0, ordering_customers as u32 - 1),
            part: uniform(1, scale.parts as u32),
            supplier: uniform(1, scale.suppliers as u32),
            order_date: uniform(0, ORDER_DATE_MAX_OFFSET),
            priority: index_of(words.priorities.len()),
            lines: uniform(LINES_PER_ORDER.0, LINES_PER_ORDER.1),
            quantity: uniform(1, 50),
            discount: uniform(0, 10),
            tax: uniform(0, 8),
            commit_delay: uniform(COMMIT_DELAY_DAYS.0, COMMIT_DELAY_DAYS.1),
            ship_mode: index_of(words.ship_modes.len()),
        }
    }
}

impl Iterator for LineorderChunk {
    type Item = RecordBatch;

    fn next(&mut self) -> Option<RecordBatch> {
        if self.next >= self.end {
            return None;
        }
        let words = &*WORDS;
        let date_keys = &*DATE_KEYS;
        let max_lines = LINES_PER_ORDER.1 as usize;
        let n = BATCH_ROWS;
        let mut orderkey = Vec::with_capacity(n);
        let mut linenumber = Vec::with_capacity(n);
        let mut custkey = Vec::with_capacity(n);
        let mut partkey = Vec::with_capacity(n);
        let mut suppkey = Vec::with_capacity(n);
        let mut orderdate = Vec::with_capacity(n);
        let mut quantity = Vec::with_capacity(n);
        let mut extendedprice = Vec::with_capacity(n);
        let mut ordtotalprice = Vec::with_capacity(n);
        let mut discount = Vec::with_capacity(n);
        let mut revenue = Vec::with_capacity(n);
        let mut supplycost = Vec::with_capacity(n);
        let mut tax = Vec::with_capacity(n);
        let mut commitdate = Vec::with_capacity(n);
        // Byte capacities from the longest values: "4-NOT SPECIFIED" (15), "REG AIR" (7).
        let mut orderpriority = StringBuilder::with_capacity(n, n * 15);
        let mut shippriority = StringBuilder::with_capacity(n, n);
        let mut shipmode = StringBuilder::with_capacity(n, n * 7);

        // Whole orders only: stop while one more order of up to 7 lines still fits.
        while self.next < self.end && orderkey.len() + max_lines <= n {
            let rng = &mut self.rng;
            let key = sparse_order_key(self.next);
            self.next += 1;
            // Map 0, 1, 2, 3, .. onto 1, 2, 4, 5, ..: the keys that are not multiples of 3.
            let ordinal = self.ordering_customer.sample(rng);
            let customer = (ordinal + ordinal / 2 + 1) as i32;
            let date = self.order_date.sample(rng) as usize;
            let priority = words.priorities[self.priority.sample(rng) as usize];
            let lines = self.lines.sample(rng);

            let mut total = 0i64;
            for line in 1..=lines {
                let part = self.part.sample(rng) as i32;
                let qty = self.quantity.sample(rng) as i64;
                let disc = self.discount.sample(rng) as i64;
                let line_tax = self.tax.sample(rng) as i64;
                let commit = date + self.commit_delay.sample(rng) as usize;

                let price = part_retail_price_cents(part as i64);
                let extended = price * qty;
                let line_revenue = extended * (100 - disc) / 100;
                total += line_revenue * (100 + line_tax) / 100;

                orderkey.push(key);
                linenumber.push(line as i32);
                custkey.push(customer);
                partkey.push(part);
                suppkey.push(self.supplier.sample(rng) as i32);
                orderdate.push(date_keys[date]);
                quantity.push(qty as i32);
                extendedprice.push(extended);
                discount.push(disc as i32);
                revenue.push(line_revenue);
                supplycost.push(6 * price / 10);
                tax.push(line_tax as i32);
                commitdate.push(date_keys[commit]);
                orderpriority.append_value(priority);
                shippriority.append_value("0");
                shipmode.append_value(words.ship_modes[self.ship_mode.sample(rng) as usize]);
            }
            // Every line of an order carries the order's total.
            ordtotalprice.extend(std::iter::repeat_n(total, lines as usize));
        }

        Some(batch(
            &LINEORDER_SCHEMA,
            vec![
                int64(orderkey),
                int32(linenumber),
                int32(custkey),
                int32(partkey),
                int32(suppkey),
                int32(orderdate),
                strings(orderpriority),
                strings(shippriority),
                int32(quantity),
                int64(extendedprice),
                int64(ordtotalprice),
                int32(discount),
                int64(revenue),
                int64(supplycost),
                int32(tax),
                int32(commitdate),
                strings(shipmode),
            ],
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// customer and supplier

/// `customer` or `supplier`: both are a key, a name, an address and a location
/// (city, nation, region, phone); customers also have a market segment.
struct Located {
    table: &'static str,
    /// Name prefix: `Customer#` or `Supplier#`, followed by the key in 9 digits.
    name_tag: &'static str,
    with_segment: bool,
    tag: u64,
    rows: u64,
    seed: u64,
    chunk_rows: u64,
    schema: SchemaRef,
}

impl Located {
    fn customer(rows: u64, seed: u64, chunk_rows: u64) -> Self {
        Self::new(
            "customer",
            "c",
            "Customer#",
            true,
            CUSTOMER_TAG,
            rows,
            seed,
            chunk_rows,
        )
    }

    fn supplier(rows: u64, seed: u64, chunk_rows: u64) -> Self {
        Self::new(
            "supplier",
            "s",
            "Supplier#",
            false,
            SUPPLIER_TAG,
            rows,
            seed,
            chunk_rows,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        table: &'static str,
        prefix: &'static str,
        name_tag: &'static str,
        with_segment: bool,
        tag: u64,
        rows: u64,
        seed: u64,
        chunk_rows: u64,
    ) -> Self {
        let key = if with_segment { "custkey" } else { "suppkey" };
        let mut fields = vec![field(&format!("{prefix}_{key}"), DataType::Int32)];
        for column in ["name", "address", "city", "nation", "region", "phone"] {
            fields.push(field(&format!("{prefix}_{column}"), DataType::Utf8));
        }
        if with_segment {
            fields.push(field(&format!("{prefix}_mktsegment"), DataType::Utf8));
        }
        Self {
            table,
            name_tag,
            with_segment,
            tag,
            rows,
            seed,
            chunk_rows,
            schema: Arc::new(Schema::new(fields)),
        }
    }

    fn key_column(&self) -> String {
        self.schema.field(0).name().clone()
    }

    fn build(&self, rng: &mut ChaCha8Rng, keys: Range<u64>) -> RecordBatch {
        let words = &*WORDS;
        let nation_of = index_of(words.nations.len());
        let city_digit = uniform(0, 9);
        let segment_of = index_of(words.segments.len());
        let address_len = uniform(ADDRESS_LEN.0, ADDRESS_LEN.1);
        let three_digits = uniform(100, 999);
        let four_digits = uniform(1_000, 9_999);

        let n = (keys.end - keys.start) as usize;
        let mut key = Vec::with_capacity(n);
        let mut name = StringBuilder::with_capacity(n, n * 18);
        let mut address = StringBuilder::with_capacity(n, n * ADDRESS_LEN.1 as usize);
        let mut city = StringBuilder::with_capacity(n, n * 10);
        let mut nation = StringBuilder::with_capacity(n, n * 14);
        let mut region = StringBuilder::with_capacity(n, n * 11);
        let mut phone = StringBuilder::with_capacity(n, n * 15);
        let mut segment = StringBuilder::with_capacity(n, n * 10);
        for k in keys {
            key.push(k as i32);
            // Writes into a StringBuilder extend its value in place; append_value("") ends it.
            write!(name, "{}{k:09}", self.name_tag).expect("write to memory");
            name.append_value("");
            push_address(rng, &address_len, &mut address);
            let n = nation_of.sample(rng) as usize;
            let home = &words.nations[n];
            city.append_value(&home.cities[city_digit.sample(rng) as usize]);
            nation.append_value(home.name);
            region.append_value(home.region);
            // dbgen's phone: country code 10 + nation, then random local digits.
            let (exchange, line, number) = (
                three_digits.sample(rng),
                three_digits.sample(rng),
                four_digits.sample(rng),
            );
            write!(phone, "{}-{exchange}-{line}-{number}", 10 + n).expect("write to memory");
            phone.append_value("");
            if self.with_segment {
                segment.append_value(words.segments[segment_of.sample(rng) as usize]);
            }
        }
        let mut columns = vec![
            int32(key),
            strings(name),
            strings(address),
            strings(city),
            strings(nation),
            strings(region),
            strings(phone),
        ];
        if self.with_segment {
            columns.push(strings(segment));
        }
        batch(&self.schema, columns)
    }
}

/// Appends a random address of `len` characters drawn from [`ADDRESS_CHARS`].
fn push_address(rng: &mut ChaCha8Rng, len: &Uniform<u32>, out: &mut StringBuilder) {
    let len = len.sample(rng) as usize;
    let mut text = [0u8; ADDRESS_LEN.1 as usize];
    for chunk in text[..len].chunks_mut(10) {
        // Ten 6-bit indexes per 64-bit draw.
        let mut bits = rng.next_u64();
        for byte in chunk {
            *byte = ADDRESS_CHARS[(bits & 63) as usize];
            bits >>= 6;
        }
    }
    out.append_value(std::str::from_utf8(&text[..len]).expect("ASCII"));
}

impl TableGenerator for Located {
    fn name(&self) -> &str {
        self.table
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
        let rng = chunk_rng(self.seed, self.tag, index);
        keyed_batches(
            rng,
            chunk_keys(self.rows, self.chunk_rows, index),
            |rng, keys| self.build(rng, keys),
        )
    }

    fn bloom_filter_columns(&self) -> Vec<String> {
        vec![self.key_column()]
    }

    fn sort_key(&self) -> Vec<String> {
        vec![self.key_column()]
    }
}

// ---------------------------------------------------------------------------------------------
// part

static PART_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::{Int32, Utf8};
    Arc::new(Schema::new(vec![
        field("p_partkey", Int32),
        field("p_name", Utf8),
        field("p_mfgr", Utf8),
        field("p_category", Utf8),
        field("p_brand1", Utf8),
        field("p_color", Utf8),
        field("p_type", Utf8),
        field("p_size", Int32),
        field("p_container", Utf8),
    ]))
});

/// The `part` dimension.
struct Part {
    rows: u64,
    seed: u64,
    chunk_rows: u64,
}

impl Part {
    fn build(rng: &mut ChaCha8Rng, keys: Range<u64>) -> RecordBatch {
        let words = &*WORDS;
        let color_of = index_of(words.colors.len());
        let one_to_five = uniform(1, 5);
        let brand_of = uniform(1, 40);
        let type_of = index_of(words.types.len());
        let size_of = uniform(1, 50);
        let container_of = index_of(words.containers.len());

        let n = (keys.end - keys.start) as usize;
        let mut key = Vec::with_capacity(n);
        let mut name = StringBuilder::with_capacity(n, n * 22);
        let mut mfgr = StringBuilder::with_capacity(n, n * 6);
        let mut category = StringBuilder::with_capacity(n, n * 7);
        let mut brand = StringBuilder::with_capacity(n, n * 9);
        let mut color = StringBuilder::with_capacity(n, n * 11);
        let mut kind = StringBuilder::with_capacity(n, n * 25);
        let mut size = Vec::with_capacity(n);
        let mut container = StringBuilder::with_capacity(n, n * 10);
        for k in keys {
            key.push(k as i32);
            // dbgen draws three distinct colours: the first is p_color, the other two p_name.
            let first = color_of.sample(rng);
            let second = loop {
                let c = color_of.sample(rng);
                if c != first {
                    break c;
                }
            };
            let third = loop {
                let c = color_of.sample(rng);
                if c != first && c != second {
                    break c;
                }
            };
            color.append_value(words.colors[first as usize]);
            write!(
                name,
                "{} {}",
                words.colors[second as usize], words.colors[third as usize]
            )
            .expect("write to memory");
            name.append_value("");
            // Manufacturer m, category mc, brand mcbb: each level uniform within its parent.
            let (m, c, b) = (
                one_to_five.sample(rng),
                one_to_five.sample(rng),
                brand_of.sample(rng),
            );
            write!(mfgr, "MFGR#{m}").expect("write to memory");
            mfgr.append_value("");
            write!(category, "MFGR#{m}{c}").expect("write to memory");
            category.append_value("");
            write!(brand, "MFGR#{m}{c}{b:02}").expect("write to memory");
            brand.append_value("");
            kind.append_value(words.types[type_of.sample(rng) as usize]);
            size.push(size_of.sample(rng) as i32);
            container.append_value(words.containers[container_of.sample(rng) as usize]);
        }
        batch(
            &PART_SCHEMA,
            vec![
                int32(key),
                strings(name),
                strings(mfgr),
                strings(category),
                strings(brand),
                strings(color),
                strings(kind),
                int32(size),
                strings(container),
            ],
        )
    }
}

impl TableGenerator for Part {
    fn name(&self) -> &str {
        "part"
    }

    fn schema(&self) -> SchemaRef {
        PART_SCHEMA.clone()
    }

    fn estimated_rows(&self) -> u64 {
        self.rows
    }

    fn chunk_count(&self) -> usize {
        chunks_for(self.rows, self.chunk_rows)
    }

    fn chunk(&self, index: usize) -> Box<dyn Iterator<Item = RecordBatch> + Send + '_> {
        let rng = chunk_rng(self.seed, PART_TAG, index);
        keyed_batches(
            rng,
            chunk_keys(self.rows, self.chunk_rows, index),
            Part::build,
        )
    }

    fn bloom_filter_columns(&self) -> Vec<String> {
        vec!["p_partkey".into()]
    }

    fn sort_key(&self) -> Vec<String> {
        vec!["p_partkey".into()]
    }
}

// ---------------------------------------------------------------------------------------------
// date

static DATE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use DataType::{Int32, Utf8};
    Arc::new(Schema::new(vec![
        field("d_datekey", Int32),
        field("d_date", Utf8),
        field("d_dayofweek", Utf8),
        field("d_month", Utf8),
        field("d_year", Int32),
        field("d_yearmonthnum", Int32),
        field("d_yearmonth", Utf8),
        field("d_daynuminweek", Int32),
        field("d_daynuminmonth", Int32),
        field("d_daynuminyear", Int32),
        field("d_monthnuminyear", Int32),
        field("d_weeknuminyear", Int32),
        field("d_sellingseason", Utf8),
        field("d_lastdayinweekfl", Int32),
        field("d_lastdayinmonthfl", Int32),
        field("d_holidayfl", Int32),
        field("d_weekdayfl", Int32),
    ]))
});

const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// dbgen's holidays, as (month, day).
const HOLIDAYS: [(u32, u32); 10] = [
    (12, 24),
    (1, 1),
    (2, 20),
    (4, 20),
    (5, 20),
    (7, 20),
    (8, 20),
    (9, 20),
    (10, 20),
    (11, 20),
];

/// dbgen's selling season of a month.
fn selling_season(month: u32) -> &'static str {
    match month {
        1..=3 => "Winter",
        4 => "Spring",
        5..=8 => "Summer",
        9 | 10 => "Fall",
        _ => "Christmas",
    }
}

fn weekday_name(day: Weekday) -> &'static str {
    match day {
        Weekday::Mon => "Monday",
        Weekday::Tue => "Tuesday",
        Weekday::Wed => "Wednesday",
        Weekday::Thu => "Thursday",
        Weekday::Fri => "Friday",
        Weekday::Sat => "Saturday",
        Weekday::Sun => "Sunday",
    }
}

/// The calendar dimension: one row per day, no randomness, one chunk.
struct DateTable;

impl DateTable {
    fn build() -> RecordBatch {
        let n = DATE_ROWS;
        let ints = || Vec::<i32>::with_capacity(n);
        let (mut key, mut year, mut yearmonthnum) = (ints(), ints(), ints());
        let (mut in_week, mut in_month, mut in_year, mut month_num, mut week) =
            (ints(), ints(), ints(), ints(), ints());
        let (mut last_in_week, mut last_in_month, mut holiday, mut weekday_fl) =
            (ints(), ints(), ints(), ints());
        let mut date_text = StringBuilder::with_capacity(n, n * 18);
        let mut day_of_week = StringBuilder::with_capacity(n, n * 9);
        let mut month_name = StringBuilder::with_capacity(n, n * 9);
        let mut year_month = StringBuilder::with_capacity(n, n * 7);
        let mut season = StringBuilder::with_capacity(n, n * 9);
        for offset in 0..n {
            let date = day(offset);
            let (y, month, dom) = (date.year(), date.month(), date.day());
            let month_text = MONTH_NAMES[date.month0() as usize];
            let weekday = date.weekday();

            key.push(date_key(date));
            write!(date_text, "{month_text} {dom}, {y}").expect("write to memory");
            date_text.append_value("");
            day_of_week.append_value(weekday_name(weekday));
            month_name.append_value(month_text);
            year.push(y);
            yearmonthnum.push(y * 100 + month as i32);
            write!(year_month, "{}{y}", &month_text[..3]).expect("write to memory");
            year_month.append_value("");
            in_week.push(weekday.number_from_sunday() as i32); // Sunday = 1 .. Saturday = 7
            in_month.push(dom as i32);
            in_year.push(date.ordinal() as i32);
            month_num.push(month as i32);
            // dbgen's week number: day-of-year / 7 + 1 (1..=53).
            week.push((date.ordinal() / 7 + 1) as i32);
            season.append_value(selling_season(month));
            last_in_week.push((weekday == Weekday::Sat) as i32);
            let month_ends = date.succ_opt().is_none_or(|next| next.month() != month);
            last_in_month.push(month_ends as i32);
            holiday.push(HOLIDAYS.contains(&(month, dom)) as i32);
            weekday_fl.push(!matches!(weekday, Weekday::Sat | Weekday::Sun) as i32);
        }
        batch(
            &DATE_SCHEMA,
            vec![
                int32(key),
                strings(date_text),
                strings(day_of_week),
                strings(month_name),
                int32(year),
                int32(yearmonthnum),
                strings(year_month),
                int32(in_week),
                int32(in_month),
                int32(in_year),
                int32(month_num),
                int32(week),
                strings(season),
                int32(last_in_week),
                int32(last_in_month),
                int32(holiday),
                int32(weekday_fl),
            ],
        )
    }
}

impl TableGenerator for DateTable {
    fn name(&self) -> &str {
        "date"
    }

    fn schema(&self) -> SchemaRef {
        DATE_SCHEMA.clone()
    }

    fn estimated_rows(&self) -> u64 {
        DATE_ROWS as u64
    }

    fn chunk_count(&self) -> usize {
        1
    }

    fn chunk(&self, index: usize) -> Box<dyn Iterator<Item = RecordBatch> + Send + '_> {
        assert_eq!(index, 0, "the date table has a single chunk");
        Box::new(std::iter::once(DateTable::build()))
    }

    fn bloom_filter_columns(&self) -> Vec<String> {
        vec!["d_datekey".into()]
    }

    fn sort_key(&self) -> Vec<String> {
        vec!["d_datekey".into()]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use arrow::array::{Array, AsArray};
    use arrow::compute::concat_batches;
    use arrow::datatypes::{Int32Type, Int64Type};

    use super::*;

    const SF: f64 = 0.01;

    fn table(tables: &[Box<dyn TableGenerator>], name: &str) -> usize {
        tables
            .iter()
            .position(|t| t.name() == name)
            .expect("table exists")
    }

    /// All chunks of a table as one batch (see `generate_all`), which must hold no NULLs.
    fn generate(table: &dyn TableGenerator, reverse: bool) -> RecordBatch {
        let batch = crate::test_util::generate_all(table, reverse);
        assert!(batch.columns().iter().all(|c| c.null_count() == 0));
        batch
    }

    fn i32s(batch: &RecordBatch, name: &str) -> Vec<i32> {
        crate::test_util::values::<Int32Type>(batch, name)
    }

    fn i64s(batch: &RecordBatch, name: &str) -> Vec<i64> {
        crate::test_util::values::<Int64Type>(batch, name)
    }

    fn strs(batch: &RecordBatch, name: &str) -> Vec<String> {
        let column = batch.column_by_name(name).unwrap().as_string::<i32>();
        column.iter().map(|v| v.unwrap().to_string()).collect()
    }

    #[test]
    fn scale_counts() {
        let one = SsbScale::new(1.0);
        assert_eq!(
            one,
            SsbScale {
                orders: 1_500_000,
                customers: 30_000,
                suppliers: 2_000,
                parts: 200_000
            }
        );
        assert_eq!(SsbScale::new(10.0).parts, 800_000); // ⌊1 + log2 10⌋ = 4
        assert_eq!(SsbScale::new(1.9).parts, 200_000);
        assert_eq!(SsbScale::new(2.0).parts, 400_000);
        let tiny = SsbScale::new(0.01);
        assert_eq!(
            (tiny.orders, tiny.customers, tiny.suppliers),
            (15_000, 300, 20)
        );
        assert_eq!(tiny.parts, 200_000);
        let smallest = SsbScale::new(1e-9);
        assert_eq!(
            (smallest.orders, smallest.customers, smallest.suppliers),
            (1, 1, 1)
        );
    }

    #[test]
    fn tables_names_schemas_and_row_counts() {
        let tables = ssb_tables(SF, 1);
        let names: Vec<&str> = tables.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["lineorder", "customer", "supplier", "part", "date"]);
        let scale = SsbScale::new(SF);
        let expected = [
            ("customer", scale.customers, 8),
            ("supplier", scale.suppliers, 7),
            ("part", scale.parts, 9),
            ("date", DATE_ROWS as u64, 17),
        ];
        for (name, rows, columns) in expected {
            let t = &tables[table(&tables, name)];
            assert_eq!(t.estimated_rows(), rows, "{name}");
            let data = generate(t.as_ref(), false);
            assert_eq!(data.num_rows() as u64, rows, "{name}");
            assert_eq!(data.num_columns(), columns, "{name}");
            assert_eq!(t.sort_key().len(), 1);
            assert_eq!(t.bloom_filter_columns(), t.sort_key(), "{name}: key column");
        }
        let lineorder = &tables[0];
        assert_eq!(lineorder.schema().fields().len(), 17);
        assert_eq!(
            lineorder.bloom_filter_columns(),
            ["lo_custkey", "lo_partkey", "lo_suppkey"]
        );
        assert_eq!(lineorder.sort_key(), ["lo_orderkey"]);
        let data = generate(lineorder.as_ref(), false);
        let lines_per_order = data.num_rows() as f64 / scale.orders as f64;
        assert!(
            (3.9..4.1).contains(&lines_per_order),
            "{lines_per_order} lines per order"
        );
        let orders: HashSet<i64> = i64s(&data, "lo_orderkey").into_iter().collect();
        assert_eq!(orders.len() as u64, scale.orders);
    }

    #[test]
    fn deterministic_and_chunk_order_independent() {
        // 1,000 orders per chunk: 15 lineorder chunks, 2 customer chunks of 200 rows.
        let a = ssb_tables_chunked(SF, 7, 4_000);
        let b = ssb_tables_chunked(SF, 7, 4_000);
        let c = ssb_tables_chunked(SF, 8, 4_000);
        assert_eq!(a[0].chunk_count(), 15);
        for i in 0..a.len() {
            let forward = generate(a[i].as_ref(), false);
            assert_eq!(forward, generate(b[i].as_ref(), true), "{}", a[i].name());
            if a[i].name() != "date" {
                assert_ne!(
                    forward,
                    generate(c[i].as_ref(), false),
                    "{}: seed",
                    a[i].name()
                );
            }
        }
        // Same chunk twice from one generator: identical.
        assert!(a[0].chunk(3).eq(a[0].chunk(3)));

        // Chunks hold disjoint, increasing order-key ranges and whole orders.
        let mut previous_max = 0;
        for i in 0..a[0].chunk_count() {
            let batches: Vec<RecordBatch> = a[0].chunk(i).collect();
            let chunk = concat_batches(&a[0].schema(), &batches).unwrap();
            let keys = i64s(&chunk, "lo_orderkey");
            assert!(
                keys.windows(2).all(|w| w[0] <= w[1]),
                "sorted within chunk {i}"
            );
            assert!(
                keys[0] > previous_max,
                "chunk {i} overlaps the previous chunk"
            );
            previous_max = *keys.last().unwrap();
            let lines = i32s(&chunk, "lo_linenumber");
            assert_eq!(lines[0], 1, "chunk {i} starts with a whole order");
        }
    }

    #[test]
    fn lineorder_keys_dates_and_prices() {
        let tables = ssb_tables_chunked(SF, 3, 20_000);
        let scale = SsbScale::new(SF);
        let lo = generate(tables[0].as_ref(), false);
        let date_keys: HashMap<i32, usize> = DATE_KEYS
            .iter()
            .enumerate()
            .map(|(offset, key)| (*key, offset))
            .collect();

        let orderkey = i64s(&lo, "lo_orderkey");
        let linenumber = i32s(&lo, "lo_linenumber");
        let custkey = i32s(&lo, "lo_custkey");
        let partkey = i32s(&lo, "lo_partkey");
        let suppkey = i32s(&lo, "lo_suppkey");
        let orderdate = i32s(&lo, "lo_orderdate");
        let commitdate = i32s(&lo, "lo_commitdate");
        let quantity = i32s(&lo, "lo_quantity");
        let discount = i32s(&lo, "lo_discount");
        let tax = i32s(&lo, "lo_tax");
        let extended = i64s(&lo, "lo_extendedprice");
        let revenue = i64s(&lo, "lo_revenue");
        let supplycost = i64s(&lo, "lo_supplycost");
        let total = i64s(&lo, "lo_ordtotalprice");
        let words = &*WORDS;

        let mut order_totals: HashMap<i64, (i64, i64)> = HashMap::new();
        for i in 0..lo.num_rows() {
            // Keys reference existing dimension rows; a third of the customers never order.
            assert!((1..=scale.customers as i32).contains(&custkey[i]));
            assert_ne!(custkey[i] % 3, 0);
            assert!((1..=scale.parts as i32).contains(&partkey[i]));
            assert!((1..=scale.suppliers as i32).contains(&suppkey[i]));
            // Sparse keys: only the first 8 of every 32.
            assert!(orderkey[i] % 32 < 8 && orderkey[i] > 0);
            assert!((1..=7).contains(&linenumber[i]));
            // Order dates within dbgen's range, commit dates 30..=90 days later, both in `date`.
            assert!((19920101..=19980802).contains(&orderdate[i]));
            let delay = date_keys[&commitdate[i]] - date_keys[&orderdate[i]];
            assert!((30..=90).contains(&delay));
            assert!((1..=50).contains(&quantity[i]));
            assert!((0..=10).contains(&discount[i]));
            assert!((0..=8).contains(&tax[i]));
            let price = part_retail_price_cents(partkey[i] as i64);
            assert_eq!(extended[i], price * quantity[i] as i64);
            assert_eq!(revenue[i], extended[i] * (100 - discount[i] as i64) / 100);
            assert_eq!(supplycost[i], 6 * price / 10);
            let entry = order_totals.entry(orderkey[i]).or_insert((0, total[i]));
            entry.0 += revenue[i] * (100 + tax[i] as i64) / 100;
            assert_eq!(entry.1, total[i], "every line carries the order total");
        }
        assert!(order_totals.values().all(|(sum, total)| sum == total));
        // Strings come from their domains.
        assert!(
            strs(&lo, "lo_orderpriority")
                .iter()
                .all(|p| words.priorities.contains(&p.as_str()))
        );
        assert!(
            strs(&lo, "lo_shipmode")
                .iter()
                .all(|m| words.ship_modes.contains(&m.as_str()))
        );
        assert!(strs(&lo, "lo_shippriority").iter().all(|p| p == "0"));
        assert_eq!(words.priorities.len(), 5);
        assert_eq!(words.ship_modes.len(), 7);
        // The price function of a few keys (dbgen's values, in cents).
        assert_eq!(part_retail_price_cents(1), 90_100);
        assert_eq!(part_retail_price_cents(155_190), 124_519);
    }

    #[test]
    fn query_selectivities() {
        // Q1.1's fact filters: year 1993, discount 1..=3, quantity < 25.
        let lo = generate(ssb_tables(0.05, 11)[0].as_ref(), false);
        let rows = lo.num_rows() as f64;
        let (date, discount, quantity) = (
            i32s(&lo, "lo_orderdate"),
            i32s(&lo, "lo_discount"),
            i32s(&lo, "lo_quantity"),
        );
        let hits = (0..lo.num_rows())
            .filter(|&i| {
                date[i] / 10_000 == 1993 && (1..=3).contains(&discount[i]) && quantity[i] < 25
            })
            .count() as f64;
        let expected = 365.0 / 2406.0 * 3.0 / 11.0 * 24.0 / 50.0;
        assert!(
            (hits / rows / expected - 1.0).abs() < 0.1,
            "Q1.1: {} vs {expected}",
            hits / rows
        );
        // Every year of the date table's queries has orders, including 1998.
        let years: HashSet<i32> = date.iter().map(|d| d / 10_000).collect();
        assert_eq!(years, (1992..=1998).collect());
    }

    #[test]
    fn customer_and_supplier_domains() {
        let tables = ssb_tables(0.1, 5);
        let words = &*WORDS;
        for (name, prefix, tag) in [
            ("customer", "c", "Customer#"),
            ("supplier", "s", "Supplier#"),
        ] {
            let data = generate(tables[table(&tables, name)].as_ref(), false);
            let col = |c: &str| strs(&data, &format!("{prefix}_{c}"));
            let keys = i32s(&data, data.schema().field(0).name());
            let (names, cities, nations) = (col("name"), col("city"), col("nation"));
            let (regions, phones, addresses) = (col("region"), col("phone"), col("address"));
            let mut seen_cities = HashSet::new();
            for i in 0..data.num_rows() {
                assert_eq!(keys[i] as usize, i + 1);
                assert_eq!(names[i], format!("{tag}{:09}", i + 1));
                let n = words
                    .nations
                    .iter()
                    .position(|n| n.name == nations[i])
                    .unwrap();
                assert_eq!(regions[i], words.nations[n].region);
                // City: nation's first 9 characters, space-padded, then a digit.
                assert_eq!(cities[i].len(), 10);
                assert_eq!(
                    cities[i][..9].trim_end(),
                    &nations[i][..nations[i].len().min(9)]
                );
                assert!(cities[i].as_bytes()[9].is_ascii_digit());
                seen_cities.insert(cities[i].clone());
                // Phone: country code 10 + nation index.
                assert_eq!(phones[i].len(), 15);
                assert_eq!(phones[i][..3], format!("{}-", 10 + n));
                assert!((6..=24).contains(&addresses[i].len()));
            }
            if name == "customer" {
                // 3,000 customers cover all 250 cities (Q3.3 needs 'UNITED KI1' and 'UNITED KI5').
                assert_eq!(seen_cities.len(), 250);
                assert!(seen_cities.contains("UNITED KI1") && seen_cities.contains("UNITED KI5"));
                let segments = col("mktsegment");
                assert!(
                    segments
                        .iter()
                        .all(|s| words.segments.contains(&s.as_str()))
                );
                assert_eq!(segments.iter().collect::<HashSet<_>>().len(), 5);
            }
        }
        // The fixed nation/region pairs of the spec.
        let region_of = |nation: &str| {
            words
                .nations
                .iter()
                .find(|n| n.name == nation)
                .unwrap()
                .region
        };
        assert_eq!(words.nations.len(), 25);
        assert_eq!(region_of("UNITED STATES"), "AMERICA");
        assert_eq!(region_of("UNITED KINGDOM"), "EUROPE");
        assert_eq!(region_of("CHINA"), "ASIA");
        assert_eq!(region_of("EGYPT"), "MIDDLE EAST");
        assert_eq!(region_of("ALGERIA"), "AFRICA");
        assert_eq!(words.nations[23].cities[1], "UNITED KI1");
        assert_eq!(words.nations[4].cities[0], "EGYPT    0");
    }

    #[test]
    fn part_domains() {
        let tables = ssb_tables(SF, 9);
        let part = generate(tables[table(&tables, "part")].as_ref(), false);
        let words = &*WORDS;
        let (mfgr, category, brand) = (
            strs(&part, "p_mfgr"),
            strs(&part, "p_category"),
            strs(&part, "p_brand1"),
        );
        let (color, name, sizes) = (
            strs(&part, "p_color"),
            strs(&part, "p_name"),
            i32s(&part, "p_size"),
        );
        let (types, containers) = (strs(&part, "p_type"), strs(&part, "p_container"));
        for i in 0..part.num_rows() {
            assert!(category[i].starts_with(&mfgr[i]) && category[i].len() == 7);
            assert!(brand[i].starts_with(&category[i]) && brand[i].len() == 9);
            let m: u32 = mfgr[i]["MFGR#".len()..].parse().unwrap();
            let b: u32 = brand[i][7..].parse().unwrap();
            assert!((1..=5).contains(&m) && (1..=40).contains(&b));
            assert!((1..=5).contains(&(category[i].as_bytes()[6] - b'0')));
            assert!((1..=50).contains(&sizes[i]));
            // p_name is two further colours, different from p_color and each other.
            let name_colors: Vec<&str> = name[i].split(' ').collect();
            assert_eq!(name_colors.len(), 2);
            assert!(
                name_colors
                    .iter()
                    .all(|c| words.colors.contains(c) && *c != color[i])
            );
            assert_ne!(name_colors[0], name_colors[1]);
            assert!(words.types.contains(&types[i].as_str()));
            assert!(words.containers.contains(&containers[i].as_str()));
        }
        // 200,000 parts populate all 5 manufacturers, 25 categories and 1,000 brands.
        let distinct = |v: &[String]| v.iter().collect::<HashSet<_>>().len();
        assert_eq!(
            (distinct(&mfgr), distinct(&category), distinct(&brand)),
            (5, 25, 1_000)
        );
        assert!(
            brand.contains(&"MFGR#1101".to_string()) && brand.contains(&"MFGR#5540".to_string())
        );
        // Q2.1's category is about 1/25 of the parts.
        let q21 =
            category.iter().filter(|c| *c == "MFGR#12").count() as f64 / part.num_rows() as f64;
        assert!((q21 * 25.0 - 1.0).abs() < 0.05, "MFGR#12 fraction {q21}");
        assert_eq!(
            (
                words.colors.len(),
                words.types.len(),
                words.containers.len()
            ),
            (92, 150, 40)
        );
    }

    #[test]
    fn date_table() {
        let tables = ssb_tables(SF, 1);
        let date = generate(tables[table(&tables, "date")].as_ref(), false);
        assert_eq!(date.num_rows(), 2_557);
        let keys = i32s(&date, "d_datekey");
        assert_eq!((keys[0], keys[2_556]), (19920101, 19981231));
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let row = |key: i32| {
            let i = keys.iter().position(|k| *k == key).unwrap();
            let text = [
                "d_date",
                "d_dayofweek",
                "d_month",
                "d_yearmonth",
                "d_sellingseason",
            ]
            .map(|c| strs(&date, c)[i].clone());
            let ints = [
                "d_year",
                "d_yearmonthnum",
                "d_daynuminweek",
                "d_daynuminmonth",
                "d_daynuminyear",
                "d_monthnuminyear",
                "d_weeknuminyear",
                "d_lastdayinweekfl",
                "d_lastdayinmonthfl",
                "d_holidayfl",
                "d_weekdayfl",
            ]
            .map(|c| i32s(&date, c)[i]);
            (text, ints)
        };
        assert_eq!(
            row(19920101),
            (
                [
                    "January 1, 1992",
                    "Wednesday",
                    "January",
                    "Jan1992",
                    "Winter"
                ]
                .map(String::from),
                [1992, 199201, 4, 1, 1, 1, 1, 0, 0, 1, 1]
            )
        );
        assert_eq!(
            row(19981231),
            (
                [
                    "December 31, 1998",
                    "Thursday",
                    "December",
                    "Dec1998",
                    "Christmas"
                ]
                .map(String::from),
                [1998, 199812, 5, 31, 365, 12, 53, 0, 1, 0, 1]
            )
        );
        // A leap day that ends its month, on a Saturday (last day of the week, no weekday).
        assert_eq!(
            row(19920229),
            (
                [
                    "February 29, 1992",
                    "Saturday",
                    "February",
                    "Feb1992",
                    "Winter"
                ]
                .map(String::from),
                [1992, 199202, 7, 29, 60, 2, 9, 1, 1, 0, 0]
            )
        );
        let years = i32s(&date, "d_year");
        assert_eq!(years.iter().filter(|y| **y == 1993).count(), 365);
        assert_eq!(years.iter().filter(|y| **y == 1996).count(), 366);
        assert_eq!(
            strs(&date, "d_yearmonth")
                .iter()
                .filter(|m| *m == "Dec1997")
                .count(),
            31
        );
        assert_eq!(i32s(&date, "d_holidayfl").iter().sum::<i32>(), 70);
    }
}
