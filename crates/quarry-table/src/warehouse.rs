//! The warehouse: a directory of tables, with atomic commits and crash recovery.
//!
//! Layout of one table:
//!
//! ```text
//! <warehouse>/<table>/CURRENT                  name of the committed manifest
//! <warehouse>/<table>/manifest-00000007.json   one file per retained version
//! <warehouse>/<table>/data/<segment>.parquet   segment files
//! <warehouse>/<table>/.lock                    writers hold an exclusive lock on it
//! ```
//!
//! Commit protocol: segments are written and fsync'd first; then the new manifest is written to a
//! temporary file, fsync'd and renamed into place; then `CURRENT` is replaced the same way (the
//! rename of `CURRENT` is the commit point) and the directory fsync'd. A crash at any moment leaves
//! either the old or the new version committed. A directory without `CURRENT` is an aborted first
//! load and is invisible. Files no retained manifest names are leftovers; whoever next takes the
//! table's lock removes them.
//!
//! Retention: the committed version and the one before it are kept (with their segments), so a
//! reader that planned against the previous version can finish while a writer commits.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::compute::{SortColumn, SortOptions, concat_batches, lexsort_to_indices, take_record_batch};
use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::checksum::BlockChecksums;
use crate::error::{Result, TableError};
use crate::manifest::{
    MANIFEST_FORMAT_VERSION, Manifest, SegmentMeta, SortedVersion, TableSchema, manifest_file_name, parse_manifest_file_name,
    storage_schema,
};
use crate::segment::{SegmentOptions, SegmentWriter, check_column_layouts};

const CURRENT_FILE: &str = "CURRENT";
const LOCK_FILE: &str = ".lock";
const DATA_DIR: &str = "data";
/// Longest accepted table name.
pub const TABLE_NAME_LEN_MAX: usize = 128;

/// A directory of tables.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: PathBuf,
}

/// A committed version of one table, as read at one moment.
#[derive(Debug, Clone)]
pub struct TableSnapshot {
    /// Directory of the table.
    pub dir: PathBuf,
    /// The committed manifest.
    pub manifest: Manifest,
    /// Path of the manifest file (for error messages).
    pub manifest_path: PathBuf,
    /// The table's Arrow schema (stored types).
    pub schema: SchemaRef,
}

impl TableSnapshot {
    /// Absolute path of a segment file of this table.
    pub fn segment_path(&self, segment: &SegmentMeta) -> PathBuf {
        self.dir.join(&segment.path)
    }
}

/// Whether a load replaces the table's contents or adds to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// The new segments become the whole table (created if absent).
    Replace,
    /// The new segments are added to the existing ones (the table is created if absent).
    Append,
}

/// An open write transaction on one table. Holds the table's lock until committed or dropped;
/// dropping it without committing removes its segment files and leaves the table as it was.
pub struct TableWriter {
    dir: PathBuf,
    table: String,
    _lock: File,
    base: Option<Manifest>,
    schema: SchemaRef,
    options: SegmentOptions,
    sort_key: Vec<String>,
    segment_seq: AtomicU64,
    id_prefix: String,
    committed: bool,
}

