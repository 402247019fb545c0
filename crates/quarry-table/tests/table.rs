//! Warehouse behaviour through the public API: commits, statistics, aborts and crash recovery.

use std::sync::Arc;

use arrow::array::{Date32Array, Decimal128Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use quarry_table::ingest::{write_batches, write_segments_of};
use quarry_table::segment::ZONE_ROWS;
use quarry_table::{PageEncoding, SegmentOptions, SortedVersion, TableError, Warehouse, WriteMode};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("day", DataType::Date32, true),
        Field::new("price", DataType::Decimal128(10, 2), true),
    ]))
}

fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    let n = ids.end - ids.start;
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter(ids.clone().map(|i| (i % 3 != 0).then(|| format!("name{i:04}"))))),
            Arc::new(Date32Array::from_iter_values(ids.clone().map(|i| 8000 + i as i32))),
            Arc::new(Decimal128Array::from_iter_values(ids.map(|i| i as i128 * 125)).with_precision_and_scale(10, 2).unwrap()),
        ],
    )
    .unwrap_or_else(|e| panic!("batch of {n}: {e}"))
}

fn load(warehouse: &Warehouse, table: &str, mode: WriteMode, ids: std::ops::Range<i64>) -> quarry_table::Manifest {
    let writer = warehouse.begin_write(table, &schema(), mode, SegmentOptions::default(), vec!["id".into()]).unwrap();
    let segments = write_batches(&writer, std::iter::once(Ok(batch(ids))), &|_| {}).unwrap();
    writer.commit(segments, vec![]).unwrap()
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn commit_records_rows_and_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let manifest = load(&warehouse, "t", WriteMode::Replace, 1..1001);
    assert_eq!(manifest.version, 1);
    assert_eq!(manifest.total_rows(), 1000);
    let snapshot = warehouse.table("t").unwrap();
    assert_eq!(snapshot.manifest, manifest);
    let stats = &manifest.segments[0].columns;
    assert_eq!((stats[0].min.as_deref(), stats[0].max.as_deref()), (Some("1"), Some("1000")));
    assert_eq!(stats[1].null_count, Some(333));
    assert_eq!((stats[1].min.as_deref(), stats[1].max.as_deref()), (Some("name0001"), Some("name1000")));
    assert_eq!(stats[2].min.as_deref(), Some("1991-11-28"));
    assert_eq!(stats[3].max.as_deref(), Some("1250.00"));
    // Compact pages: text compressed, numbers and dates not.
    assert!(!stats[0].encodings.is_empty() && stats[1].compression.contains("SNAPPY"));
    assert!([0, 2, 3].iter().all(|&c| stats[c].compression == "UNCOMPRESSED"), "{stats:?}");
    assert_eq!(warehouse.table_names().unwrap(), ["t"]);
}

/// A column is recorded ascending only if every row, across the batches of a segment, is no
/// smaller than the one before and none is NULL; strings are not checked.
#[test]
fn segments_record_which_columns_ascend() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let ascending = |batches: Vec<RecordBatch>| -> Vec<bool> {
        let writer = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions::default(), vec![]).unwrap();
        let segments = write_batches(&writer, batches.into_iter().map(Ok), &|_| {}).unwrap();
        let manifest = writer.commit(segments, vec![]).unwrap();
        manifest.segments[0].columns.iter().map(|c| c.ascending).collect()
    };
    // In order across two batches (id, day and price ascend; name has NULLs and is a string).
    assert_eq!(ascending(vec![batch(1..500), batch(500..1001)]), [true, false, true, true]);
    // Each batch in order, the second starting below the first's end.
    assert_eq!(ascending(vec![batch(1..500), batch(498..1001)]), [false, false, false, false]);
    // Equal neighbours are in order.
    assert_eq!(ascending(vec![batch(1..500), batch(499..500), batch(499..600)]), [true, false, true, true]);
    // Out of order inside one batch.
    let reversed = arrow::compute::take_record_batch(&batch(1..101), &arrow::array::UInt32Array::from_iter_values((0..100).rev())).unwrap();
    assert_eq!(ascending(vec![reversed]), [false, false, false, false]);
}

