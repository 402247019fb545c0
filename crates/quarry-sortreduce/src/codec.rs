//! Fixed-width little-endian encodings of keys and values.
//!
//! Run files store records as `key bytes ++ value bytes` with no framing, so every type used as a
//! key or value has a constant encoded width ([`Key::WIDTH`], [`Value::WIDTH`]). The paper's
//! hardware packs fields to the bit (sec. 9.5.2); GraFSoft, like this crate, keeps byte widths
//! because unpacking costs more CPU than the bandwidth it saves in software (sec. 9.6).

use std::fmt::Debug;

/// A sort key: totally ordered, fixed-width, little-endian encoded.
///
/// The order of run files is the order of [`Ord`] on the decoded key, never the order of the
/// encoded bytes, so signed keys are fine.
pub trait Key: Copy + Ord + Send + Sync + Debug + 'static {
    /// Encoded width in bytes (at least 1).
    const WIDTH: usize;
    /// Writes exactly [`Self::WIDTH`] bytes to `out[..WIDTH]`.
    fn encode(self, out: &mut [u8]);
    /// Reads a key from `bytes[..WIDTH]`.
    fn decode(bytes: &[u8]) -> Self;
}

/// A value carried with a key and combined by the reduce function; fixed-width encoded.
pub trait Value: Copy + Send + Sync + Debug + 'static {
    /// Encoded width in bytes (0 for `()`, which turns sort-reduce into sort-unique).
    const WIDTH: usize;
    /// Writes exactly [`Self::WIDTH`] bytes to `out[..WIDTH]`.
    fn encode(self, out: &mut [u8]);
    /// Reads a value from `bytes[..WIDTH]`.
    fn decode(bytes: &[u8]) -> Self;
}

macro_rules! le_codec {
    ($trait:ident: $($t:ty),*) => {$(
        impl $trait for $t {
            const WIDTH: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn encode(self, out: &mut [u8]) {
                out[..<$t as $trait>::WIDTH].copy_from_slice(&self.to_le_bytes());
            }
            #[inline(always)]
            fn decode(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(&bytes[..<$t as $trait>::WIDTH]);
                <$t>::from_le_bytes(raw)
            }
        }
    )*};
}

le_codec!(Key: u16, u32, u64, i32, i64);
le_codec!(Value: u8, u16, u32, u64, i32, i64, f32, f64);

impl Value for () {
    const WIDTH: usize = 0;
    #[inline(always)]
    fn encode(self, _out: &mut [u8]) {}
    #[inline(always)]
    fn decode(_bytes: &[u8]) -> Self {}
}

/// Pairs, e.g. `(depth, parent)` for BFS or `(distance, predecessor)` for shortest paths; the
/// reduce function decides how pairs combine (often lexicographic `min`).
impl<A: Value, B: Value> Value for (A, B) {
    const WIDTH: usize = A::WIDTH + B::WIDTH;
    #[inline(always)]
    fn encode(self, out: &mut [u8]) {
        self.0.encode(&mut out[..A::WIDTH]);
        self.1.encode(&mut out[A::WIDTH..A::WIDTH + B::WIDTH]);
    }
    #[inline(always)]
    fn decode(bytes: &[u8]) -> Self {
        (
            A::decode(&bytes[..A::WIDTH]),
            B::decode(&bytes[A::WIDTH..A::WIDTH + B::WIDTH]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_roundtrip<K: Key>(k: K) {
        let mut buf = vec![0u8; K::WIDTH];
        k.encode(&mut buf);
        assert_eq!(K::decode(&buf), k);
    }

    fn value_roundtrip<V: Value + PartialEq>(v: V) {
        let mut buf = vec![0u8; V::WIDTH];
        v.encode(&mut buf);
        assert_eq!(V::decode(&buf), v);
    }

    #[test]
    fn widths_and_roundtrips() {
        assert_eq!(<u32 as Key>::WIDTH, 4);
        assert_eq!(<u64 as Key>::WIDTH, 8);
        assert_eq!(<(u32, u64) as Value>::WIDTH, 12);
        assert_eq!(<() as Value>::WIDTH, 0);
        for k in [0u32, 1, 0xdead_beef, u32::MAX] {
            key_roundtrip(k);
        }
        for k in [0u64, 1, u64::MAX, 1 << 40] {
            key_roundtrip(k);
        }
        key_roundtrip(-5i64);
        value_roundtrip(3.25f32);
        value_roundtrip(-1e300f64);
        value_roundtrip((7u32, u32::MAX));
        value_roundtrip((u64::MAX, 2.5f64));
        value_roundtrip(());
        // Little-endian on every platform.
        let mut buf = [0u8; 4];
        Key::encode(0x0102_0304u32, &mut buf);
        assert_eq!(buf, [4, 3, 2, 1]);
    }
}