impl Warehouse {
    /// Opens (creating if needed) the warehouse at `root` and cleans up after aborted loads of
    /// any table no one is writing.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(TableError::io("creating warehouse directory", &root))?;
        // Absolute, so segment paths stay valid whatever the reader's working directory.
        let root = fs::canonicalize(&root).map_err(TableError::io("resolving", &root))?;
        let warehouse = Warehouse { root };
        for entry in fs::read_dir(&warehouse.root).map_err(TableError::io("listing", &warehouse.root))? {
            let entry = entry.map_err(TableError::io("listing", &warehouse.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir()
                && validate_table_name(&name).is_ok()
                && let Some(lock) = try_lock_table(&entry.path())?
            {
                recover_table(&entry.path())?;
                drop(lock);
            }
        }
        Ok(warehouse)
    }

    /// The warehouse directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Names of the committed tables, sorted.
    pub fn table_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(TableError::io("listing", &self.root))? {
            let entry = entry.map_err(TableError::io("listing", &self.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if validate_table_name(&name).is_ok() && entry.path().join(CURRENT_FILE).is_file() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Whether a committed table of this name exists.
    pub fn table_exists(&self, name: &str) -> bool {
        validate_table_name(name).is_ok() && self.root.join(name).join(CURRENT_FILE).is_file()
    }

    /// The committed version of a table.
    pub fn table(&self, name: &str) -> Result<TableSnapshot> {
        self.table_version(name, self.current_version(name)?)
    }

    /// The version of table `name` that is committed now (what [`Self::table`] reads).
    pub fn current_version(&self, name: &str) -> Result<u64> {
        validate_table_name(name)?;
        let dir = self.root.join(name);
        let current = dir.join(CURRENT_FILE);
        let manifest_name = match fs::read_to_string(&current) {
            Ok(text) => text.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TableError::TableNotFound(name.into())),
            Err(e) => return Err(TableError::io("reading", current)(e)),
        };
        parse_manifest_file_name(&manifest_name).ok_or_else(|| TableError::CorruptManifest {
            path: current.clone(),
            reason: format!("'{manifest_name}' is not a manifest file name"),
        })
    }

    /// A specific retained version of a table (for scans planned against that version).
    pub fn table_version(&self, name: &str, version: u64) -> Result<TableSnapshot> {
        validate_table_name(name)?;
        let dir = self.root.join(name);
        let manifest_path = dir.join(manifest_file_name(version));
        let text = match fs::read_to_string(&manifest_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TableError::CorruptManifest {
                    path: manifest_path,
                    reason: format!("version {version} of table '{name}' is missing (it may have been replaced twice since the query was planned)"),
                });
            }
            Err(e) => return Err(TableError::io("reading", manifest_path)(e)),
        };
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| TableError::CorruptManifest {
            path: manifest_path.clone(),
            reason: e.to_string(),
        })?;
        manifest.validate(&manifest_path)?;
        if manifest.table != name || manifest.version != version {
            return Err(TableError::CorruptManifest {
                path: manifest_path,
                reason: format!("it describes table '{}' version {}", manifest.table, manifest.version),
            });
        }
        let schema = manifest.arrow_schema(&manifest_path)?;
        Ok(TableSnapshot { dir, manifest, manifest_path, schema })
    }

    /// Starts a write transaction. `schema` is the schema of the data to write; with
    /// [`WriteMode::Append`] on an existing table it must equal the table's schema.
    pub fn begin_write(
        &self,
        name: &str,
        schema: &SchemaRef,
        mode: WriteMode,
        options: SegmentOptions,
        sort_key: Vec<String>,
    ) -> Result<TableWriter> {
        validate_table_name(name)?;
        let dir = self.root.join(name);
        fs::create_dir_all(dir.join(DATA_DIR)).map_err(TableError::io("creating", dir.join(DATA_DIR)))?;
        let lock = try_lock_table(&dir)?.ok_or_else(|| TableError::Locked(name.into()))?;
        recover_table(&dir)?;
        // Recovery may have removed an aborted table's directory: make it again.
        fs::create_dir_all(dir.join(DATA_DIR)).map_err(TableError::io("creating", dir.join(DATA_DIR)))?;
        let base = if self.table_exists(name) { Some(self.table(name)?.manifest) } else { None };
        let schema = storage_schema(schema);
        for column in options.bloom_filter_columns.iter().chain(&sort_key) {
            if schema.field_with_name(column).is_err() {
                return Err(TableError::SchemaMismatch {
                    table: name.into(),
                    reason: format!("Bloom filter or sort key column '{column}' is not in the data"),
                });
            }
        }
        if let (WriteMode::Append, Some(base)) = (mode, &base) {
            let existing = TableSchema::from_arrow(&schema);
            if existing != base.schema {
                return Err(TableError::SchemaMismatch {
                    table: name.into(),
                    reason: format!(
                        "appending columns ({}) to a table with columns ({})",
                        describe(&existing),
                        describe(&base.schema)
                    ),
                });
            }
        }
        let base = if mode == WriteMode::Append { base } else { base.map(|m| Manifest { segments: vec![], versions: vec![], ..m }) };
        let mut options = options;
        if let (WriteMode::Append, Some(base)) = (mode, &base) {
            // A table's pages keep one encoding, so its scans cost the same in every segment.
            options.page_encoding = base.page_encoding;
            options.column_layouts = base.column_layouts.clone();
        }
        check_column_layouts(&schema, &options.column_layouts).map_err(|reason| TableError::SchemaMismatch { table: name.into(), reason })?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let id_prefix = format!("{:x}{:08x}-{}", now.as_secs(), now.subsec_nanos(), std::process::id());
        Ok(TableWriter {
            dir,
            table: name.into(),
            _lock: lock,
            base,
            schema,
            options,
            sort_key,
            segment_seq: AtomicU64::new(0),
            id_prefix,
            committed: false,
        })
    }
}