#[test]
fn sorted_copies_commit_with_zones_gain_appends_and_keep_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let rows = 2 * ZONE_ROWS as i64 + 100;
    let writer = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions::default(), vec!["id".into()]).unwrap();
    let own = write_batches(&writer, std::iter::once(Ok(batch(0..rows))), &|_| {}).unwrap();
    // The copy holds the same rows, sorted by `day` (which ascends with `id` here).
    let copy = write_segments_of(&writer, std::iter::once(Ok(batch(0..rows))), rows as usize, Some("day"), &|_| {}).unwrap();
    let manifest = writer.commit_with_versions(own, vec![SortedVersion { sort_key: vec!["day".into()], segments: copy }], vec![]).unwrap();
    let [version] = manifest.versions.as_slice() else { panic!("one sorted copy: {:?}", manifest.versions) };
    let [segment] = version.segments.as_slice() else { panic!("one segment") };
    let zones = segment.zones.as_ref().expect("a sorted copy's segment has zones");
    assert_eq!((zones.column.as_str(), zones.rows.len(), segment.row_groups), ("day", 3, 3));
    assert_eq!(zones.rows, [ZONE_ROWS as u64, ZONE_ROWS as u64, 100]);
    assert_eq!((zones.min[0].as_deref(), zones.max[2].as_deref()), (Some("1991-11-27"), Some("2081-11-21")));
    assert!(manifest.segments[0].zones.is_none());
    let data = dir.path().join("t").join("data");
    assert_eq!(files_in(&data).len(), 2);

    // An append is a segment range of its own: the table's segments gain its rows sorted by
    // the table's key, every copy gains them sorted by its own (the rows given in descending
    // order).
    assert!(manifest.segments.iter().chain(&version.segments).all(|s| s.range == manifest.version));
    let descending: Vec<u32> = (0..10).rev().collect();
    let reversed = arrow::compute::take_record_batch(&batch(rows..rows + 10), &arrow::array::UInt32Array::from(descending)).unwrap();
    let writer = warehouse.begin_write("t", &schema(), WriteMode::Append, SegmentOptions::default(), vec![]).unwrap();
    let segments = write_batches(&writer, std::iter::once(Ok(reversed)), &|_| {}).unwrap();
    let appended = writer.commit(segments, vec![]).unwrap();
    let (own, copied) = (appended.segments.last().unwrap(), appended.versions[0].segments.last().unwrap());
    assert_ne!(own.id, copied.id, "the copy's rows of the append are a segment of its own");
    assert_eq!((own.range, copied.range, own.rows, copied.rows), (appended.version, appended.version, 10, 10));
    // The table's own appended rows ascend in its key, `id`, the copy's in `day`; only the
    // copy's segment has zone maps.
    assert_eq!(appended.sort_key, ["id"], "an append keeps the table's key");
    assert!(own.columns[0].ascending && own.zones.is_none(), "{own:?}");
    assert!(copied.columns[2].ascending, "{copied:?}");
    assert_eq!((&own.columns[2].min, &own.columns[2].max), (&copied.columns[2].min, &copied.columns[2].max));
    let zones = copied.zones.as_ref().expect("the copy's appended segment has zones");
    assert_eq!((zones.column.as_str(), zones.rows.as_slice()), ("day", &[10u64][..]));
    assert_eq!(appended.versions[0].segments.iter().map(|s| s.rows).sum::<u64>(), appended.total_rows());
    // Their files survive the commits after it.
    load(&warehouse, "t", WriteMode::Append, rows + 10..rows + 20);
    assert_eq!(files_in(&data).len(), 6, "both copies' files and each copy's of the two appends");
    // Sorted copies cannot be appended as such, and a replace drops them.
    let writer = warehouse.begin_write("t", &schema(), WriteMode::Append, SegmentOptions::default(), vec![]).unwrap();
    let more = write_segments_of(&writer, std::iter::once(Ok(batch(0..5))), 5, Some("day"), &|_| {}).unwrap();
    assert!(writer.commit_with_versions(vec![], vec![SortedVersion { sort_key: vec!["day".into()], segments: more }], vec![]).is_err());
    let replaced = load(&warehouse, "t", WriteMode::Replace, 0..10);
    assert!(replaced.versions.is_empty());

    // A copy of other rows is a corrupt manifest, and so is one whose rows are of other ranges.
    let mut bad = appended.clone();
    bad.versions[0].segments.pop();
    assert!(matches!(bad.validate(std::path::Path::new("m.json")), Err(TableError::CorruptManifest { .. })));
    let mut bad = appended.clone();
    bad.versions[0].segments.last_mut().unwrap().range = manifest.version;
    assert!(matches!(bad.validate(std::path::Path::new("m.json")), Err(TableError::CorruptManifest { .. })));
    appended.validate(std::path::Path::new("m.json")).unwrap();
}

#[test]
fn append_adds_segments_and_replace_swaps_them() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    load(&warehouse, "t", WriteMode::Replace, 0..10);
    let appended = load(&warehouse, "t", WriteMode::Append, 10..30);
    assert_eq!((appended.version, appended.segments.len(), appended.total_rows()), (2, 2, 30));
    let replaced = load(&warehouse, "t", WriteMode::Replace, 0..5);
    assert_eq!((replaced.version, replaced.total_rows()), (3, 5));
    // Versions 3 and 2 are retained (2 for readers still planning against it); 1 is gone.
    assert!(warehouse.table_version("t", 2).is_ok());
    assert!(warehouse.table_version("t", 1).is_err());
    assert_eq!(files_in(&dir.path().join("t/data")).len(), 3);
}

