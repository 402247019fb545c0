//! Block checksums of segment files: a CRC-32C of every 64 KiB block, computed as the file is
//! written and recorded in its manifest entry, so that any read can be verified (Ceph's
//! BlueStore checksums blocks the same way) and `quarry scrub` can find damage without a query.
//!
//! A read of any byte range verifies the whole blocks that cover it: a reader of part of a
//! block reads all of it (at most 64 KiB more on each side of a range).

use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes per checksummed block.
pub const CHECKSUM_BLOCK_BYTES: u64 = 64 * 1024;

/// The CRC-32C of each block of a file, in order; the last block may be short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockChecksums {
    /// Bytes per block (every block but the last).
    pub block_bytes: u64,
    /// One CRC-32C per block, stored as base64 of their little-endian bytes.
    #[serde(serialize_with = "crcs_to_base64", deserialize_with = "crcs_from_base64")]
    pub crc32c: Vec<u32>,
}

/// A block whose bytes do not match their checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    /// Byte range of the block in the file.
    pub bytes: Range<u64>,
}

impl BlockChecksums {
    /// The checksums of `data`, a whole file.
    pub fn of_bytes(data: &[u8]) -> Self {
        let mut writer = ChecksumWriter::new(io::sink());
        writer.write_all(data).expect("writing to a sink cannot fail");
        writer.finish().1
    }

    /// The checksums of the file at `path`, read front to back.
    pub fn of_file(path: &Path) -> io::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        let mut writer = ChecksumWriter::new(io::sink());
        io::copy(&mut file, &mut writer)?;
        Ok(writer.finish().1)
    }

    /// Whether these checksums can describe a file of `size` bytes (one per block of it).
    pub fn covers(&self, size: u64) -> bool {
        self.block_bytes > 0 && size.div_ceil(self.block_bytes) == self.crc32c.len() as u64
    }

    /// The smallest block-aligned range of a file of `size` bytes that contains `range`.
    pub fn aligned(&self, range: Range<u64>, size: u64) -> Range<u64> {
        let start = range.start / self.block_bytes * self.block_bytes;
        let end = range.end.div_ceil(self.block_bytes).saturating_mul(self.block_bytes).min(size);
        start..end.max(start)
    }

    /// Verifies `data`, the bytes of the file from `start` (block-aligned) on, which end at a
    /// block boundary or at the end of a file of `size` bytes; the first damaged block if any.
    pub fn verify(&self, start: u64, data: &[u8], size: u64) -> Result<(), DamagedBlock> {
        debug_assert_eq!(start % self.block_bytes, 0, "verify reads from a block boundary");
        let first = (start / self.block_bytes) as usize;
        for (i, block) in data.chunks(self.block_bytes as usize).enumerate() {
            let at = start + i as u64 * self.block_bytes;
            let bytes = at..at + block.len() as u64;
            let whole = block.len() as u64 == self.block_bytes || bytes.end == size;
            match self.crc32c.get(first + i) {
                Some(&expected) if whole && crc32c::crc32c(block) == expected => {}
                _ => return Err(DamagedBlock { bytes }),
            }
        }
        Ok(())
    }

    /// Verifies a whole file read from `reader`, `size` bytes long: every damaged block, or an
    /// error reading it. A file whose length differs from `size` is damaged from where they part.
    pub fn verify_reader(&self, mut reader: impl Read, size: u64) -> io::Result<Vec<DamagedBlock>> {
        let mut damaged = Vec::new();
        let mut block = vec![0u8; self.block_bytes as usize];
        let mut at = 0u64;
        loop {
            let mut filled = 0;
            while filled < block.len() {
                match reader.read(&mut block[filled..])? {
                    0 => break,
                    n => filled += n,
                }
            }
            if filled == 0 {
                break;
            }
            if let Err(bad) = self.verify(at, &block[..filled], size) {
                damaged.push(bad);
            }
            at += filled as u64;
        }
        if at != size {
            damaged.push(DamagedBlock { bytes: at.min(size)..at.max(size) });
        }
        Ok(damaged)
    }
}

/// A writer that passes bytes through and checksums them block by block.
pub struct ChecksumWriter<W> {
    inner: W,
    crc: u32,
    in_block: u64,
    crcs: Vec<u32>,
}

