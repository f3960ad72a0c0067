//! `--files-from`'s list as it travels with a session's options (issue 36):
//! millions of paths in one buffer, not one heap allocation each, and
//! shared by every clone of the options.

use std::fmt;
use std::sync::Arc;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Paths back to back in one buffer, each ending at a 4-byte offset: a
/// path costs its bytes and 4 more (a `Vec<Vec<u8>>` costs ~56 a line).
/// Clones share the buffer; a change copies it first. Encoded exactly as
/// a `Vec<Vec<u8>>` (a sequence of byte sequences), so the wire and any
/// JSON of a [`super::Selection`] keep their shape.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PathList(Arc<Packed>);

#[derive(Clone, Default, PartialEq, Eq)]
struct Packed {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

/// A list past 4 GiB of path bytes (the offsets are 32-bit; a daemon's
/// per-session budget refuses far smaller lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathListFull;

impl fmt::Display for PathListFull {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the list is over 4 GiB")
    }
}

impl PathList {
    pub fn len(&self) -> usize {
        self.0.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.ends.is_empty()
    }

    /// Bytes of path held (what a budget counts).
    pub fn byte_len(&self) -> usize {
        self.0.bytes.len()
    }

    pub fn get(&self, i: usize) -> &[u8] {
        let p = &self.0;
        let start = if i == 0 { 0 } else { p.ends[i - 1] as usize };
        &p.bytes[start..p.ends[i] as usize]
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + Clone + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    pub fn push(&mut self, path: &[u8]) -> Result<(), PathListFull> {
        let p = Arc::make_mut(&mut self.0);
        let end = u32::try_from(p.bytes.len() + path.len()).map_err(|_| PathListFull)?;
        p.bytes.extend_from_slice(path);
        p.ends.push(end);
        Ok(())
    }

    /// Every path of `other` after these.
    pub fn extend(&mut self, other: &PathList) -> Result<(), PathListFull> {
        other.iter().try_for_each(|q| self.push(q))
    }

    /// Give back spare capacity (a list read line by line).
    pub fn shrink_to_fit(&mut self) {
        let p = Arc::make_mut(&mut self.0);
        p.bytes.shrink_to_fit();
        p.ends.shrink_to_fit();
    }
}

impl From<Vec<Vec<u8>>> for PathList {
    /// Panics past 4 GiB of paths: for lists built in code and tests.
    fn from(v: Vec<Vec<u8>>) -> PathList {
        let mut l = PathList::default();
        for p in &v {
            l.push(p).expect("a path list under 4 GiB");
        }
        l
    }
}

impl fmt::Debug for PathList {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(String::from_utf8_lossy))
            .finish()
    }
}

impl Serialize for PathList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Each path as Vec<u8> serializes: a sequence of u8.
        struct Seq<'a>(&'a [u8]);
        impl Serialize for Seq<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0)
            }
        }
        s.collect_seq(self.iter().map(Seq))
    }
}

impl<'de> Deserialize<'de> for PathList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PathList, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PathList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence of paths")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PathList, A::Error> {
                let mut l = PathList::default();
                // One path at a time through a reused buffer: the list
                // grows by its bytes only.
                while let Some(p) = seq.next_element::<Vec<u8>>()? {
                    l.push(&p).map_err(serde::de::Error::custom)?;
                }
                l.shrink_to_fit();
                Ok(l)
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_a_list_of_byte_strings() {
        let v = vec![b"a/b".to_vec(), Vec::new(), b"\xffc".to_vec()];
        let l = PathList::from(v.clone());
        assert_eq!(l.len(), 3);
        assert_eq!(
            l.iter().collect::<Vec<_>>(),
            v.iter().map(Vec::as_slice).collect::<Vec<_>>()
        );
        let wire = postcard::to_allocvec(&l).unwrap();
        assert_eq!(wire, postcard::to_allocvec(&v).unwrap());
        assert_eq!(postcard::from_bytes::<PathList>(&wire).unwrap(), l);
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            serde_json::to_string(&v).unwrap()
        );
    }

    #[test]
    fn clones_share_until_changed() {
        let mut a = PathList::from(vec![b"x".to_vec()]);
        let b = a.clone();
        assert!(Arc::ptr_eq(&a.0, &b.0));
        a.push(b"y").unwrap();
        assert_eq!((a.len(), b.len()), (2, 1));
    }
}