impl TableWriter {
    /// The schema segments are written with.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Opens a new segment file. Safe to call from several threads; each writer is independent.
    pub fn new_segment(&self) -> Result<SegmentWriter> {
        let seq = self.segment_seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{seq:06}", self.id_prefix);
        SegmentWriter::create(&self.dir, id, self.schema.clone(), &self.options)
    }

    /// Opens a new segment file of a copy sorted by `key`: small row groups, their bounds in
    /// `key` recorded as zones (see [`SegmentOptions::zone_column`]).
    pub fn new_sorted_segment(&self, key: &str) -> Result<SegmentWriter> {
        let seq = self.segment_seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{seq:06}", self.id_prefix);
        let options = SegmentOptions { zone_column: Some(key.to_string()), ..self.options.clone() };
        SegmentWriter::create(&self.dir, id, self.schema.clone(), &options)
    }

    /// The rows of `segments` (this write's) again, once for each of `orders` (a key, and
    /// whether to write the segments of a sorted copy: [`Self::new_sorted_segment`], zones in
    /// the key's first column), sorted by that key: per order, the new segments. Each segment
    /// is read once and its rows are in memory alone (a load writes at most
    /// [`crate::segment::ROW_GROUP_ROWS`]); its rows are sorted among themselves, not with
    /// other segments'.
    fn sorted_segments(&self, segments: &[SegmentMeta], orders: &[(&[String], bool)]) -> Result<Vec<Vec<SegmentMeta>>> {
        let mut sorted: Vec<Vec<SegmentMeta>> = orders.iter().map(|_| Vec::with_capacity(segments.len())).collect();
        for segment in segments {
            let path = self.dir.join(&segment.path);
            let failed = |reason: String| TableError::WriteSegment { path: path.clone(), reason };
            let file = File::open(&path).map_err(TableError::io("opening", &path))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).and_then(|b| b.with_batch_size(64 * 1024).build()).map_err(|e| failed(e.to_string()))?;
            let schema = arrow::array::RecordBatchReader::schema(&reader);
            let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| failed(e.to_string()))?;
            let rows = concat_batches(&schema, &batches).map_err(|e| failed(e.to_string()))?;
            drop(batches);
            for (&(key, zones), out) in orders.iter().zip(&mut sorted) {
                let Some(zone_column) = key.first() else {
                    return Err(TableError::SchemaMismatch { table: self.table.clone(), reason: "a sorted version without a sort key".into() });
                };
                let columns = key
                    .iter()
                    .map(|k| {
                        let values = rows.column_by_name(k).ok_or_else(|| failed(format!("sort key '{k}' is not a column")))?;
                        Ok(SortColumn { values: Arc::clone(values), options: Some(SortOptions { descending: false, nulls_first: false }) })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let order = lexsort_to_indices(&columns, None).map_err(|e| failed(e.to_string()))?;
                let in_order = take_record_batch(&rows, &order).map_err(|e| failed(e.to_string()))?;
                let mut writer = if zones { self.new_sorted_segment(zone_column)? } else { self.new_segment()? };
                writer.write(&in_order)?;
                out.push(writer.finish()?);
            }
        }
        Ok(sorted)
    }

    /// Records block checksums for the existing segments that have none (written before
    /// checksums existed), from their bytes as they are now; they are part of the next commit.
    /// Returns how many segments gained checksums.
    pub fn record_missing_checksums(&mut self) -> Result<usize> {
        let Some(base) = &mut self.base else { return Ok(0) };
        let mut recorded = 0;
        for segment in base.segments.iter_mut().filter(|s| s.checksums.is_none()) {
            let path = self.dir.join(&segment.path);
            let checksums = BlockChecksums::of_file(&path).map_err(TableError::io("reading", &path))?;
            if !checksums.covers(segment.bytes) {
                return Err(TableError::CorruptSegment { path, reason: format!("its size differs from the {} bytes the manifest says", segment.bytes) });
            }
            segment.checksums = Some(checksums);
            recorded += 1;
        }
        // A segment the sorted versions share is the same file: it gains the same checksums.
        let recorded_now: std::collections::HashMap<String, BlockChecksums> = base.segments.iter().filter_map(|s| Some((s.id.clone(), s.checksums.clone()?))).collect();
        for segment in base.versions.iter_mut().flat_map(|v| v.segments.iter_mut()).filter(|s| s.checksums.is_none()) {
            segment.checksums = recorded_now.get(&segment.id).cloned();
        }
        Ok(recorded)
    }

