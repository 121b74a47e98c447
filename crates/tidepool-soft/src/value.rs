//! How values of the soft data structures become bytes and back.

/// A value a soft structure can store: encoded into bytes when written, decoded when read.
/// Decoding returns `None` for bytes that are not a valid encoding (they never come from soft
/// memory torn: reads are validated first; this only guards against a changed type).
pub trait SoftValue: Sized {
    /// Appends the encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Rebuilds a value from its encoding.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

macro_rules! numbers {
    ($($t:ty),*) => {$(
        impl SoftValue for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_le_bytes(bytes.try_into().ok()?))
            }
        }
    )*};
}
numbers!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);

impl SoftValue for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0] => Some(false),
            [1] => Some(true),
            _ => None,
        }
    }
}

impl SoftValue for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

impl SoftValue for Box<[u8]> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.into())
    }
}

impl SoftValue for String {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl<const N: usize> SoftValue for [u8; N] {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok()
    }
}

/// A pair: the first value's encoding is prefixed with its length (4 bytes).
impl<A: SoftValue, B: SoftValue> SoftValue for (A, B) {
    fn encode(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        self.0.encode(out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.1.encode(out);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let a = A::decode(bytes.get(4..4 + len)?)?;
        let b = B::decode(bytes.get(4 + len..)?)?;
        Some((a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round<T: SoftValue + PartialEq + std::fmt::Debug>(v: T) {
        let mut b = Vec::new();
        v.encode(&mut b);
        assert_eq!(T::decode(&b), Some(v));
    }

    #[test]
    fn values_round_trip() {
        round(7u64);
        round(-3i32);
        round(1.5f64);
        round(true);
        round(b"abc".to_vec());
        round("héllo".to_string());
        round([1u8, 2, 3]);
        round((5u32, "x".to_string()));
        round(("key".to_string(), (1u8, vec![9u8; 100])));
        assert_eq!(u64::decode(&[1, 2]), None);
        assert_eq!(bool::decode(&[2]), None);
        assert_eq!(<(u8, u8)>::decode(&[9, 0, 0, 0, 1]), None);
    }
}
