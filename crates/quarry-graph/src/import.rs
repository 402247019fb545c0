//! Bounded-memory import: an edge stream in any order becomes a CSR graph.
//!
//! # How
//!
//! [`GraphBuilder::add_edge`] pushes each edge into a [`SortReducer`](quarry_sortreduce::SortReducer)
//! keyed `src << 32 | dst` with the weight (or `()`) as the value, so the sort-reducer's output
//! is the edge list in CSR order, and its reduce step (keep the smaller weight) removes duplicate
//! edges at every sorting level instead of at the end. Self-loops are dropped before the sort
//! unless [`ImportOptions::keep_self_loops`] is set. [`GraphBuilder::finish`] streams the sorted
//! result straight into the `out.*` files, optionally builds the reverse graph the same way
//! (keyed `dst << 32 | src`), writes the header and publishes the directory atomically (see
//! [`csr`](crate::csr)).
//!
//! Memory: [`ImportOptions::memory_bytes`] is split into six file buffers of `memory / 32`
//! (4 KiB to 1 MiB each) and the sort-reducer's budget; nothing else grows with the input.
//!
//! Vertex ids must be below 2^32: the sort key packs two ids into the sort-reducer's u64 key
//! (it has no pair key). Larger ids are refused with an error naming the edge; `V` itself may
//! exceed 2^32 via [`ImportOptions::vertices`] (the graph then gets 8-byte ids).
//!
//! # Input files
//!
//! - **Text** ([`EdgeFormat::Text`]): one edge per line, `src dst [weight]`, separated by spaces
//!   or tabs; everything after `#` or `%` is a comment (SNAP and KONECT files work as they are);
//!   blank lines are skipped.
//! - **CSV** ([`EdgeFormat::Csv`]): a header `src,dst` or `src,dst,weight`, then one edge per
//!   row; fields may be quoted.
//!
//! Errors name the file and the 1-based line. Parquet and other inputs feed
//! [`GraphBuilder::add_edge`] directly.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use quarry_sortreduce::{SortReduceConfig, SortReduceStats};

use crate::csr::{
    BUILD_BUFFERS, CsrFileWriter, Direction, EdgeSorter, Graph, GraphMeta, IdWidth, Staging,
    write_meta, write_reverse,
};
use crate::error::{Error, Result};
use crate::io::{MemoryPlan, plan_memory};

/// Default memory budget of an import: 256 MiB.
pub const DEFAULT_IMPORT_MEMORY_BYTES: usize = 256 << 20;

/// How to build a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportOptions {
    /// Total memory for the sort-reducer and the file buffers.
    pub memory_bytes: usize,
    /// Threads the sort-reducer sorts with (and the Kronecker generator generates with).
    pub threads: usize,
    /// Parent of the sort-reducer's spill directory; `None` puts spills inside the staging
    /// directory, on the same file system as the graph.
    pub temp_dir: Option<PathBuf>,
    /// The vertex count; `None` means the largest id seen plus one. Ids must be below it.
    pub vertices: Option<u64>,
    /// Whether edges carry weights. `None`: files decide (a CSV `weight` column, or a third
    /// field on a text file's first edge), the builder assumes unweighted. `Some(true)` requires
    /// a weight on every edge; `Some(false)` ignores weights.
    pub weighted: Option<bool>,
    /// Keep edges `v -> v` (dropped by default).
    pub keep_self_loops: bool,
    /// Add `dst -> src` for every edge (an undirected graph stored as a symmetric directed one).
    pub symmetrize: bool,
    /// Also build the reverse graph (in-edges), needed by connected components and betweenness.
    pub build_reverse: bool,
    /// Replace an existing graph at the destination (otherwise that is an error).
    pub overwrite: bool,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            memory_bytes: DEFAULT_IMPORT_MEMORY_BYTES,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            temp_dir: None,
            vertices: None,
            weighted: None,
            keep_self_loops: false,
            symmetrize: false,
            build_reverse: false,
            overwrite: false,
        }
    }
}