    /// Commits `segments` (in table order) as the table's next version. An append adds their
    /// rows to every sorted version too, in that version's order.
    pub fn commit(self, segments: Vec<SegmentMeta>, properties: Vec<(String, String)>) -> Result<Manifest> {
        self.commit_with_versions(segments, Vec::new(), properties)
    }

    /// Commits `segments` and further sorted copies of the same rows (`quarry layout apply`);
    /// after an append, `versions` must be empty: each of the table's versions gains the rows of
    /// `segments` sorted by its key ([`Self::sorted_segments`], each segment read once), and so do the table's own
    /// segments, by the table's key, if it has versions. The rows committed are one segment
    /// range, numbered by the new version ([`SegmentMeta::range`]).
    pub fn commit_with_versions(mut self, segments: Vec<SegmentMeta>, versions: Vec<SortedVersion>, properties: Vec<(String, String)>) -> Result<Manifest> {
        let (version, mut all_segments, mut all_versions, mut props) = match &self.base {
            Some(base) => (base.version + 1, base.segments.clone(), base.versions.clone(), base.properties.clone()),
            None => (1 + latest_version_on_disk(&self.dir)?, Vec::new(), Vec::new(), Default::default()),
        };
        if !all_versions.is_empty() && !versions.is_empty() {
            return Err(TableError::SchemaMismatch { table: self.table.clone(), reason: "sorted versions replace a table's rows; they cannot be appended".into() });
        }
        // The rows a commit adds are a segment range of their own, numbered by its version.
        let numbered = |segments: Vec<SegmentMeta>| -> Vec<SegmentMeta> { segments.into_iter().map(|s| SegmentMeta { range: version, ..s }).collect() };
        // An append to a table with sorted copies keeps each copy in its order, the table's own
        // segments (sorted by the table's key) too.
        let own_key = self.base.as_ref().map(|b| b.sort_key.clone()).filter(|key| !key.is_empty() && !all_versions.is_empty());
        let orders: Vec<(&[String], bool)> = own_key.iter().map(|key| (key.as_slice(), false)).chain(all_versions.iter().map(|v| (v.sort_key.as_slice(), true))).collect();
        let mut sorted = if orders.is_empty() { Vec::new() } else { self.sorted_segments(&segments, &orders)? }.into_iter();
        let (segments, sort_key) = match own_key {
            Some(key) => (sorted.next().expect("the table's own order"), key),
            None => (segments, self.sort_key.clone()),
        };
        let segments = numbered(segments);
        for (copy, segments) in all_versions.iter_mut().zip(sorted) {
            copy.segments.extend(numbered(segments));
        }
        all_versions.extend(versions.into_iter().map(|v| SortedVersion { segments: numbered(v.segments), ..v }));
        all_segments.extend(segments);
        props.extend(properties);
        let manifest = Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            table: self.table.clone(),
            version,
            committed_at_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64,
            schema: TableSchema::from_arrow(&self.schema),
            sort_key,
            bloom_filter_columns: self.options.bloom_filter_columns.clone(),
            page_encoding: self.options.page_encoding,
            column_layouts: self.options.column_layouts.clone(),
            properties: props,
            segments: all_segments,
            versions: all_versions,
        };
        let manifest_path = self.dir.join(manifest_file_name(version));
        manifest.validate(&manifest_path)?;
        for segment in manifest.all_segments() {
            let path = self.dir.join(&segment.path);
            if !path.is_file() {
                return Err(TableError::CorruptSegment { path, reason: "segment file missing at commit".into() });
            }
        }
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serializes");
        write_atomically(&self.dir, &manifest_file_name(version), text.as_bytes())?;
        fail_point("after-manifest");
        write_atomically(&self.dir, CURRENT_FILE, format!("{}\n", manifest_file_name(version)).as_bytes())?;
        self.committed = true;
        fail_point("after-commit");
        recover_table(&self.dir)?;
        Ok(manifest)
    }
}

impl Drop for TableWriter {
    fn drop(&mut self) {
        if !self.committed {
            // Abort: remove whatever this transaction wrote. The lock is still held here.
            let _ = recover_table(&self.dir);
        }
    }
}

/// Checks a table name: an identifier SQL can use unquoted.
pub fn validate_table_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid_start = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let valid_rest = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid_start && valid_rest && name.len() <= TABLE_NAME_LEN_MAX {
        Ok(())
    } else {
        Err(TableError::InvalidTableName(name.into()))
    }
}

