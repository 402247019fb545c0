//! Reads of the node's local files for `ThrottledStore`: object_store's `LocalFileSystem`, but
//! with ranged reads into buffers the kernel writes straight into. `LocalFileSystem` zeroes each
//! buffer before reading into it (`read_range`); on a scan of cached segments that zeroing was
//! nearly as large as the kernel's copy (perf, SSB q1.1 at SF 10: `memset` from `read_range`
//! 3.5% of the samples, `_copy_to_iter` 5%).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path as FsPath;

use bytes::Bytes;
use futures::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, GetResultPayload, ObjectStore};

/// `range` of `file`, read into a buffer that is not initialized first (`read_to_end` hands the
/// kernel the vector's spare capacity); an error, as `LocalFileSystem` gives, where the file
/// ends first.
fn read_range(mut file: &File, path: &FsPath, range: Range<u64>) -> object_store::Result<Bytes> {
    let failed = |source: std::io::Error| object_store::Error::Generic { store: "local files", source: format!("reading {}: {source}", path.display()).into() };
    let wanted = range.end - range.start;
    let mut buffer = Vec::with_capacity(wanted as usize);
    file.seek(SeekFrom::Start(range.start)).map_err(failed)?;
    file.take(wanted).read_to_end(&mut buffer).map_err(failed)?;
    if buffer.len() as u64 != wanted {
        let reason = format!("{}: asked for bytes {}..{}, the file ends at byte {}", path.display(), range.start, range.end, range.start + buffer.len() as u64);
        return Err(object_store::Error::Generic { store: "local files", source: reason.into() });
    }
    Ok(buffer.into())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> object_store::Result<T> + Send + 'static) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| object_store::Error::Generic { store: "local files", source: Box::new(e) })?
}

/// `LocalFileSystem::get_opts` (metadata, preconditions, range checks), a ranged read's bytes
/// read here; a whole file is left to stream as `LocalFileSystem` streams it.
pub async fn get_opts(files: &LocalFileSystem, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
    let ranged = options.range.is_some() && !options.head;
    let GetResult { payload, meta, range, attributes } = files.get_opts(location, options).await?;
    let payload = match payload {
        GetResultPayload::File(file, path) if ranged => {
            let wanted = range.clone();
            let data = blocking(move || read_range(&file, &path, wanted)).await?;
            GetResultPayload::Stream(futures::stream::once(async move { Ok(data) }).boxed())
        }
        other => other,
    };
    Ok(GetResult { payload, meta, range, attributes })
}

/// `LocalFileSystem::get_ranges`, the file read here.
pub async fn get_ranges(files: &LocalFileSystem, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
    let path = files.path_to_filesystem(location)?;
    let ranges = ranges.to_vec();
    blocking(move || {
        let file = File::open(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => object_store::Error::NotFound { path: path.display().to_string(), source: Box::new(source) },
            _ => object_store::Error::Generic { store: "local files", source: format!("opening {}: {source}", path.display()).into() },
        })?;
        ranges.into_iter().map(|range| read_range(&file, &path, range)).collect()
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranged reads return the file's bytes, through both paths; a range past the end fails.
    #[tokio::test]
    async fn ranged_reads_return_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("f.bin"), &data).unwrap();
        let files = LocalFileSystem::new();
        let path = Path::from_filesystem_path(dir.path().join("f.bin")).unwrap();
        let ranged = |range: Range<u64>| GetOptions { range: Some(range.into()), ..Default::default() };
        let read = get_opts(&files, &path, ranged(5..70_000)).await.unwrap();
        assert!(matches!(read.payload, GetResultPayload::Stream(_)), "read here, not by object_store");
        assert_eq!(read.bytes().await.unwrap().as_ref(), &data[5..70_000]);
        assert_eq!(get_opts(&files, &path, GetOptions::default()).await.unwrap().bytes().await.unwrap().as_ref(), &data[..]);
        let ranges = get_ranges(&files, &path, &[0..1, 99_000..100_000, 10..10]).await.unwrap();
        assert_eq!(ranges.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), vec![data[0..1].to_vec(), data[99_000..].to_vec(), vec![]]);
        assert!(get_ranges(&files, &path, &[99_000..100_001]).await.is_err(), "a range past the end");
        let missing = Path::from_filesystem_path(dir.path()).unwrap().join("missing");
        assert!(get_ranges(&files, &missing, &[0..1]).await.is_err());
    }
}
