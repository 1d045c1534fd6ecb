//! RFC 8785 canonical JSON of a jsonb value read from its binary form (PostgreSQL's
//! `JsonbContainer`, src/include/utils/jsonb.h), written in canonical order straight into a
//! `Writer` by `write_tree`: no text form, no second parse, no copy of the strings, no call
//! into the server per element. Pure Rust over bytes; only numbers need the server (numeric's own format),
//! so the caller formats them. Strings are UTF-8 bytes, as in a UTF-8 database (the caller
//! sees to the encoding), and go to the writer unchecked.
//!
//! A container is a header word (count and kind), one JEntry word per child (an object's
//! keys first, then its values), then the children's data. A JEntry holds the child's kind
//! and either its length or, every JB_OFFSET_STRIDE children, its end offset; numbers and
//! nested containers start at the next 4-byte boundary of the data.

use super::writer::{sort_members, write_tree, Tree, Visit, Writer};
use super::CanonError;

const JB_CMASK: u32 = 0x0fff_ffff;
const JB_FSCALAR: u32 = 0x1000_0000;
const JB_FOBJECT: u32 = 0x2000_0000;
const JENTRY_OFFLENMASK: u32 = 0x0fff_ffff;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JENTRY_ISSTRING: u32 = 0x0000_0000;
const JENTRY_ISNUMERIC: u32 = 0x1000_0000;
const JENTRY_ISBOOL_FALSE: u32 = 0x2000_0000;
const JENTRY_ISBOOL_TRUE: u32 = 0x3000_0000;
const JENTRY_ISNULL: u32 = 0x4000_0000;
const JENTRY_ISCONTAINER: u32 = 0x5000_0000;

/// Writes a numeric datum's canonical text (the caller's: numbers need the server).
/// One child of a container.
#[derive(Clone, Copy)]
enum Item<'a> {
    String(&'a [u8]),
    /// A numeric datum (varlena), as stored.
    Numeric(&'a [u8]),
    Bool(bool),
    Null,
    Container(&'a [u8]),
}

/// Writes the canonical text of the jsonb whose root container is `root` (the bytes after
/// the varlena header), leaving out the top-level keys in `ignore`. `number` writes a
/// numeric datum's canonical text (numbers need the server's numeric formatting).
pub fn write_jsonb<F>(root: &[u8], ignore: &[&str], w: &mut Writer, number: F) -> Result<(), CanonError>
where
    F: FnMut(&[u8], &mut Writer) -> Result<(), CanonError>,
{
    write_tree(&mut Binary { ignore, number }, Item::Container(root), w)
}

struct Binary<'a, F> {
    ignore: &'a [&'a str],
    number: F,
}

impl<'a, F> Tree for Binary<'a, F>
where
    F: FnMut(&[u8], &mut Writer) -> Result<(), CanonError>,
{
    type Node = Item<'a>;
    type Key = &'a [u8];
    type Elements = Children<'a>;

    fn visit(
        &mut self,
        node: Item<'a>,
        depth: usize,
        w: &mut Writer,
    ) -> Result<Visit<Children<'a>, &'a [u8], Item<'a>>, CanonError> {
        let container = match node {
            Item::Container(bytes) => bytes,
            scalar => {
                self.scalar(scalar, w)?;
                return Ok(Visit::Written);
            }
        };
        let (header, mut children) = Children::of(container)?;
        if depth == 0 && header & JB_FSCALAR != 0 {
            // A scalar is stored as an array of one element.
            let item = children.next_item()?.ok_or(CanonError::CorruptJsonb)?;
            self.scalar(item, w)?;
            return Ok(Visit::Written);
        }
        if header & JB_FOBJECT == 0 {
            return Ok(Visit::Array(children));
        }
        let count = (header & JB_CMASK) as usize;
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            match children.next_item()? {
                Some(Item::String(key)) => keys.push(key),
                _ => return Err(CanonError::CorruptJsonb),
            }
        }
        let ignore = if depth == 0 { self.ignore } else { &[] };
        let mut members = Vec::with_capacity(count);
        for key in keys {
            let item = children.next_item()?.ok_or(CanonError::CorruptJsonb)?;
            if !ignore.iter().any(|ignored| ignored.as_bytes() == key) {
                members.push((key, item));
            }
        }
        sort_members(&mut members);
        Ok(Visit::Object(members))
    }
}

impl<F> Binary<'_, F>
where
    F: FnMut(&[u8], &mut Writer) -> Result<(), CanonError>,
{
    fn scalar(&mut self, item: Item<'_>, w: &mut Writer) -> Result<(), CanonError> {
        match item {
            Item::String(s) => w.string_bytes(s),
            Item::Numeric(datum) => (self.number)(datum, w)?,
            Item::Bool(b) => w.raw(if b { "true" } else { "false" }),
            Item::Null => w.raw("null"),
            Item::Container(_) => return Err(CanonError::CorruptJsonb),
        }
        Ok(())
    }
}

/// The children of a container, in stored order.
struct Children<'a> {
    entries: &'a [u8],
    data: &'a [u8],
    next: usize,
    offset: usize,
}