impl ImportOptions {
    /// Sets [`Self::memory_bytes`].
    pub fn with_memory_bytes(mut self, bytes: usize) -> Self {
        self.memory_bytes = bytes;
        self
    }
    /// Sets [`Self::threads`].
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }
    /// Sets [`Self::temp_dir`].
    pub fn with_temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = Some(dir.into());
        self
    }
    /// Sets [`Self::vertices`].
    pub fn with_vertices(mut self, vertices: u64) -> Self {
        self.vertices = Some(vertices);
        self
    }
    /// Sets [`Self::weighted`].
    pub fn with_weighted(mut self, weighted: bool) -> Self {
        self.weighted = Some(weighted);
        self
    }
    /// Sets [`Self::keep_self_loops`].
    pub fn with_self_loops(mut self, keep: bool) -> Self {
        self.keep_self_loops = keep;
        self
    }
    /// Sets [`Self::symmetrize`].
    pub fn with_symmetrize(mut self, symmetrize: bool) -> Self {
        self.symmetrize = symmetrize;
        self
    }
    /// Sets [`Self::build_reverse`].
    pub fn with_reverse(mut self, build: bool) -> Self {
        self.build_reverse = build;
        self
    }
    /// Sets [`Self::overwrite`].
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }
}

/// What an import did.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportStats {
    /// Edges given to [`GraphBuilder::add_edge`].
    pub edges_read: u64,
    /// Self-loops dropped.
    pub self_loops_dropped: u64,
    /// Edges pushed into the sort-reducer (after dropping self-loops, after symmetrizing).
    pub edges_sorted: u64,
    /// Duplicates removed by the reduce step: `edges_sorted - edges_kept`.
    pub duplicates_removed: u64,
    /// Edges in the graph.
    pub edges_kept: u64,
    /// Vertices in the graph.
    pub vertices: u64,
    /// Id width chosen for the edge files.
    pub id_width: IdWidth,
    /// The edge sort-reduce.
    pub sort_reduce: SortReduceStats,
    /// The reverse-graph sort-reduce, when one was built.
    pub reverse_sort_reduce: Option<SortReduceStats>,
    /// Bytes of file buffers (the rest of the budget went to the sort-reducer).
    pub buffer_bytes: usize,
    /// Wall time from the builder's creation to the published graph.
    pub elapsed: Duration,
}

/// Builds a graph from edges in any order with bounded memory; see the [module docs](self).
pub struct GraphBuilder {
    staging: Staging,
    options: ImportOptions,
    weighted: bool,
    plan: MemoryPlan,
    sorter: EdgeSorter,
    edges_read: u64,
    self_loops: u64,
    edges_sorted: u64,
    max_id: Option<u64>,
    started: Instant,
}

impl GraphBuilder {
    /// Starts a graph at `dest` (which must not exist unless `options.overwrite`).
    pub fn new(dest: impl AsRef<Path>, options: ImportOptions) -> Result<GraphBuilder> {
        Self::with_reserved(dest.as_ref(), options, 0)
    }

    /// Like [`Self::new`], leaving `reserved` bytes of the budget to the caller.
    pub(crate) fn with_reserved(
        dest: &Path,
        options: ImportOptions,
        reserved: usize,
    ) -> Result<GraphBuilder> {
        let started = Instant::now();
        let plan = plan_memory(options.memory_bytes, BUILD_BUFFERS, reserved)?;
        let staging = Staging::create(dest, options.overwrite)?;
        let spill = options
            .temp_dir
            .clone()
            .unwrap_or_else(|| staging.path().to_path_buf());
        let config = SortReduceConfig::new(plan.sort_reduce_bytes)
            .with_threads(options.threads.max(1))
            .with_temp_dir(spill);
        let weighted = options.weighted.unwrap_or(false);
        Ok(GraphBuilder {
            sorter: EdgeSorter::new(weighted, config)?,
            staging,
            options,
            weighted,
            plan,
            edges_read: 0,
            self_loops: 0,
            edges_sorted: 0,
            max_id: None,
            started,
        })
    }

    /// Whether the graph being built is weighted.
    pub fn is_weighted(&self) -> bool {
        self.weighted
    }