fn describe(schema: &TableSchema) -> String {
    schema.fields.iter().map(|c| format!("{} {}", c.name, c.data_type)).collect::<Vec<_>>().join(", ")
}

/// Takes the table's writer lock if free. `None` when another process or transaction holds it.
fn try_lock_table(dir: &Path) -> Result<Option<File>> {
    let path = dir.join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(TableError::io("opening lock file", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => Err(TableError::io("locking table", path)(e)),
    }
}

/// Writes `name` in `dir` so that readers see either the old or the new content, durably.
fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let target = dir.join(name);
    let mut file = File::create(&tmp).map_err(TableError::io("creating", &tmp))?;
    file.write_all(contents).map_err(TableError::io("writing", &tmp))?;
    file.sync_all().map_err(TableError::io("syncing", &tmp))?;
    drop(file);
    fs::rename(&tmp, &target).map_err(TableError::io("renaming into place", &target))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(TableError::io("syncing directory", dir))
}

/// Highest manifest version present in `dir` (0 if none), so a recreated table never reuses a
/// version number a reader might still hold.
fn latest_version_on_disk(dir: &Path) -> Result<u64> {
    let mut latest = 0;
    for entry in fs::read_dir(dir).map_err(TableError::io("listing", dir))? {
        let entry = entry.map_err(TableError::io("listing", dir))?;
        if let Some(v) = parse_manifest_file_name(&entry.file_name().to_string_lossy()) {
            latest = latest.max(v);
        }
    }
    Ok(latest)
}

/// Removes what no retained version needs: temporary files, manifests other than the committed
/// one and its predecessor, and segment files neither names. A directory with no committed
/// version at all (an aborted first load) is removed whole. The caller holds the table's lock.
fn recover_table(dir: &Path) -> Result<()> {
    let current_path = dir.join(CURRENT_FILE);
    let committed = match fs::read_to_string(&current_path) {
        Ok(text) => Some(parse_manifest_file_name(text.trim()).ok_or_else(|| TableError::CorruptManifest {
            path: current_path.clone(),
            reason: format!("'{}' is not a manifest file name", text.trim()),
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(TableError::io("reading", current_path)(e)),
    };
    let Some(committed) = committed else {
        // Never committed: nothing here is visible, remove it all but the lock file we hold.
        remove_all_except_lock(dir)?;
        return Ok(());
    };
    let mut keep_segments = std::collections::HashSet::new();
    let mut keep_manifests = vec![committed];
    for version in [committed, committed.saturating_sub(1)] {
        let path = dir.join(manifest_file_name(version));
        let Ok(text) = fs::read_to_string(&path) else { continue };
        match serde_json::from_str::<Manifest>(&text) {
            Ok(manifest) => {
                keep_manifests.push(version);
                keep_segments.extend(manifest.all_segments().map(|s| format!("{}.parquet", s.id)));
            }
            Err(e) if version == committed => {
                return Err(TableError::CorruptManifest { path, reason: e.to_string() });
            }
            Err(_) => {}
        }
    }
    for entry in fs::read_dir(dir).map_err(TableError::io("listing", dir))? {
        let entry = entry.map_err(TableError::io("listing", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale_manifest = parse_manifest_file_name(&name).is_some_and(|v| !keep_manifests.contains(&v));
        if name.ends_with(".tmp") || stale_manifest {
            fs::remove_file(entry.path()).map_err(TableError::io("removing", entry.path()))?;
        }
    }
    let data = dir.join(DATA_DIR);
    if let Ok(entries) = fs::read_dir(&data) {
        for entry in entries {
            let entry = entry.map_err(TableError::io("listing", &data))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep_segments.contains(&name) {
                fs::remove_file(entry.path()).map_err(TableError::io("removing", entry.path()))?;
            }
        }
    }
    Ok(())
}

fn remove_all_except_lock(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(TableError::io("listing", dir))? {
        let entry = entry.map_err(TableError::io("listing", dir))?;
        if entry.file_name() == LOCK_FILE {
            continue;
        }
        let path = entry.path();
        let result = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        result.map_err(TableError::io("removing", &path))?;
    }
    Ok(())
}

/// Crash-test hook: with `QUARRY_FAIL_POINT=<name>` set, the process aborts at that point, like a
/// `kill -9` there. Lets tests crash a commit between its steps deterministically.
fn fail_point(name: &str) {
    if std::env::var("QUARRY_FAIL_POINT").is_ok_and(|v| v == name) {
        std::process::abort();
    }
}
