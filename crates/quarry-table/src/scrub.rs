//! Scrub: read every segment file of every retained version of the tables and check it against
//! the block checksums recorded when it was written, reporting what is damaged (Ceph's deep
//! scrub). Reads go block by block through a caller's pacing hook, so a storage node can scrub
//! in the background at a bounded rate.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::BufReader;
use std::ops::Range;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::checksum::CHECKSUM_BLOCK_BYTES;
use crate::error::{Result, TableError};
use crate::manifest::parse_manifest_file_name;
use crate::segment::SegmentOptions;
use crate::warehouse::{Warehouse, WriteMode};

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    /// Tables scrubbed.
    pub tables: Vec<String>,
    /// Graphs scrubbed.
    #[serde(default)]
    pub graphs: Vec<String>,
    /// Files (segments and graph files) read and verified.
    pub files_verified: u64,
    /// Bytes of them.
    pub bytes_verified: u64,
    /// Segment files with no recorded checksums (written before checksums existed): their size
    /// was checked, their contents could not be. Paths relative to the warehouse.
    pub unverifiable: Vec<PathBuf>,
    /// Everything found damaged.
    pub damage: Vec<Damage>,
}

/// One damaged file, or one damaged byte range of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Damage {
    /// The table or graph the file belongs to.
    pub name: String,
    /// The file, relative to the warehouse.
    pub file: PathBuf,
    /// The damaged bytes, when the damage is within the file.
    pub bytes: Option<Range<u64>>,
    /// What is wrong.
    pub reason: String,
}

impl Damage {
    /// The file and, for damage within it, the byte range: `lineitem/data/x.parquet bytes 0..65536`.
    pub fn location(&self) -> String {
        match &self.bytes {
            Some(b) => format!("{} bytes {}..{}", self.file.display(), b.start, b.end),
            None => self.file.display().to_string(),
        }
    }
}

impl ScrubReport {
    /// Adds another node's (or table's) findings.
    pub fn merge(&mut self, other: ScrubReport) {
        self.tables.extend(other.tables);
        self.graphs.extend(other.graphs);
        self.files_verified += other.files_verified;
        self.bytes_verified += other.bytes_verified;
        self.unverifiable.extend(other.unverifiable);
        self.damage.extend(other.damage);
    }
}

impl Warehouse {
    /// Scrubs `tables` (every committed table if empty; a name that is not one is an error).
    /// `pace(bytes)` is called after each block read, before the next.
    pub fn scrub(&self, tables: &[String], pace: &mut dyn FnMut(u64)) -> Result<ScrubReport> {
        let names = if tables.is_empty() { self.table_names()? } else { tables.to_vec() };
        let mut report = ScrubReport::default();
        for name in &names {
            if !self.table_exists(name) {
                return Err(TableError::TableNotFound(name.clone()));
            }
            self.scrub_table(name, pace, &mut report)?;
            report.tables.push(name.clone());
        }
        Ok(report)
    }

    /// Gives the segments of `table` that have no checksums (written before checksums
    /// existed) checksums of their current bytes, committed as a new version; how many.
    pub fn record_missing_checksums(&self, table: &str) -> Result<usize> {
        let current = self.table(table)?;
        let manifest = &current.manifest;
        let options = SegmentOptions {
            bloom_filter_columns: manifest.bloom_filter_columns.clone(),
            page_encoding: manifest.page_encoding,
            column_layouts: manifest.column_layouts.clone(),
            zone_column: None,
        };
        let mut writer = self.begin_write(table, &current.schema, WriteMode::Append, options, manifest.sort_key.clone())?;
        let recorded = writer.record_missing_checksums()?;
        if recorded > 0 {
            writer.commit(Vec::new(), Vec::new())?;
        }
        Ok(recorded)
    }

    fn scrub_table(&self, name: &str, pace: &mut dyn FnMut(u64), report: &mut ScrubReport) -> Result<()> {
        let dir = self.root().join(name);
        let mut versions: Vec<u64> = fs::read_dir(&dir)
            .map_err(TableError::io("listing", &dir))?
            .filter_map(|entry| parse_manifest_file_name(&entry.ok()?.file_name().to_string_lossy()))
            .collect();
        versions.sort_unstable_by(|a, b| b.cmp(a));
        let relative = |path: &std::path::Path| path.strip_prefix(self.root()).unwrap_or(path).to_path_buf();
        let mut seen = HashSet::new();
        for version in versions {
            let snapshot = match self.table_version(name, version) {
                Ok(snapshot) => snapshot,
                Err(TableError::CorruptManifest { path, reason }) => {
                    report.damage.push(Damage { name: name.into(), file: relative(&path), bytes: None, reason });
                    continue;
                }
                Err(e) => return Err(e),
            };
            for segment in snapshot.manifest.all_segments() {
                if !seen.insert(segment.id.clone()) {
                    continue;
                }
                let path = snapshot.segment_path(segment);
                let damage = |bytes, reason| Damage { name: name.into(), file: relative(&path), bytes, reason };
                let file = match File::open(&path) {
                    Ok(file) => file,
                    Err(e) => {
                        report.damage.push(damage(None, format!("cannot be opened: {e}")));
                        continue;
                    }
                };
                let size = file.metadata().map_err(TableError::io("reading metadata of", &path))?.len();
                if size != segment.bytes {
                    report.damage.push(damage(None, format!("{size} bytes on disk, the manifest says {}", segment.bytes)));
                    continue;
                }
                let Some(checksums) = &segment.checksums else {
                    report.unverifiable.push(relative(&path));
                    continue;
                };
                let paced = PacedReader { inner: file, pace: &mut *pace };
                let found = checksums
                    .verify_reader(BufReader::with_capacity(CHECKSUM_BLOCK_BYTES as usize, paced), segment.bytes)
                    .map_err(TableError::io("reading", &path))?;
                report.damage.extend(found.into_iter().map(|bad| damage(Some(bad.bytes), "do not match the checksum written with them".into())));
                report.files_verified += 1;
                report.bytes_verified += size;
            }
        }
        Ok(())
    }
}

/// A reader that reports each read's size to a pacing hook.
struct PacedReader<'a, R> {
    inner: R,
    pace: &'a mut dyn FnMut(u64),
}

impl<R: std::io::Read> std::io::Read for PacedReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.pace)(n as u64);
        Ok(n)
    }
}