    /// Adds the edge `src -> dst`. A weighted builder needs `weight` (not NaN); an unweighted
    /// one ignores it. Errors ([`Error::Invalid`]) name the edge; the builder stays usable.
    #[inline]
    pub fn add_edge(&mut self, src: u64, dst: u64, weight: Option<f32>) -> Result<()> {
        if src > EdgeSorter::MAX_ID || dst > EdgeSorter::MAX_ID {
            return Err(Error::invalid(format!(
                "edge ({src}, {dst}): vertex ids above {} (2^32 - 1) are not supported by the \
                 import",
                EdgeSorter::MAX_ID
            )));
        }
        if let Some(v) = self.options.vertices
            && (src >= v || dst >= v)
        {
            return Err(Error::invalid(format!(
                "edge ({src}, {dst}) names a vertex beyond the {v} vertices"
            )));
        }
        let weight = if self.weighted {
            match weight {
                None => {
                    return Err(Error::invalid(format!(
                        "edge ({src}, {dst}) has no weight but the graph is weighted"
                    )));
                }
                Some(w) if w.is_nan() => {
                    return Err(Error::invalid(format!(
                        "edge ({src}, {dst}) has a NaN weight"
                    )));
                }
                Some(w) => w,
            }
        } else {
            1.0
        };
        self.edges_read += 1;
        let larger = src.max(dst);
        self.max_id = Some(self.max_id.map_or(larger, |m| m.max(larger)));
        if src == dst && !self.options.keep_self_loops {
            self.self_loops += 1;
            return Ok(());
        }
        self.sorter.push(src, dst, weight)?;
        self.edges_sorted += 1;
        if self.options.symmetrize && src != dst {
            self.sorter.push(dst, src, weight)?;
            self.edges_sorted += 1;
        }
        Ok(())
    }

    /// Sorts, writes and publishes the graph.
    pub fn finish(self) -> Result<(Graph, ImportStats)> {
        let GraphBuilder {
            staging,
            options,
            weighted,
            plan,
            sorter,
            edges_read,
            self_loops,
            edges_sorted,
            max_id,
            started,
        } = self;
        let vertices = options
            .vertices
            .unwrap_or_else(|| max_id.map_or(0, |m| m + 1));
        let id_width = IdWidth::for_vertices(vertices);
        let mut writer = CsrFileWriter::create(
            staging.path(),
            Direction::Out,
            id_width,
            weighted,
            plan.io_buffer,
        )?;
        let sort_reduce = sorter.finish_into(&mut writer)?;
        let edges = writer.finish(vertices)?;
        let mut meta = GraphMeta {
            vertices,
            edges,
            id_width,
            weighted,
            has_reverse: false,
        };
        let reverse_sort_reduce = if options.build_reverse {
            let spill = options
                .temp_dir
                .clone()
                .unwrap_or_else(|| staging.path().to_path_buf());
            let staged = Graph::from_parts(staging.path().to_path_buf(), meta);
            let stats = write_reverse(
                &staged,
                staging.path(),
                options.memory_bytes,
                options.threads,
                &spill,
            )?;
            meta.has_reverse = true;
            Some(stats)
        } else {
            None
        };
        write_meta(staging.path(), &meta)?;
        let dest = staging.publish(options.overwrite)?;
        let graph = Graph::open(dest)?;
        let stats = ImportStats {
            edges_read,
            self_loops_dropped: self_loops,
            edges_sorted,
            duplicates_removed: edges_sorted - edges,
            edges_kept: edges,
            vertices,
            id_width,
            sort_reduce,
            reverse_sort_reduce,
            buffer_bytes: plan.buffer_bytes,
            elapsed: started.elapsed(),
        };
        Ok((graph, stats))
    }
}

/// Edge file formats; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeFormat {
    /// Whitespace-separated `src dst [weight]`, `#`/`%` comments.
    Text,
    /// CSV with a `src,dst[,weight]` header.
    Csv,
}

impl EdgeFormat {
    /// CSV for `*.csv`, text otherwise.
    pub fn from_path(path: &Path) -> EdgeFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("csv") => EdgeFormat::Csv,
            _ => EdgeFormat::Text,
        }
    }
}

/// One parsed edge and the line it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParsedEdge {
    /// Source vertex.
    pub src: u64,
    /// Destination vertex.
    pub dst: u64,
    /// Weight, if the line has one.
    pub weight: Option<f32>,
    /// 1-based line number.
    pub line: u64,
}

/// Streams the edges of a text or CSV edge file (one line in memory at a time).
pub struct EdgeFileReader<R> {
    reader: R,
    name: PathBuf,
    format: EdgeFormat,
    line_no: u64,
    buf: String,
    /// Columns of a CSV file (2 or 3), from its header.
    csv_columns: usize,
    peeked: Option<ParsedEdge>,
    done: bool,
}

