//! Graph storage: compressed sparse rows on disk (GraFBoost's index + edge files, sec. 9.5.1).
//!
//! # Layout
//!
//! A graph is a directory:
//!
//! ```text
//! <graph>/meta          text header, see below (the commit point of the graph)
//! <graph>/out.index     (V + 1) little-endian u64: out-edges of v are out.edges[index[v]..index[v+1]]
//! <graph>/out.edges     E destination ids, little-endian u32 or u64 (the id width)
//! <graph>/out.weights   E little-endian f32, parallel to out.edges (weighted graphs only)
//! <graph>/in.index      the reverse graph (in-edges: for each v, the sources of edges into v),
//! <graph>/in.edges      same format; present when `meta` says `reverse 1`
//! <graph>/in.weights
//! ```
//!
//! Each vertex's neighbours are sorted ascending and unique. `meta` is plain text, one
//! `key value` per line, starting with the format line `quarry-graph 1`:
//!
//! ```text
//! quarry-graph 1
//! vertices 1048576
//! edges 15700000
//! id_width 4
//! weighted 0
//! reverse 1
//! crc32c out.index 8d1e0f4a
//! crc32c out.edges 1b77c2e9
//! ...
//! ```
//!
//! The `crc32c` lines (one per file, computed from the finished files when `meta` is written;
//! absent in graphs written before they existed) let `quarry scrub` find damaged files.
//!
//! The id width is 4 (u32) whenever `V <= 2^32` (every id then fits), 8 otherwise. Halving the
//! edge file is worth the branch: the edge file is most of the graph's bytes and every superstep
//! reads it.
//!
//! # Reading
//!
//! Nothing maps the files: [`Graph::edges`] streams all edges front to back through fixed
//! buffers, and [`Adjacency`] answers one vertex's neighbours with two positional reads
//! (`read_at` on the index, then on the edges). The engine streams the index and edges in
//! vertex order alongside its sorted active list, so it reads both sequentially.
//!
//! # Atomic publish
//!
//! A graph is built in a staging directory `.quarry-graph-<pid>-<n>.staging` next to its
//! destination; every file is fsynced, then the staging directory, then it is renamed into place
//! and the parent directory is fsynced. A killed import leaves only the staging directory
//! (removed by [`clean_stale_temp_dirs`](crate::clean_stale_temp_dirs)), never a partial graph.
//! Adding the reverse graph to an existing graph writes the `in.*` files in a scratch directory
//! inside the graph, renames them in, then replaces `meta` (write `meta.tmp`, fsync, rename):
//! until `meta` says `reverse 1`, `in.*` files are ignored.

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use quarry_sortreduce::{SortReduceConfig, SortReduceStats, SortReducer};

use crate::error::{Error, Result};
use crate::import::ImportOptions;
use crate::io::{ForwardReader, RecordWriter, plan_memory, sync_dir, unique_name};

/// Name of the header file.
pub const META_FILE: &str = "meta";
const FORMAT_LINE: &str = "quarry-graph 1";

/// Which edges of a vertex: the out-edges (the graph as imported) or the in-edges (the reverse
/// graph).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Edges leaving the vertex.
    Out,
    /// Edges entering the vertex (stored only when the reverse graph was built).
    In,
}

impl Direction {
    fn prefix(self) -> &'static str {
        match self {
            Direction::Out => "out",
            Direction::In => "in",
        }
    }
}

/// The three files of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CsrFile {
    Index,
    Edges,
    Weights,
}

/// File name of one CSR file, e.g. `out.index`.
pub(crate) fn csr_file_name(direction: Direction, file: CsrFile) -> String {
    let kind = match file {
        CsrFile::Index => "index",
        CsrFile::Edges => "edges",
        CsrFile::Weights => "weights",
    };
    format!("{}.{kind}", direction.prefix())
}

/// Width of the vertex ids in the edge files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdWidth {
    /// 4-byte ids (graphs of at most 2^32 vertices).
    U32,
    /// 8-byte ids.
    U64,
}

impl IdWidth {
    /// Bytes per id.
    pub fn bytes(self) -> usize {
        match self {
            IdWidth::U32 => 4,
            IdWidth::U64 => 8,
        }
    }

    /// The narrowest width for a graph of `vertices` vertices.
    pub fn for_vertices(vertices: u64) -> IdWidth {
        if vertices <= 1 << 32 {
            IdWidth::U32
        } else {
            IdWidth::U64
        }
    }

    #[inline]
    pub(crate) fn decode(self, bytes: &[u8]) -> u64 {
        match self {
            IdWidth::U32 => u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as u64,
            IdWidth::U64 => u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
        }
    }
}

/// The header of a graph: its size and which files it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphMeta {
    /// Number of vertices `V`; ids are `0..V`.
    pub vertices: u64,
    /// Number of (directed) edges `E`, after duplicates and (by default) self-loops were removed.
    pub edges: u64,
    /// Width of ids in the edge files.
    pub id_width: IdWidth,
    /// Whether `*.weights` files exist (otherwise every weight reads as 1.0).
    pub weighted: bool,
    /// Whether the reverse graph (`in.*`) exists.
    pub has_reverse: bool,
}

impl GraphMeta {
    /// The text form stored in `meta`.
    pub fn to_text(&self) -> String {
        format!(
            "{FORMAT_LINE}\nvertices {}\nedges {}\nid_width {}\nweighted {}\nreverse {}\n",
            self.vertices,
            self.edges,
            self.id_width.bytes(),
            self.weighted as u8,
            self.has_reverse as u8
        )
    }