#[test]
fn append_with_other_columns_is_rejected_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let before = load(&warehouse, "t", WriteMode::Replace, 0..10);
    let other: SchemaRef = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
    let err = warehouse.begin_write("t", &other, WriteMode::Append, SegmentOptions::default(), vec![]).err().unwrap();
    assert!(matches!(err, TableError::SchemaMismatch { .. }), "{err}");
    assert_eq!(warehouse.table("t").unwrap().manifest, before);
}

#[test]
fn dropped_writer_leaves_table_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let before = load(&warehouse, "t", WriteMode::Replace, 0..10);
    {
        let writer = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions::default(), vec![]).unwrap();
        let failing = vec![Ok(batch(0..100)), Err(TableError::InvalidInput { file: "x.csv".into(), reason: "bad".into() })];
        assert!(write_batches(&writer, failing.into_iter(), &|_| {}).is_err());
    }
    assert_eq!(warehouse.table("t").unwrap().manifest, before);
    assert_eq!(files_in(&dir.path().join("t/data")).len(), 1);
    // A failed first load of a new table leaves no table behind.
    {
        let writer = warehouse.begin_write("fresh", &schema(), WriteMode::Replace, SegmentOptions::default(), vec![]).unwrap();
        write_batches(&writer, std::iter::once(Ok(batch(0..10))), &|_| {}).unwrap();
    }
    assert_eq!(warehouse.table_names().unwrap(), ["t"]);
    assert!(matches!(warehouse.table("fresh"), Err(TableError::TableNotFound(_))));
}

#[test]
fn second_writer_is_refused_while_the_first_holds_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let _first = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions::default(), vec![]).unwrap();
    let err = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions::default(), vec![]).err().unwrap();
    assert!(matches!(err, TableError::Locked(_)), "{err}");
}

#[test]
fn leftovers_of_a_crashed_load_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let warehouse = Warehouse::open(dir.path()).unwrap();
        load(&warehouse, "t", WriteMode::Replace, 0..10)
    };
    // What a process killed between its steps leaves: an unreferenced segment, a half-written
    // manifest and a manifest written but never made current.
    let table = dir.path().join("t");
    std::fs::write(table.join("data/orphan.parquet"), b"partial").unwrap();
    std::fs::write(table.join("manifest-00000002.json.tmp"), b"{").unwrap();
    std::fs::copy(table.join("manifest-00000001.json"), table.join("manifest-00000002.json")).unwrap();
    std::fs::create_dir_all(dir.path().join("aborted/data")).unwrap();
    std::fs::write(dir.path().join("aborted/data/x.parquet"), b"partial").unwrap();

    let warehouse = Warehouse::open(dir.path()).unwrap();
    assert_eq!(warehouse.table("t").unwrap().manifest, before);
    assert_eq!(files_in(&table.join("data")).len(), 1);
    assert_eq!(files_in(&table), [".lock", "CURRENT", "data", "manifest-00000001.json"]);
    assert_eq!(warehouse.table_names().unwrap(), ["t"]);
    assert!(!dir.path().join("aborted/data").exists());
}

#[test]
fn corrupt_manifest_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    load(&warehouse, "t", WriteMode::Replace, 0..10);
    std::fs::write(dir.path().join("t/manifest-00000001.json"), b"{not json").unwrap();
    let err = warehouse.table("t").unwrap_err().to_string();
    assert!(err.contains("corrupt manifest") && err.contains("manifest-00000001.json"), "{err}");
}

#[test]
fn invalid_table_names_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    for name in ["", "../x", "a/b", "1abc", "Upper", "a.b"] {
        assert!(matches!(warehouse.table(name), Err(TableError::InvalidTableName(_))), "{name}");
    }
}

#[test]
fn parallel_chunks_commit_in_chunk_order() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let writer = warehouse.begin_write("t", &schema(), WriteMode::Replace, SegmentOptions { bloom_filter_columns: vec!["id".into()], ..Default::default() }, vec![]).unwrap();
    let segments = quarry_table::ingest::write_chunks_parallel(
        &writer,
        8,
        3,
        |i| std::iter::once(batch(i as i64 * 100..i as i64 * 100 + 100)),
        &|_| {},
    )
    .unwrap();
    let manifest = writer.commit(segments, vec![("generator".into(), "test".into())]).unwrap();
    let mins: Vec<&str> = manifest.segments.iter().map(|s| s.columns[0].min.as_deref().unwrap()).collect();
    assert_eq!(mins, ["0", "100", "200", "300", "400", "500", "600", "700"]);
    assert_eq!(manifest.properties["generator"], "test");
}