impl EdgeFileReader<BufReader<File>> {
    /// Opens `path`.
    pub fn open(path: impl AsRef<Path>, format: EdgeFormat) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io("opening edge file", path, e))?;
        EdgeFileReader::new(BufReader::with_capacity(256 << 10, file), path, format)
    }
}

impl<R: BufRead> EdgeFileReader<R> {
    /// Reads from `reader`; `name` is used in errors. A CSV header is read and checked here.
    pub fn new(reader: R, name: impl Into<PathBuf>, format: EdgeFormat) -> Result<Self> {
        let mut this = EdgeFileReader {
            reader,
            name: name.into(),
            format,
            line_no: 0,
            buf: String::new(),
            csv_columns: 0,
            peeked: None,
            done: false,
        };
        if format == EdgeFormat::Csv {
            this.read_csv_header()?;
        }
        Ok(this)
    }

    /// The file name used in errors.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// Whether the file carries weights: a CSV `weight` column, or a weight on a text file's
    /// first edge (false for a file without edges).
    pub fn has_weights(&mut self) -> Result<bool> {
        match self.format {
            EdgeFormat::Csv => Ok(self.csv_columns == 3),
            EdgeFormat::Text => {
                if self.peeked.is_none() {
                    self.peeked = self.read_edge()?;
                }
                Ok(self.peeked.is_some_and(|e| e.weight.is_some()))
            }
        }
    }

    fn error(&self, message: String) -> Error {
        Error::Parse {
            path: self.name.clone(),
            line: self.line_no,
            message,
        }
    }

    /// Reads the next line into `self.buf`; false at the end.
    fn next_line(&mut self) -> Result<bool> {
        self.buf.clear();
        let n = self
            .reader
            .read_line(&mut self.buf)
            .map_err(|e| Error::io("reading edge file", &self.name, e))?;
        if n == 0 {
            return Ok(false);
        }
        self.line_no += 1;
        if self.line_no == 1 && self.buf.starts_with('\u{feff}') {
            self.buf.drain(..3);
        }
        Ok(true)
    }

    fn read_csv_header(&mut self) -> Result<()> {
        loop {
            if !self.next_line()? {
                return Err(self.error("missing the header 'src,dst[,weight]'".into()));
            }
            if !self.buf.trim().is_empty() {
                break;
            }
        }
        let names: Vec<String> = self
            .buf
            .trim()
            .split(',')
            .map(|f| unquote(f).to_ascii_lowercase())
            .collect();
        self.csv_columns = match names.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["src", "dst"] => 2,
            ["src", "dst", "weight"] => 3,
            _ => {
                let found = self.buf.trim().to_string();
                return Err(self.error(format!(
                    "expected the header 'src,dst' or 'src,dst,weight', found '{found}'"
                )));
            }
        };
        Ok(())
    }

    fn read_edge(&mut self) -> Result<Option<ParsedEdge>> {
        if let Some(edge) = self.peeked.take() {
            return Ok(Some(edge));
        }
        if self.done {
            return Ok(None);
        }
        loop {
            if !self.next_line()? {
                self.done = true;
                return Ok(None);
            }
            let line = self.buf.trim_end_matches(['\n', '\r']);
            let fields: Vec<&str> = match self.format {
                EdgeFormat::Text => {
                    let content = line.split(['#', '%']).next().unwrap_or("");
                    content.split_whitespace().collect()
                }
                EdgeFormat::Csv => {
                    if line.trim().is_empty() {
                        continue;
                    }
                    line.split(',').map(unquote).collect()
                }
            };
            if fields.is_empty() {
                continue;
            }
            let expected = match self.format {
                EdgeFormat::Text if fields.len() == 2 || fields.len() == 3 => fields.len(),
                EdgeFormat::Text => {
                    return Err(self.error(format!(
                        "expected 'src dst [weight]', found {} fields",
                        fields.len()
                    )));
                }
                EdgeFormat::Csv => self.csv_columns,
            };
            if fields.len() != expected {
                return Err(self.error(format!(
                    "expected {expected} fields as in the header, found {}",
                    fields.len()
                )));
            }
            let id = |s: &str| {
                s.parse::<u64>()
                    .map_err(|_| format!("invalid vertex id '{s}'"))
            };
            let parsed = (|| {
                let src = id(fields[0])?;
                let dst = id(fields[1])?;
                let weight = match fields.get(2) {
                    Some(w) => Some(
                        w.parse::<f32>()
                            .ok()
                            .filter(|w| !w.is_nan())
                            .ok_or_else(|| format!("invalid weight '{w}'"))?,
                    ),
                    None => None,
                };
                Ok::<_, String>((src, dst, weight))
            })();
            let (src, dst, weight) = parsed.map_err(|m| self.error(m))?;
            return Ok(Some(ParsedEdge {
                src,
                dst,
                weight,
                line: self.line_no,
            }));
        }
    }
}