    /// Parses the text form; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<GraphMeta> {
        let bad = |detail: String| Error::corrupt(path, detail);
        let mut lines = text.lines();
        if lines.next() != Some(FORMAT_LINE) {
            return Err(bad(format!("does not start with '{FORMAT_LINE}'")));
        }
        let (mut vertices, mut edges, mut width, mut weighted, mut reverse) =
            (None, None, None, None, None);
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let (key, value) = line
                .split_once(' ')
                .ok_or_else(|| bad(format!("malformed line '{line}'")))?;
            let number = || {
                value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("malformed value in '{line}'")))
            };
            let flag = || match value.trim() {
                "0" => Ok(false),
                "1" => Ok(true),
                _ => Err(bad(format!("malformed flag in '{line}'"))),
            };
            match key {
                "vertices" => vertices = Some(number()?),
                "edges" => edges = Some(number()?),
                "id_width" => {
                    width = Some(match number()? {
                        4 => IdWidth::U32,
                        8 => IdWidth::U64,
                        w => return Err(bad(format!("unsupported id width {w}"))),
                    })
                }
                "weighted" => weighted = Some(flag()?),
                "reverse" => reverse = Some(flag()?),
                // Whole-file checksums, read by `scrub`; checked for form here.
                CHECKSUM_KEY => {
                    parse_checksum(value).ok_or_else(|| bad(format!("malformed checksum line '{line}'")))?;
                }
                // Unknown keys are an error: a newer format must not be half-understood.
                _ => return Err(bad(format!("unknown key '{key}'"))),
            }
        }
        let missing = |name: &str| bad(format!("missing '{name}'"));
        let meta = GraphMeta {
            vertices: vertices.ok_or_else(|| missing("vertices"))?,
            edges: edges.ok_or_else(|| missing("edges"))?,
            id_width: width.ok_or_else(|| missing("id_width"))?,
            weighted: weighted.ok_or_else(|| missing("weighted"))?,
            has_reverse: reverse.ok_or_else(|| missing("reverse"))?,
        };
        if meta.id_width == IdWidth::U32 && meta.vertices > 1 << 32 {
            return Err(bad(format!(
                "{} vertices do not fit 4-byte ids",
                meta.vertices
            )));
        }
        Ok(meta)
    }

    /// The files the graph consists of (besides `meta`), by name.
    fn files(&self) -> Vec<(String, CsrFile)> {
        let directions: &[Direction] = if self.has_reverse { &[Direction::Out, Direction::In] } else { &[Direction::Out] };
        let files: &[CsrFile] = if self.weighted { &[CsrFile::Index, CsrFile::Edges, CsrFile::Weights] } else { &[CsrFile::Index, CsrFile::Edges] };
        directions.iter().flat_map(|&d| files.iter().map(move |&f| (csr_file_name(d, f), f))).collect()
    }

    /// Expected size of each file of `direction`.
    fn expected_len(&self, file: CsrFile) -> u64 {
        match file {
            CsrFile::Index => (self.vertices + 1) * 8,
            CsrFile::Edges => self.edges * self.id_width.bytes() as u64,
            CsrFile::Weights => self.edges * 4,
        }
    }
}

/// Writes `meta` durably: `meta.tmp`, fsync, rename over `meta`. The caller syncs the directory.
/// The header also records the CRC-32C of each file it names (`crc32c out.edges 1a2b3c4d`),
/// read back from the finished files, for `scrub`.
pub(crate) fn write_meta(dir: &Path, meta: &GraphMeta) -> Result<()> {
    let tmp = dir.join("meta.tmp");
    let path = dir.join(META_FILE);
    let _ = fs::remove_file(&tmp);
    let mut text = meta.to_text();
    for (name, _) in meta.files() {
        let file = dir.join(&name);
        let crc = file_crc32c(&file, &mut |_| {}).map_err(|e| Error::io("reading", &file, e))?;
        text.push_str(&format!("{CHECKSUM_KEY} {name} {crc:08x}\n"));
    }
    let mut writer = RecordWriter::create(&tmp, 4096)?;
    writer.write(text.as_bytes())?;
    writer.finish(true)?;
    fs::rename(&tmp, &path).map_err(|e| Error::io("renaming", &tmp, e))
}

/// The header key of a file's checksum.
const CHECKSUM_KEY: &str = "crc32c";

/// `FILE HEX` of a checksum line.
fn parse_checksum(value: &str) -> Option<(&str, u32)> {
    let (file, hex) = value.trim().split_once(' ')?;
    Some((file, u32::from_str_radix(hex.trim(), 16).ok()?))
}

/// CRC-32C of a whole file, read in blocks; `pace(bytes)` after each.
fn file_crc32c(path: &Path, pace: &mut dyn FnMut(u64)) -> std::io::Result<u32> {
    use std::io::Read;
    let mut file = fs::File::open(path)?;
    let mut buffer = vec![0u8; 1 << 16];
    let mut crc = 0u32;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok(crc);
        }
        crc = crc32c::crc32c_append(crc, &buffer[..n]);
        pace(n as u64);
    }
}

/// What scrubbing one graph found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GraphScrub {
    /// Files read and checked against their recorded checksums.
    pub files_verified: u64,
    /// Bytes of them.
    pub bytes_verified: u64,
    /// Whether the header records no checksums (a graph written before they existed).
    pub unverifiable: bool,
    /// Damaged files (names within the graph directory) and what is wrong with each.
    pub damage: Vec<(String, String)>,
}