impl<'a> Children<'a> {
    /// The container's header and its children (2 × count for an object).
    fn of(container: &'a [u8]) -> Result<(u32, Children<'a>), CanonError> {
        let header = word(container, 0)?;
        let count = (header & JB_CMASK) as usize;
        let n = if header & JB_FOBJECT != 0 { 2 * count } else { count };
        let data_start = 4 + 4 * n;
        let (Some(entries), Some(data)) = (container.get(4..data_start), container.get(data_start..)) else {
            return Err(CanonError::CorruptJsonb);
        };
        Ok((header, Children { entries, data, next: 0, offset: 0 }))
    }

    fn next_item(&mut self) -> Result<Option<Item<'a>>, CanonError> {
        if 4 * self.next >= self.entries.len() {
            return Ok(None);
        }
        let entry = word(self.entries, 4 * self.next)?;
        self.next += 1;
        let start = self.offset;
        let end = if entry & JENTRY_HAS_OFF != 0 {
            (entry & JENTRY_OFFLENMASK) as usize
        } else {
            start + (entry & JENTRY_OFFLENMASK) as usize
        };
        self.offset = end;
        let aligned = (start + 3) & !3;
        let bytes = |from: usize| self.data.get(from..end).ok_or(CanonError::CorruptJsonb);
        Ok(Some(match entry & JENTRY_TYPEMASK {
            JENTRY_ISSTRING => Item::String(bytes(start)?),
            JENTRY_ISNUMERIC => Item::Numeric(bytes(aligned)?),
            JENTRY_ISBOOL_FALSE => Item::Bool(false),
            JENTRY_ISBOOL_TRUE => Item::Bool(true),
            JENTRY_ISNULL => Item::Null,
            JENTRY_ISCONTAINER => Item::Container(bytes(aligned)?),
            _ => return Err(CanonError::CorruptJsonb),
        }))
    }
}

fn word(bytes: &[u8], at: usize) -> Result<u32, CanonError> {
    let b = bytes.get(at..at + 4).ok_or(CanonError::CorruptJsonb)?;
    Ok(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

impl<'a> Iterator for Children<'a> {
    type Item = Result<Item<'a>, CanonError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_item().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container of `header` with the given JEntries and data.
    fn container(header: u32, entries: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = header.to_ne_bytes().to_vec();
        for e in entries {
            out.extend_from_slice(&e.to_ne_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    fn canonical(root: &[u8], ignore: &[&str]) -> Result<String, CanonError> {
        let mut w = Writer::keeping();
        write_jsonb(root, ignore, &mut w, |_, w| {
            w.raw("N");
            Ok(())
        })?;
        Ok(w.text())
    }

    #[test]
    fn object_members_come_out_sorted_nested_and_filtered() {
        // {"b": [true, null], "a": "x\n", "ts": false} as jsonb stores it: keys by length
        // then bytes ("a", "b", "ts"), values in the same order, the array aligned to 4.
        let array = container(0x4000_0000 | 2, &[JENTRY_ISBOOL_TRUE, JENTRY_ISNULL], &[]);
        let mut data = b"abts".to_vec(); // keys: 0..1, 1..2, 2..4
        data.extend_from_slice(b"x\n"); // "a"'s value: 4..6
        data.extend_from_slice(&[0, 0]); // padding to 8
        data.extend_from_slice(&array); // "b"'s value: 8..8+len
        let entries = [
            1,
            1,
            2,
            2,
            JENTRY_ISCONTAINER | (2 + array.len() as u32), // from 6, incl. the padding
            JENTRY_ISBOOL_FALSE,
        ];
        let root = container(JB_FOBJECT | 3, &entries, &data);
        assert_eq!(canonical(&root, &[]), Ok(r#"{"a":"x\n","b":[true,null],"ts":false}"#.into()));
        assert_eq!(canonical(&root, &["ts", "a"]), Ok(r#"{"b":[true,null]}"#.into()));
    }

    #[test]
    fn scalars_numbers_and_offsets() {
        // A scalar root: an array of one element flagged scalar.
        let root = container(0x4000_0000 | JB_FSCALAR | 1, &[JENTRY_ISNUMERIC | 4], &[9, 9, 9, 9]);
        assert_eq!(canonical(&root, &[]), Ok("N".into()));
        // An array whose second entry gives its end offset rather than its length.
        let root = container(0x4000_0000 | 2, &[1, JENTRY_HAS_OFF | 3], b"abc");
        assert_eq!(canonical(&root, &[]), Ok(r#"["a","bc"]"#.into()));
    }

    #[test]
    fn corrupt_bytes_are_an_error_not_a_panic() {
        let root = container(0x4000_0000 | 2, &[1, JENTRY_HAS_OFF | 3], b"abc");
        for cut in 0..root.len() {
            assert_eq!(canonical(&root[..cut], &[]), Err(CanonError::CorruptJsonb), "cut at {cut}");
        }
        // An unknown entry type, and an object key that is not a string.
        assert_eq!(
            canonical(&container(0x4000_0000 | 1, &[0x6000_0000], &[]), &[]),
            Err(CanonError::CorruptJsonb)
        );
        assert_eq!(
            canonical(&container(JB_FOBJECT | 1, &[JENTRY_ISNULL, JENTRY_ISNULL], &[]), &[]),
            Err(CanonError::CorruptJsonb)
        );
    }
}