/// Trims spaces and one pair of surrounding double quotes.
fn unquote(field: &str) -> &str {
    let f = field.trim();
    f.strip_prefix('"')
        .and_then(|f| f.strip_suffix('"'))
        .map_or(f, str::trim)
}

impl<R: BufRead> Iterator for EdgeFileReader<R> {
    type Item = Result<ParsedEdge>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.read_edge() {
            Ok(edge) => edge.map(Ok),
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Imports edge files (all in one graph) into `dest`. `format` `None` picks by extension
/// ([`EdgeFormat::from_path`]). With `options.weighted` `None`, the first file decides whether
/// the graph is weighted. Errors name the file and line.
pub fn import_edge_files(
    paths: &[impl AsRef<Path>],
    format: Option<EdgeFormat>,
    dest: impl AsRef<Path>,
    options: ImportOptions,
) -> Result<(Graph, ImportStats)> {
    let mut readers = paths
        .iter()
        .map(|p| {
            let p = p.as_ref();
            EdgeFileReader::open(p, format.unwrap_or_else(|| EdgeFormat::from_path(p)))
        })
        .collect::<Result<Vec<_>>>()?;
    let weighted = match (options.weighted, readers.first_mut()) {
        (Some(w), _) => w,
        (None, Some(first)) => first.has_weights()?,
        (None, None) => false,
    };
    let mut builder = GraphBuilder::new(
        dest,
        ImportOptions {
            weighted: Some(weighted),
            ..options
        },
    )?;
    for reader in readers {
        let name = reader.name().to_path_buf();
        for edge in reader {
            let edge = edge?;
            builder
                .add_edge(edge.src, edge.dst, edge.weight)
                .map_err(|e| match e {
                    Error::Invalid(message) => Error::Parse {
                        path: name.clone(),
                        line: edge.line,
                        message,
                    },
                    other => other,
                })?;
        }
    }
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, format: EdgeFormat) -> Result<Vec<ParsedEdge>> {
        EdgeFileReader::new(text.as_bytes(), "edges", format)?.collect()
    }

    #[test]
    fn text_format() {
        let edges = parse(
            "# comment\n\n1 2\n3\t4 0.5 # trailing\n% konect comment\n  5 6  \r\n",
            EdgeFormat::Text,
        )
        .unwrap();
        let got: Vec<_> = edges
            .iter()
            .map(|e| (e.src, e.dst, e.weight, e.line))
            .collect();
        assert_eq!(
            got,
            vec![(1, 2, None, 3), (3, 4, Some(0.5), 4), (5, 6, None, 6)]
        );
        let err = parse("1 2\n1 x\n", EdgeFormat::Text)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "graph: edges:2: invalid vertex id 'x'");
        let err = parse("1 2 3 4\n", EdgeFormat::Text)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("edges:1:") && err.contains("4 fields"),
            "{err}"
        );
        let err = parse("1 2 nan\n", EdgeFormat::Text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid weight"), "{err}");
        let mut r =
            EdgeFileReader::new("# x\n1 2 0.25\n".as_bytes(), "e", EdgeFormat::Text).unwrap();
        assert!(r.has_weights().unwrap());
        assert_eq!(r.next().unwrap().unwrap().weight, Some(0.25));
    }