/// Reads every file of the graph at `dir` and checks it against the checksums its header
/// recorded (and its size against the header's counts); `pace(bytes)` after each block read.
pub fn scrub(dir: &Path, pace: &mut dyn FnMut(u64)) -> Result<GraphScrub> {
    let meta_path = dir.join(META_FILE);
    let mut found = GraphScrub::default();
    let text = match fs::read_to_string(&meta_path) {
        Ok(text) => text,
        Err(e) => {
            found.damage.push((META_FILE.into(), format!("cannot be read: {e}")));
            return Ok(found);
        }
    };
    let meta = match GraphMeta::parse(&text, &meta_path) {
        Ok(meta) => meta,
        Err(e) => {
            found.damage.push((META_FILE.into(), e.to_string()));
            return Ok(found);
        }
    };
    let recorded: HashMap<&str, u32> = text.lines().filter_map(|l| parse_checksum(l.strip_prefix(CHECKSUM_KEY)?)).collect();
    found.unverifiable = recorded.is_empty();
    for (name, kind) in meta.files() {
        let path = dir.join(&name);
        let expected_len = meta.expected_len(kind);
        match fs::metadata(&path) {
            Err(e) => found.damage.push((name, format!("cannot be opened: {e}"))),
            Ok(m) if m.len() != expected_len => found.damage.push((name, format!("{} bytes on disk, the header implies {expected_len}", m.len()))),
            Ok(m) => {
                let Some(&expected) = recorded.get(name.as_str()) else { continue };
                let crc = file_crc32c(&path, pace).map_err(|e| Error::io("reading", &path, e))?;
                if crc != expected {
                    found.damage.push((name, format!("its CRC-32C is {crc:08x}, {expected:08x} was recorded when it was written")));
                }
                found.files_verified += 1;
                found.bytes_verified += m.len();
            }
        }
    }
    Ok(found)
}

/// An opened graph directory (only the header is read on open).
#[derive(Debug, Clone)]
pub struct Graph {
    dir: PathBuf,
    meta: GraphMeta,
}

impl Graph {
    /// Opens the graph at `dir`, checking that every file it names has the right size.
    pub fn open(dir: impl AsRef<Path>) -> Result<Graph> {
        let dir = dir.as_ref().to_path_buf();
        let meta_path = dir.join(META_FILE);
        let text = fs::read_to_string(&meta_path)
            .map_err(|e| Error::io("reading graph header", &meta_path, e))?;
        let meta = GraphMeta::parse(&text, &meta_path)?;
        let graph = Graph { dir, meta };
        let mut directions = vec![Direction::Out];
        if meta.has_reverse {
            directions.push(Direction::In);
        }
        for direction in directions {
            let mut files = vec![CsrFile::Index, CsrFile::Edges];
            if meta.weighted {
                files.push(CsrFile::Weights);
            }
            for file in files {
                let path = graph.file(direction, file);
                let len = fs::metadata(&path)
                    .map_err(|e| Error::io("opening graph file", &path, e))?
                    .len();
                let expected = meta.expected_len(file);
                if len != expected {
                    return Err(Error::corrupt(
                        &path,
                        format!("{len} bytes, expected {expected}"),
                    ));
                }
            }
        }
        Ok(graph)
    }

    /// A graph whose files were just written (no checks).
    pub(crate) fn from_parts(dir: PathBuf, meta: GraphMeta) -> Graph {
        Graph { dir, meta }
    }

    /// The graph directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The header.
    pub fn meta(&self) -> &GraphMeta {
        &self.meta
    }

    /// Number of vertices.
    pub fn vertices(&self) -> u64 {
        self.meta.vertices
    }

    /// Number of edges.
    pub fn edges_count(&self) -> u64 {
        self.meta.edges
    }

    /// Whether edges carry weights.
    pub fn is_weighted(&self) -> bool {
        self.meta.weighted
    }

    /// Whether the reverse graph (in-edges) is stored.
    pub fn has_reverse(&self) -> bool {
        self.meta.has_reverse
    }

    /// Path of one CSR file.
    pub(crate) fn file(&self, direction: Direction, file: CsrFile) -> PathBuf {
        self.dir.join(csr_file_name(direction, file))
    }