impl<W> ChecksumWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        ChecksumWriter { inner, crc: 0, in_block: 0, crcs: Vec::new() }
    }

    /// The writer inside.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The checksums of everything written so far (the last block may be short).
    pub fn checksums(&self) -> BlockChecksums {
        let mut crcs = self.crcs.clone();
        if self.in_block > 0 {
            crcs.push(self.crc);
        }
        BlockChecksums { block_bytes: CHECKSUM_BLOCK_BYTES, crc32c: crcs }
    }

    /// The writer inside and the checksums of everything written.
    pub fn finish(self) -> (W, BlockChecksums) {
        let checksums = self.checksums();
        (self.inner, checksums)
    }
}

impl<W: Write> Write for ChecksumWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        let mut rest = &buf[..written];
        while !rest.is_empty() {
            let take = rest.len().min((CHECKSUM_BLOCK_BYTES - self.in_block) as usize);
            self.crc = crc32c::crc32c_append(self.crc, &rest[..take]);
            self.in_block += take as u64;
            rest = &rest[take..];
            if self.in_block == CHECKSUM_BLOCK_BYTES {
                self.crcs.push(self.crc);
                (self.crc, self.in_block) = (0, 0);
            }
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn crcs_to_base64<S: Serializer>(crcs: &[u32], serializer: S) -> Result<S::Ok, S::Error> {
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    serializer.serialize_str(&BASE64.encode(bytes))
}

fn crcs_from_base64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u32>, D::Error> {
    let text = String::deserialize(deserializer)?;
    let bytes = BASE64.decode(text.as_bytes()).map_err(serde::de::Error::custom)?;
    if bytes.len() % 4 != 0 {
        return Err(serde::de::Error::custom("block checksums are not a whole number of CRC-32C values"));
    }
    Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn writer_and_whole_file_agree_at_every_length() {
        let block = CHECKSUM_BLOCK_BYTES as usize;
        for len in [0, 1, block - 1, block, block + 1, 3 * block + 17] {
            let bytes = data(len);
            let mut writer = ChecksumWriter::new(Vec::new());
            // Written in uneven pieces, as a buffered writer would.
            for piece in bytes.chunks(7919) {
                writer.write_all(piece).unwrap();
            }
            let (written, sums) = writer.finish();
            assert_eq!(written, bytes);
            assert_eq!(sums, BlockChecksums::of_bytes(&bytes));
            assert_eq!(sums.crc32c.len(), len.div_ceil(block));
            assert!(sums.covers(len as u64));
            assert_eq!(sums.verify(0, &bytes, len as u64), Ok(()));
            let json = serde_json::to_string(&sums).unwrap();
            assert_eq!(serde_json::from_str::<BlockChecksums>(&json).unwrap(), sums);
        }
    }

    #[test]
    fn a_flipped_bit_names_its_block() {
        let block = CHECKSUM_BLOCK_BYTES;
        let mut bytes = data(3 * block as usize + 100);
        let size = bytes.len() as u64;
        let sums = BlockChecksums::of_bytes(&bytes);
        bytes[(block + 5) as usize] ^= 0x10;
        assert_eq!(sums.verify(0, &bytes, size), Err(DamagedBlock { bytes: block..2 * block }));
        // A read of the blocks after it passes; a read covering it fails.
        assert_eq!(sums.verify(2 * block, &bytes[2 * block as usize..], size), Ok(()));
        let range = sums.aligned(block + 1..block + 2, size);
        assert_eq!(range, block..2 * block);
        assert!(sums.verify(range.start, &bytes[range.start as usize..range.end as usize], size).is_err());
        assert_eq!(sums.verify_reader(&bytes[..], size).unwrap(), vec![DamagedBlock { bytes: block..2 * block }]);
        // A truncated file is damaged from where it ends.
        let clean = data(size as usize);
        let damaged = sums.verify_reader(&clean[..(2 * block) as usize], size).unwrap();
        assert_eq!(damaged, vec![DamagedBlock { bytes: 2 * block..size }]);
    }

    #[test]
    fn aligned_ranges_cover_the_request_within_the_file() {
        let sums = BlockChecksums { block_bytes: 10, crc32c: vec![0; 3] };
        assert_eq!(sums.aligned(0..1, 25), 0..10);
        assert_eq!(sums.aligned(9..11, 25), 0..20);
        assert_eq!(sums.aligned(21..25, 25), 20..25);
        assert_eq!(sums.aligned(20..20, 25), 20..20);
    }
}