    #[test]
    fn csv_format() {
        let edges = parse("src,dst,weight\n1,2,0.5\n\n\"3\", 4 ,1\n", EdgeFormat::Csv).unwrap();
        let got: Vec<_> = edges
            .iter()
            .map(|e| (e.src, e.dst, e.weight, e.line))
            .collect();
        assert_eq!(got, vec![(1, 2, Some(0.5), 2), (3, 4, Some(1.0), 4)]);
        let mut r = EdgeFileReader::new("SRC,DST\n".as_bytes(), "e", EdgeFormat::Csv).unwrap();
        assert!(!r.has_weights().unwrap());
        let err = parse("a,b\n1,2\n", EdgeFormat::Csv)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("edges:1:") && err.contains("header"), "{err}");
        let err = parse("src,dst\n1,2\n1,2,3\n", EdgeFormat::Csv)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("edges:3:") && err.contains("expected 2 fields"),
            "{err}"
        );
        assert!(parse("", EdgeFormat::Csv).is_err());
    }

    #[test]
    fn builder_dedups_drops_self_loops_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        let opts = ImportOptions::default()
            .with_memory_bytes(1 << 20)
            .with_weighted(true)
            .with_temp_dir(dir.path().join("tmp"));
        let mut b = GraphBuilder::new(dir.path().join("g"), opts.clone()).unwrap();
        for (s, d, w) in [
            (2, 1, 5.0),
            (0, 1, 2.0),
            (2, 1, 3.0),
            (1, 1, 1.0),
            (0, 1, 4.0),
        ] {
            b.add_edge(s, d, Some(w)).unwrap();
        }
        assert!(
            b.add_edge(0, 2, None)
                .unwrap_err()
                .to_string()
                .contains("no weight")
        );
        assert!(b.add_edge(0, 2, Some(f32::NAN)).is_err());
        assert!(
            b.add_edge(1 << 32, 2, Some(1.0))
                .unwrap_err()
                .to_string()
                .contains("2^32")
        );
        let (g, stats) = b.finish().unwrap();
        assert_eq!(g.vertices(), 3);
        let edges: Vec<_> = g
            .edges(Direction::Out)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(edges, vec![(0, 1, 2.0), (2, 1, 3.0)]);
        assert_eq!(
            (
                stats.edges_read,
                stats.self_loops_dropped,
                stats.duplicates_removed,
                stats.edges_kept
            ),
            (5, 1, 2, 2)
        );
        assert!(stats.sort_reduce.peak_reserved <= stats.sort_reduce.memory_budget_bytes);
        assert!(stats.sort_reduce.memory_budget_bytes + stats.buffer_bytes <= 1 << 20);
        // Explicit vertex count, symmetrized, with self-loops and the reverse graph.
        let opts = opts
            .with_weighted(false)
            .with_vertices(5)
            .with_self_loops(true)
            .with_symmetrize(true)
            .with_reverse(true);
        let mut b = GraphBuilder::new(dir.path().join("h"), opts).unwrap();
        b.add_edge(3, 1, None).unwrap();
        b.add_edge(2, 2, None).unwrap();
        assert!(
            b.add_edge(5, 1, None)
                .unwrap_err()
                .to_string()
                .contains("5 vertices")
        );
        let (g, stats) = b.finish().unwrap();
        assert_eq!(
            (g.vertices(), g.edges_count(), stats.edges_sorted),
            (5, 3, 3)
        );
        assert!(g.has_reverse() && !g.is_weighted());
        let edges: Vec<_> = g
            .edges(Direction::In)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        assert_eq!(edges, vec![(1, 3, 1.0), (2, 2, 1.0), (3, 1, 1.0)]);
        // Spill directories are gone.
        let tmp = std::fs::read_dir(dir.path().join("tmp"));
        assert_eq!(tmp.map_or(0, |d| d.count()), 0);
    }

    #[test]
    fn file_import_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.txt");
        std::fs::write(&path, "0 1\n1 2\n5000000000 1\n").unwrap();
        let err = import_edge_files(
            &[&path],
            None,
            dir.path().join("g"),
            ImportOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("e.txt:3:") && err.contains("2^32"), "{err}");
        assert!(!dir.path().join("g").exists());
        // Nothing left next to the file: the staging directory is removed.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let csv = dir.path().join("e.csv");
        std::fs::write(&csv, "src,dst,weight\n0,1,0.5\n1,0,0.25\n").unwrap();
        let (g, _) = import_edge_files(
            &[&csv],
            None,
            dir.path().join("g"),
            ImportOptions::default().with_memory_bytes(1 << 20),
        )
        .unwrap();
        assert!(g.is_weighted());
        assert_eq!(g.edges_count(), 2);
    }
}