    /// Fails unless the files of `direction` exist.
    pub(crate) fn require(&self, direction: Direction) -> Result<()> {
        if direction == Direction::In && !self.meta.has_reverse {
            return Err(Error::invalid(format!(
                "graph {} has no reverse graph (in-edges); build it first (Graph::build_reverse \
                 or ImportOptions::build_reverse)",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Random access to the neighbours of single vertices.
    pub fn adjacency(&self, direction: Direction) -> Result<Adjacency> {
        self.require(direction)?;
        let open = |file| {
            let path = self.file(direction, file);
            File::open(&path)
                .map(|f| (f, path.clone()))
                .map_err(|e| Error::io("opening graph file", path, e))
        };
        Ok(Adjacency {
            index: open(CsrFile::Index)?,
            edges: open(CsrFile::Edges)?,
            weights: if self.meta.weighted {
                Some(open(CsrFile::Weights)?)
            } else {
                None
            },
            meta: self.meta,
        })
    }

    /// Every edge `(src, dst, weight)` of `direction` in CSR order (ascending `src`, then `dst`;
    /// for [`Direction::In`], `src` is the vertex the edges enter), streamed through three
    /// 64 KiB buffers. Unweighted graphs report weight 1.0.
    pub fn edges(&self, direction: Direction) -> Result<EdgeIter> {
        EdgeIter::open(self, direction, 64 << 10)
    }

    /// Builds and stores the reverse graph (in-edges) by sort-reducing the out-edges by
    /// destination within `options.memory_bytes` (only `memory_bytes`, `threads` and `temp_dir`
    /// of the options are used). Does nothing if the graph already has it. Crash-safe: until the
    /// header is replaced, the new files are ignored.
    pub fn build_reverse(&mut self, options: &ImportOptions) -> Result<SortReduceStats> {
        if self.meta.has_reverse {
            return Ok(SortReduceStats::default());
        }
        let work = ScratchDir(self.dir.join(format!(".{}.reverse", unique_name())));
        fs::create_dir(&work.0).map_err(|e| Error::io("creating directory", &work.0, e))?;
        let spill = options.temp_dir.clone().unwrap_or_else(|| work.0.clone());
        let stats = write_reverse(self, &work.0, options.memory_bytes, options.threads, &spill)?;
        let mut files = vec![CsrFile::Index, CsrFile::Edges];
        if self.meta.weighted {
            files.push(CsrFile::Weights);
        }
        for file in files {
            let name = csr_file_name(Direction::In, file);
            let from = work.0.join(&name);
            fs::rename(&from, self.dir.join(&name)).map_err(|e| Error::io("renaming", from, e))?;
        }
        let meta = GraphMeta {
            has_reverse: true,
            ..self.meta
        };
        sync_dir(&self.dir)?;
        write_meta(&self.dir, &meta)?;
        sync_dir(&self.dir)?;
        self.meta = meta;
        Ok(stats)
    }
}

/// A directory removed on drop (scratch space inside a graph directory).
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Random access to single vertices' neighbours: two positional reads per vertex, no caching.
#[derive(Debug)]
pub struct Adjacency {
    index: (File, PathBuf),
    edges: (File, PathBuf),
    weights: Option<(File, PathBuf)>,
    meta: GraphMeta,
}

impl Adjacency {
    /// `[start, end)` of `vertex`'s edges in the edge file.
    fn range(&self, vertex: u64) -> Result<(u64, u64)> {
        if vertex >= self.meta.vertices {
            return Err(Error::invalid(format!(
                "vertex {vertex} is not in the graph ({} vertices)",
                self.meta.vertices
            )));
        }
        let mut raw = [0u8; 16];
        let (file, path) = &self.index;
        file.read_exact_at(&mut raw, vertex * 8)
            .map_err(|e| Error::io("reading", path, e))?;
        let start = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        let end = u64::from_le_bytes(raw[8..].try_into().expect("8 bytes"));
        if start > end || end > self.meta.edges {
            return Err(Error::corrupt(
                path,
                format!("vertex {vertex} has edge range {start}..{end}"),
            ));
        }
        Ok((start, end))
    }

    /// Number of edges of `vertex`.
    pub fn degree(&self, vertex: u64) -> Result<u64> {
        let (start, end) = self.range(vertex)?;
        Ok(end - start)
    }

    /// The neighbours of `vertex`, ascending.
    pub fn neighbours(&self, vertex: u64) -> Result<Vec<u64>> {
        let (start, end) = self.range(vertex)?;
        let width = self.meta.id_width.bytes();
        let mut raw = vec![0u8; (end - start) as usize * width];
        let (file, path) = &self.edges;
        file.read_exact_at(&mut raw, start * width as u64)
            .map_err(|e| Error::io("reading", path, e))?;
        Ok(raw
            .chunks_exact(width)
            .map(|b| self.meta.id_width.decode(b))
            .collect())
    }

    /// The neighbours of `vertex` with edge weights (1.0 on unweighted graphs).
    pub fn weighted_neighbours(&self, vertex: u64) -> Result<Vec<(u64, f32)>> {
        let ids = self.neighbours(vertex)?;
        let Some((file, path)) = &self.weights else {
            return Ok(ids.into_iter().map(|id| (id, 1.0)).collect());
        };
        let (start, _) = self.range(vertex)?;
        let mut raw = vec![0u8; ids.len() * 4];
        file.read_exact_at(&mut raw, start * 4)
            .map_err(|e| Error::io("reading", path, e))?;
        Ok(ids
            .into_iter()
            .zip(raw.chunks_exact(4))
            .map(|(id, w)| (id, f32::from_le_bytes(w.try_into().expect("4 bytes"))))
            .collect())
    }
}

/// Sequential iterator over all edges of one direction; see [`Graph::edges`].
#[derive(Debug)]
pub struct EdgeIter {
    cursor: AdjCursor,
    vertices: u64,
    src: u64,
    pos: u64,
    end: u64,
    done: bool,
}

impl EdgeIter {
    fn open(graph: &Graph, direction: Direction, buffer: usize) -> Result<EdgeIter> {
        let mut cursor = AdjCursor::open(graph, direction, buffer)?;
        let vertices = graph.vertices();
        let (pos, end) = if vertices == 0 {
            (0, 0)
        } else {
            cursor.range(0)?
        };
        Ok(EdgeIter {
            cursor,
            vertices,
            src: 0,
            pos,
            end,
            done: vertices == 0,
        })
    }

    fn advance(&mut self) -> Result<Option<(u64, u64, f32)>> {
        while self.pos == self.end {
            self.src += 1;
            if self.src >= self.vertices {
                self.done = true;
                return Ok(None);
            }
            (self.pos, self.end) = self.cursor.range(self.src)?;
        }
        let (dst, weight) = self.cursor.edge(self.pos)?;
        self.pos += 1;
        Ok(Some((self.src, dst, weight)))
    }
}

impl Iterator for EdgeIter {
    type Item = Result<(u64, u64, f32)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.advance();
        if item.is_err() {
            self.done = true;
        }
        item.transpose()
    }
}

/// Forward-only reader of one direction's index, edges and weights, for streaming in vertex
/// order (the engine's scatter and [`EdgeIter`]). Three buffers of `buffer` bytes.
#[derive(Debug)]
pub(crate) struct AdjCursor {
    index: ForwardReader,
    edges: ForwardReader,
    weights: Option<ForwardReader>,
    width: IdWidth,
    edge_count: u64,
}

impl AdjCursor {
    pub(crate) fn open(graph: &Graph, direction: Direction, buffer: usize) -> Result<Self> {
        graph.require(direction)?;
        let meta = graph.meta();
        Ok(AdjCursor {
            index: ForwardReader::open(&graph.file(direction, CsrFile::Index), buffer)?,
            edges: ForwardReader::open(&graph.file(direction, CsrFile::Edges), buffer)?,
            weights: if meta.weighted {
                Some(ForwardReader::open(
                    &graph.file(direction, CsrFile::Weights),
                    buffer,
                )?)
            } else {
                None
            },
            width: meta.id_width,
            edge_count: meta.edges,
        })
    }

    /// `[start, end)` of `vertex`'s edges.
    #[inline]
    pub(crate) fn range(&mut self, vertex: u64) -> Result<(u64, u64)> {
        let raw = self.index.slice(vertex * 8, 16)?;
        let start = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        let end = u64::from_le_bytes(raw[8..].try_into().expect("8 bytes"));
        if start > end || end > self.edge_count {
            let path = format!("index entry of vertex {vertex}");
            return Err(Error::corrupt(path, format!("edge range {start}..{end}")));
        }
        Ok((start, end))
    }

    /// Edge number `pos`.
    fn edge(&mut self, pos: u64) -> Result<(u64, f32)> {
        let w = self.width.bytes();
        let dst = self.width.decode(self.edges.slice(pos * w as u64, w)?);
        let weight = match &mut self.weights {
            Some(r) => f32::from_le_bytes(r.slice(pos * 4, 4)?.try_into().expect("4 bytes")),
            None => 1.0,
        };
        Ok((dst, weight))
    }

    /// Calls `f(dst, weight)` for edges `start..end`, in pieces that fit the buffers.
    #[inline]
    pub(crate) fn scan(
        &mut self,
        start: u64,
        end: u64,
        mut f: impl FnMut(u64, f32) -> Result<()>,
    ) -> Result<()> {
        let AdjCursor {
            edges,
            weights,
            width,
            ..
        } = self;
        let w = width.bytes();
        let mut piece_max = edges.capacity() / w;
        if let Some(r) = weights.as_ref() {
            piece_max = piece_max.min(r.capacity() / 4);
        }
        let mut pos = start;
        while pos < end {
            let n = ((end - pos) as usize).min(piece_max);
            let ids = edges.slice(pos * w as u64, n * w)?;
            match weights.as_mut() {
                Some(r) => {
                    let ws = r.slice(pos * 4, n * 4)?;
                    for (id, wt) in ids.chunks_exact(w).zip(ws.chunks_exact(4)) {
                        f(
                            width.decode(id),
                            f32::from_le_bytes(wt.try_into().expect("4 bytes")),
                        )?;
                    }
                }
                None => {
                    for id in ids.chunks_exact(w) {
                        f(width.decode(id), 1.0)?;
                    }
                }
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// Bytes read from the three files.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.index.bytes_read()
            + self.edges.bytes_read()
            + self.weights.as_ref().map_or(0, |r| r.bytes_read())
    }
}

/// Writes one direction's CSR files from edges in ascending `(src, dst)` order.
#[derive(Debug)]
pub(crate) struct CsrFileWriter {
    index: RecordWriter,
    edges: RecordWriter,
    weights: Option<RecordWriter>,
    width: IdWidth,
    /// The next vertex whose index entry is not yet written.
    next_vertex: u64,
    count: u64,
    last: Option<(u64, u64)>,
    max_dst: Option<u64>,
}

impl CsrFileWriter {
    pub(crate) fn create(
        dir: &Path,
        direction: Direction,
        width: IdWidth,
        weighted: bool,
        buffer: usize,
    ) -> Result<Self> {
        let file = |f| dir.join(csr_file_name(direction, f));
        Ok(CsrFileWriter {
            index: RecordWriter::create(&file(CsrFile::Index), buffer)?,
            edges: RecordWriter::create(&file(CsrFile::Edges), buffer)?,
            weights: if weighted {
                Some(RecordWriter::create(&file(CsrFile::Weights), buffer)?)
            } else {
                None
            },
            width,
            next_vertex: 0,
            count: 0,
            last: None,
            max_dst: None,
        })
    }

    #[inline]
    pub(crate) fn push(&mut self, src: u64, dst: u64, weight: f32) -> Result<()> {
        if self.last.is_some_and(|last| last >= (src, dst)) {
            return Err(Error::invalid(format!(
                "edges must come in ascending (src, dst) order without repeats: ({src}, {dst}) \
                 after {:?}",
                self.last.expect("checked")
            )));
        }
        if self.width == IdWidth::U32 && (src > u32::MAX as u64 || dst > u32::MAX as u64) {
            return Err(Error::invalid(format!(
                "edge ({src}, {dst}) does not fit 4-byte ids"
            )));
        }
        self.last = Some((src, dst));
        self.max_dst = Some(self.max_dst.map_or(dst, |m| m.max(dst)));
        while self.next_vertex <= src {
            self.index.write(&self.count.to_le_bytes())?;
            self.next_vertex += 1;
        }
        match self.width {
            IdWidth::U32 => self.edges.write(&(dst as u32).to_le_bytes())?,
            IdWidth::U64 => self.edges.write(&dst.to_le_bytes())?,
        }
        if let Some(w) = &mut self.weights {
            w.write(&weight.to_le_bytes())?;
        }
        self.count += 1;
        Ok(())
    }

    /// Completes the index for `vertices` vertices and fsyncs the files; returns the edge count.
    pub(crate) fn finish(mut self, vertices: u64) -> Result<u64> {
        let largest = self.last.map(|l| l.0).max(self.max_dst);
        if let Some(id) = largest.filter(|&id| id >= vertices) {
            return Err(Error::invalid(format!(
                "vertex id {id} is not below the vertex count {vertices}"
            )));
        }
        if self.width == IdWidth::U32 && vertices > 1 << 32 {
            return Err(Error::invalid(format!(
                "{vertices} vertices do not fit 4-byte ids"
            )));
        }
        while self.next_vertex <= vertices {
            self.index.write(&self.count.to_le_bytes())?;
            self.next_vertex += 1;
        }
        self.index.finish(true)?;
        self.edges.finish(true)?;
        if let Some(w) = self.weights {
            w.finish(true)?;
        }
        Ok(self.count)
    }
}

fn keep_unit(_: (), _: ()) {}
fn min_weight(a: f32, b: f32) -> f32 {
    a.min(b)
}

/// A sort-reducer of edges keyed `src << 32 | dst`, so that sorting by key sorts by
/// `(src, dst)` and reducing equal keys removes duplicate edges (keeping the smallest weight).
///
/// The key packs two 32-bit ids into the u64 key the sort-reducer supports; graphs with ids of
/// 2^32 and above are refused (the sort-reducer has no pair key, and may not be changed here).
pub(crate) enum EdgeSorter {
    Plain(SortReducer<u64, (), fn((), ())>),
    Weighted(SortReducer<u64, f32, fn(f32, f32) -> f32>),
}

impl EdgeSorter {
    pub(crate) fn new(weighted: bool, config: SortReduceConfig) -> Result<Self> {
        Ok(if weighted {
            EdgeSorter::Weighted(SortReducer::new(config, min_weight as fn(f32, f32) -> f32)?)
        } else {
            EdgeSorter::Plain(SortReducer::new(config, keep_unit as fn((), ()))?)
        })
    }

    /// Largest id an edge may have.
    pub(crate) const MAX_ID: u64 = u32::MAX as u64;

    #[inline]
    pub(crate) fn push(&mut self, src: u64, dst: u64, weight: f32) -> Result<()> {
        debug_assert!(src <= Self::MAX_ID && dst <= Self::MAX_ID);
        let key = (src << 32) | dst;
        match self {
            EdgeSorter::Plain(r) => r.push(key, ())?,
            EdgeSorter::Weighted(r) => r.push(key, weight)?,
        }
        Ok(())
    }

    /// Streams the sorted, unique edges into `writer`; returns the final statistics.
    pub(crate) fn finish_into(self, writer: &mut CsrFileWriter) -> Result<SortReduceStats> {
        let split = |key: u64| (key >> 32, key & 0xffff_ffff);
        match self {
            EdgeSorter::Plain(r) => {
                let mut run = r.finish()?;
                while let Some((key, ())) = run.next_record()? {
                    let (s, d) = split(key);
                    writer.push(s, d, 1.0)?;
                }
                Ok(run.stats())
            }
            EdgeSorter::Weighted(r) => {
                let mut run = r.finish()?;
                while let Some((key, w)) = run.next_record()? {
                    let (s, d) = split(key);
                    writer.push(s, d, w)?;
                }
                Ok(run.stats())
            }
        }
    }
}

/// File buffers the import and the reverse build use at once: three CSR writers, three readers.
pub(crate) const BUILD_BUFFERS: usize = 6;

/// Writes the `in.*` files of `graph` into `target` by sort-reducing its out-edges keyed
/// `dst << 32 | src`.
pub(crate) fn write_reverse(
    graph: &Graph,
    target: &Path,
    memory_bytes: usize,
    threads: usize,
    spill_parent: &Path,
) -> Result<SortReduceStats> {
    let meta = *graph.meta();
    if meta.vertices > EdgeSorter::MAX_ID + 1 {
        return Err(Error::invalid(format!(
            "building the reverse of a graph with {} vertices needs ids above 2^32, which \
             the sort-reducer's 64-bit keys cannot pair",
            meta.vertices
        )));
    }
    let plan = plan_memory(memory_bytes, BUILD_BUFFERS, 0)?;
    let config = SortReduceConfig::new(plan.sort_reduce_bytes)
        .with_threads(threads.max(1))
        .with_temp_dir(spill_parent);
    let mut sorter = EdgeSorter::new(meta.weighted, config)?;
    for edge in EdgeIter::open(graph, Direction::Out, plan.io_buffer)? {
        let (src, dst, weight) = edge?;
        sorter.push(dst, src, weight)?;
    }
    let mut writer = CsrFileWriter::create(
        target,
        Direction::In,
        meta.id_width,
        meta.weighted,
        plan.io_buffer,
    )?;
    let stats = sorter.finish_into(&mut writer)?;
    let edges = writer.finish(meta.vertices)?;
    if edges != meta.edges {
        return Err(Error::corrupt(
            graph.path(),
            format!("reverse graph has {edges} edges, expected {}", meta.edges),
        ));
    }
    Ok(stats)
}

/// A staging directory next to a graph's destination; removed on drop unless published.
#[derive(Debug)]
pub(crate) struct Staging {
    path: PathBuf,
    dest: PathBuf,
    published: bool,
}

impl Staging {
    /// Creates `<parent>/.quarry-graph-<pid>-<n>.staging`; fails early if `dest` exists and
    /// `overwrite` is off.
    pub(crate) fn create(dest: &Path, overwrite: bool) -> Result<Staging> {
        if dest.exists() && !overwrite {
            return Err(Error::invalid(format!(
                "{} already exists (pass overwrite to replace it)",
                dest.display()
            )));
        }
        let parent = parent_of(dest);
        fs::create_dir_all(&parent).map_err(|e| Error::io("creating directory", &parent, e))?;
        let path = parent.join(format!(".{}.staging", unique_name()));
        fs::create_dir(&path).map_err(|e| Error::io("creating directory", &path, e))?;
        Ok(Staging {
            path,
            dest: dest.to_path_buf(),
            published: false,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the staged graph visible at the destination (see the module docs).
    pub(crate) fn publish(mut self, overwrite: bool) -> Result<PathBuf> {
        sync_dir(&self.path)?;
        let parent = parent_of(&self.dest);
        let mut old = None;
        if fs::symlink_metadata(&self.dest).is_ok() {
            if !overwrite {
                return Err(Error::invalid(format!(
                    "{} already exists (pass overwrite to replace it)",
                    self.dest.display()
                )));
            }
            let moved = parent.join(format!(".{}.old", unique_name()));
            fs::rename(&self.dest, &moved).map_err(|e| Error::io("renaming", &self.dest, e))?;
            old = Some(moved);
        }
        fs::rename(&self.path, &self.dest).map_err(|e| Error::io("renaming", &self.path, e))?;
        self.published = true;
        sync_dir(&parent)?;
        if let Some(old) = old {
            let removed = if old.is_dir() {
                fs::remove_dir_all(&old)
            } else {
                fs::remove_file(&old)
            };
            removed.map_err(|e| Error::io("removing replaced graph", &old, e))?;
        }
        Ok(self.dest.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes a graph directly from edges that are already sorted by `(src, dst)` and unique: no
/// sort, no memory beyond three file buffers. For unsorted input use
/// [`GraphBuilder`](crate::GraphBuilder). The graph appears atomically at `finish`.
#[derive(Debug)]
pub struct GraphWriter {
    staging: Staging,
    writer: CsrFileWriter,
    vertices: u64,
    weighted: bool,
    id_width: IdWidth,
    overwrite: bool,
}

impl GraphWriter {
    /// Starts a graph of `vertices` vertices at `dest`. `id_width` may be wider than needed
    /// ([`IdWidth::for_vertices`] gives the narrowest), never narrower.
    pub fn create(
        dest: impl AsRef<Path>,
        vertices: u64,
        id_width: IdWidth,
        weighted: bool,
        overwrite: bool,
    ) -> Result<GraphWriter> {
        if id_width == IdWidth::U32 && vertices > 1 << 32 {
            return Err(Error::invalid(format!(
                "{vertices} vertices do not fit 4-byte ids"
            )));
        }
        let staging = Staging::create(dest.as_ref(), overwrite)?;
        let writer = CsrFileWriter::create(
            staging.path(),
            Direction::Out,
            id_width,
            weighted,
            256 << 10,
        )?;
        Ok(GraphWriter {
            staging,
            writer,
            vertices,
            weighted,
            id_width,
            overwrite,
        })
    }

    /// Appends the edge `src -> dst`; edges must come in strictly ascending `(src, dst)` order.
    /// `weight` is ignored for unweighted graphs.
    pub fn push(&mut self, src: u64, dst: u64, weight: f32) -> Result<()> {
        if src >= self.vertices || dst >= self.vertices {
            return Err(Error::invalid(format!(
                "edge ({src}, {dst}) names a vertex beyond the {} vertices",
                self.vertices
            )));
        }
        if self.weighted && weight.is_nan() {
            return Err(Error::invalid(format!(
                "edge ({src}, {dst}) has a NaN weight"
            )));
        }
        self.writer.push(src, dst, weight)
    }

    /// Writes the header and publishes the graph.
    pub fn finish(self) -> Result<Graph> {
        let edges = self.writer.finish(self.vertices)?;
        let meta = GraphMeta {
            vertices: self.vertices,
            edges,
            id_width: self.id_width,
            weighted: self.weighted,
            has_reverse: false,
        };
        write_meta(self.staging.path(), &meta)?;
        let dest = self.staging.publish(self.overwrite)?;
        Graph::open(dest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_roundtrip_and_errors() {
        let meta = GraphMeta {
            vertices: 10,
            edges: 20,
            id_width: IdWidth::U32,
            weighted: true,
            has_reverse: false,
        };
        let p = Path::new("meta");
        assert_eq!(GraphMeta::parse(&meta.to_text(), p).unwrap(), meta);
        assert!(GraphMeta::parse("quarry-graph 2\n", p).is_err());
        let text = meta.to_text().replace("id_width 4", "id_width 3");
        assert!(
            GraphMeta::parse(&text, p)
                .unwrap_err()
                .to_string()
                .contains("id width 3")
        );
        let text = meta.to_text().replace("reverse 0\n", "");
        assert!(
            GraphMeta::parse(&text, p)
                .unwrap_err()
                .to_string()
                .contains("reverse")
        );
        let text = meta.to_text() + "colour blue\n";
        assert!(GraphMeta::parse(&text, p).is_err());
    }

    #[test]
    fn writer_reader_roundtrip_both_widths() {
        let dir = tempfile::tempdir().unwrap();
        let edges = [
            (0u64, 1u64, 0.5f32),
            (0, 3, 1.5),
            (2, 0, 2.0),
            (2, 3, 3.0),
            (4, 4, 1.0),
        ];
        for width in [IdWidth::U32, IdWidth::U64] {
            let dest = dir.path().join(format!("g{}", width.bytes()));
            let mut w = GraphWriter::create(&dest, 6, width, true, false).unwrap();
            for &(s, d, wt) in &edges {
                w.push(s, d, wt).unwrap();
            }
            assert!(w.push(4, 4, 1.0).is_err(), "repeat rejected");
            let mut g = w.finish().unwrap();
            assert_eq!(g.meta().id_width, width);
            assert_eq!((g.vertices(), g.edges_count()), (6, 5));
            let all: Vec<_> = g
                .edges(Direction::Out)
                .unwrap()
                .map(|e| e.unwrap())
                .collect();
            assert_eq!(all, edges);
            let adj = g.adjacency(Direction::Out).unwrap();
            assert_eq!(adj.neighbours(0).unwrap(), vec![1, 3]);
            assert_eq!(adj.degree(1).unwrap(), 0);
            assert_eq!(
                adj.weighted_neighbours(2).unwrap(),
                vec![(0, 2.0), (3, 3.0)]
            );
            assert!(adj.neighbours(6).is_err());
            assert!(g.adjacency(Direction::In).is_err());
            g.build_reverse(&ImportOptions::default().with_memory_bytes(1 << 20))
                .unwrap();
            let g = Graph::open(&dest).unwrap();
            assert!(g.has_reverse());
            let rev = g.adjacency(Direction::In).unwrap();
            assert_eq!(
                rev.weighted_neighbours(3).unwrap(),
                vec![(0, 1.5), (2, 3.0)]
            );
            assert_eq!(rev.neighbours(4).unwrap(), vec![4]);
            assert_eq!(rev.neighbours(5).unwrap(), Vec::<u64>::new());
            // Only the graph's own files are left in the directory.
            let mut names: Vec<_> = fs::read_dir(&dest)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(
                names,
                [
                    "in.edges",
                    "in.index",
                    "in.weights",
                    "meta",
                    "out.edges",
                    "out.index",
                    "out.weights"
                ]
            );
            // Truncating a file is detected on open.
            let f = fs::OpenOptions::new()
                .write(true)
                .open(dest.join("out.edges"))
                .unwrap();
            f.set_len(3).unwrap();
            assert!(matches!(Graph::open(&dest), Err(Error::Corrupt { .. })));
        }
        // Nothing but the two graphs next to them: no staging leftovers.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn publish_refuses_or_replaces_existing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("g");
        GraphWriter::create(&dest, 2, IdWidth::U32, false, false)
            .unwrap()
            .finish()
            .unwrap();
        assert!(GraphWriter::create(&dest, 2, IdWidth::U32, false, false).is_err());
        let mut w = GraphWriter::create(&dest, 3, IdWidth::U32, false, true).unwrap();
        w.push(0, 2, 1.0).unwrap();
        let g = w.finish().unwrap();
        assert_eq!((g.vertices(), g.edges_count()), (3, 1));
        // An abandoned writer leaves nothing behind.
        let w = GraphWriter::create(dir.path().join("h"), 2, IdWidth::U32, false, false).unwrap();
        drop(w);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn scrub_checks_every_file_against_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("g");
        let mut w = GraphWriter::create(&dest, 1000, IdWidth::U32, true, false).unwrap();
        for v in 0..999u64 {
            w.push(v, v + 1, v as f32).unwrap();
        }
        let mut g = w.finish().unwrap();
        let options = crate::ImportOptions { memory_bytes: 1 << 20, ..Default::default() };
        g.build_reverse(&options).unwrap();
        let mut paced = 0;
        let clean = scrub(&dest, &mut |n| paced += n).unwrap();
        assert_eq!((clean.files_verified, clean.damage.len(), clean.unverifiable), (6, 0, false), "{clean:?}");
        assert_eq!(paced, clean.bytes_verified);
        // One flipped bit in the reverse graph's edges.
        let edges = dest.join("in.edges");
        let mut bytes = fs::read(&edges).unwrap();
        bytes[100] ^= 1;
        fs::write(&edges, &bytes).unwrap();
        let found = scrub(&dest, &mut |_| {}).unwrap();
        assert_eq!(found.damage.len(), 1, "{found:?}");
        assert_eq!(found.damage[0].0, "in.edges");
        // A short file is reported by its size; a header without checksums is unverifiable.
        fs::write(&edges, &bytes[..8]).unwrap();
        assert!(scrub(&dest, &mut |_| {}).unwrap().damage[0].1.contains("bytes on disk"));
        let meta = dest.join(META_FILE);
        let text: String = fs::read_to_string(&meta).unwrap().lines().filter(|l| !l.starts_with("crc32c")).map(|l| format!("{l}\n")).collect();
        fs::write(&meta, text).unwrap();
        fs::write(&edges, &bytes).unwrap();
        let legacy = scrub(&dest, &mut |_| {}).unwrap();
        assert!(legacy.unverifiable && legacy.damage.is_empty() && legacy.files_verified == 0, "{legacy:?}");
        Graph::open(&dest).unwrap();
    }
}
