//! A small binary format for the star join's tables in a fragment: little-endian numbers and
//! length-prefixed arrays. The reader trusts nothing: every read is bounds-checked and a length
//! can never ask for more than the bytes that remain.

use datafusion::common::{Result, plan_err};

/// Writes the format.
#[derive(Debug, Default)]
pub struct WireWriter {
    buf: Vec<u8>,
}

impl WireWriter {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.buf.extend_from_slice(v);
    }
    pub fn u32s(&mut self, v: &[u32]) {
        self.u64(v.len() as u64);
        v.iter().for_each(|x| self.u32(*x));
    }
    pub fn i64s(&mut self, v: &[i64]) {
        self.u64(v.len() as u64);
        v.iter().for_each(|x| self.i64(*x));
    }
    pub fn u64s(&mut self, v: &[u64]) {
        self.u64(v.len() as u64);
        v.iter().for_each(|x| self.u64(*x));
    }
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads the format from untrusted bytes.
#[derive(Debug)]
pub struct WireReader<'a> {
    buf: &'a [u8],
}

impl<'a> WireReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        WireReader { buf }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.buf.len() {
            return plan_err!("fragment: star join tables end early");
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A count of items that are each at least one byte: never more than the bytes left.
    pub fn len_prefix(&mut self) -> Result<usize> {
        let n = self.u64()?;
        if n > self.buf.len() as u64 {
            return plan_err!("fragment: star join tables claim {n} items in {} bytes", self.buf.len());
        }
        Ok(n as usize)
    }

    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len_prefix()?;
        self.take(n)
    }
    pub fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.len_prefix()?;
        Ok(self.take(n.checked_mul(4).unwrap_or(usize::MAX))?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
    }
    pub fn i64s(&mut self) -> Result<Vec<i64>> {
        Ok(self.u64s()?.into_iter().map(|v| v as i64).collect())
    }
    pub fn u64s(&mut self) -> Result<Vec<u64>> {
        let n = self.len_prefix()?;
        Ok(self.take(n.checked_mul(8).unwrap_or(usize::MAX))?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    /// Whether every byte was read.
    pub fn is_done(&self) -> bool {
        self.buf.is_empty()
    }
}