#[test]
fn plain_pages_are_uncompressed_and_appends_keep_them() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let write = |mode, encoding, ids: std::ops::Range<i64>| {
        let options = SegmentOptions { page_encoding: encoding, ..Default::default() };
        let writer = warehouse.begin_write("t", &schema(), mode, options, vec![]).unwrap();
        let segments = write_batches(&writer, std::iter::once(Ok(batch(ids))), &|_| {}).unwrap();
        writer.commit(segments, vec![]).unwrap()
    };
    write(WriteMode::Replace, PageEncoding::Plain, 0..100);
    // An append asking for compact pages still writes the table's plain ones.
    let manifest = write(WriteMode::Append, PageEncoding::Compact, 100..200);
    assert_eq!(manifest.page_encoding, PageEncoding::Plain);
    for segment in &manifest.segments {
        for column in &segment.columns {
            assert_eq!(column.compression, "UNCOMPRESSED", "{}", column.name);
            assert!(!column.encodings.iter().any(|e| e.contains("DICTIONARY")), "{}: {:?}", column.name, column.encodings);
        }
    }
    let replaced = write(WriteMode::Replace, PageEncoding::Compact, 0..100);
    assert_eq!(replaced.page_encoding, PageEncoding::Compact);
    assert_eq!(replaced.segments[0].columns[1].compression, "SNAPPY");
}

#[test]
fn dictionary_pages_are_dictionary_encoded_and_uncompressed() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    let options = SegmentOptions { page_encoding: "dictionary".parse().unwrap(), ..Default::default() };
    let writer = warehouse.begin_write("t", &schema(), WriteMode::Replace, options, vec![]).unwrap();
    let segments = write_batches(&writer, std::iter::once(Ok(batch(0..100))), &|_| {}).unwrap();
    let manifest = writer.commit(segments, vec![]).unwrap();
    assert_eq!(manifest.page_encoding, PageEncoding::Dictionary);
    for column in &manifest.segments[0].columns {
        assert_eq!(column.compression, "UNCOMPRESSED", "{}", column.name);
        assert!(column.encodings.iter().any(|e| e.contains("DICTIONARY")), "{}: {:?}", column.name, column.encodings);
    }
    assert!("zstd".parse::<PageEncoding>().unwrap_err().contains("compact, dictionary or plain"));
}

#[test]
fn scrub_finds_exactly_the_damaged_block() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = Warehouse::open(dir.path()).unwrap();
    load(&warehouse, "t", WriteMode::Replace, 0..200_000);
    load(&warehouse, "t", WriteMode::Append, 200_000..300_000);
    load(&warehouse, "u", WriteMode::Replace, 0..1000);
    let clean = warehouse.scrub(&[], &mut |_| {}).unwrap();
    assert_eq!((clean.tables.len(), clean.files_verified, clean.damage.len()), (2, 3, 0), "{clean:?}");
    assert!(clean.unverifiable.is_empty());
    // Flip one bit in the middle of t's first segment.
    let snapshot = warehouse.table("t").unwrap();
    let segment = &snapshot.manifest.segments[0];
    assert!(segment.bytes > 200_000, "the segment spans several checksum blocks");
    let path = snapshot.segment_path(segment);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = segment.bytes as usize / 2;
    bytes[at] ^= 0x04;
    std::fs::write(&path, &bytes).unwrap();
    let mut paced = 0u64;
    let report = warehouse.scrub(&[], &mut |n| paced += n).unwrap();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    let damage = &report.damage[0];
    let block = quarry_table::checksum::CHECKSUM_BLOCK_BYTES;
    let start = at as u64 / block * block;
    assert_eq!((damage.name.as_str(), damage.bytes.clone()), ("t", Some(start..start + block)));
    assert_eq!(damage.file, std::path::Path::new("t").join(&segment.path));
    assert_eq!(paced, clean.bytes_verified, "every byte read passes the pacing hook");
    // Only the named table is read when one is named; an unknown name is an error.
    assert!(warehouse.scrub(&["u".into()], &mut |_| {}).unwrap().damage.is_empty());
    assert!(matches!(warehouse.scrub(&["nope".into()], &mut |_| {}), Err(TableError::TableNotFound(_))));
    // A truncated file is reported by its size.
    std::fs::write(&path, &bytes[..at]).unwrap();
    let report = warehouse.scrub(&["t".into()], &mut |_| {}).unwrap();
    assert!(report.damage[0].reason.contains("bytes on disk"), "{report:?}");
}
