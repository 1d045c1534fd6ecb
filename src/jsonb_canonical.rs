//! RFC 8785 canonical JSON of a jsonb value read from its binary form (PostgreSQL's
//! `JsonbContainer`, src/include/utils/jsonb.h), written in canonical order straight into a
//! `Writer`: no text form, no second parse, no copy of the strings, no call into the server
//! per element. Pure Rust over bytes; only numbers need the server (numeric's own format),
//! so the caller formats them. Strings are UTF-8 bytes, as in a UTF-8 database (the caller
//! sees to the encoding), and go to the writer unchecked.
//!
//! A container is a header word (count and kind), one JEntry word per child (an object's
//! keys first, then its values), then the children's data. A JEntry holds the child's kind
//! and either its length or, every JB_OFFSET_STRIDE children, its end offset; numbers and
//! nested containers start at the next 4-byte boundary of the data.

use crate::canonical_json::{self, CanonError, Writer};

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
pub type NumberWriter<'a, 'f> = &'f mut dyn FnMut(&'a [u8], &mut Writer) -> Result<(), CanonError>;

/// One child of a container.
#[derive(Clone, Copy)]
pub enum Item<'a> {
    String(&'a [u8]),
    /// A numeric datum (varlena), as stored.
    Numeric(&'a [u8]),
    Bool(bool),
    Null,
    Container(&'a [u8]),
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

    fn next(&mut self) -> Result<Option<Item<'a>>, CanonError> {
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

/// A container being written: an array's elements are read as they are written; an
/// object's members were read and sorted when it was opened.
enum Open<'a> {
    Array { children: Children<'a>, first: bool },
    Object { members: std::vec::IntoIter<(&'a [u8], Item<'a>)>, first: bool },
}

/// Writes the canonical text of the jsonb whose root container is `root` (the bytes after
/// the varlena header), leaving out the top-level keys in `ignore`. `number` writes a
/// numeric datum's canonical text.
pub fn write<'a>(
    root: &'a [u8],
    ignore: &[&str],
    w: &mut Writer,
    number: NumberWriter<'a, '_>,
) -> Result<(), CanonError> {
    let (header, mut children) = Children::of(root)?;
    if header & JB_FSCALAR != 0 {
        // A scalar is stored as an array of one element.
        let item = children.next()?.ok_or(CanonError::CorruptJsonb)?;
        return write_scalar(item, w, number);
    }
    let mut stack: Vec<Open<'a>> = Vec::new();
    open(root, ignore, w, &mut stack)?;
    while let Some(top) = stack.last_mut() {
        let item = match top {
            Open::Array { children, first } => match children.next()? {
                Some(item) => {
                    if !std::mem::replace(first, false) {
                        w.raw(",");
                    }
                    item
                }
                None => {
                    w.raw("]");
                    stack.pop();
                    continue;
                }
            },
            Open::Object { members, first } => match members.next() {
                Some((key, item)) => {
                    if !std::mem::replace(first, false) {
                        w.raw(",");
                    }
                    w.string_bytes(key);
                    w.raw(":");
                    item
                }
                None => {
                    w.raw("}");
                    stack.pop();
                    continue;
                }
            },
        };
        match item {
            Item::Container(bytes) => open(bytes, &[], w, &mut stack)?,
            scalar => write_scalar(scalar, w, number)?,
        }
    }
    Ok(())
}

/// Writes the opening of a container and pushes it. `ignore`: keys to leave out of it.
fn open<'a>(
    container: &'a [u8],
    ignore: &[&str],
    w: &mut Writer,
    stack: &mut Vec<Open<'a>>,
) -> Result<(), CanonError> {
    if stack.len() >= canonical_json::MAX_DEPTH {
        return Err(CanonError::TooDeep);
    }
    let (header, mut children) = Children::of(container)?;
    if header & JB_FOBJECT == 0 {
        w.raw("[");
        stack.push(Open::Array { children, first: true });
        return Ok(());
    }
    let count = (header & JB_CMASK) as usize;
    let mut keys = Vec::with_capacity(count);
    for _ in 0..count {
        match children.next()? {
            Some(Item::String(key)) => keys.push(key),
            _ => return Err(CanonError::CorruptJsonb),
        }
    }
    let mut members = Vec::with_capacity(count);
    for key in keys {
        let item = children.next()?.ok_or(CanonError::CorruptJsonb)?;
        if !ignore.iter().any(|ignored| ignored.as_bytes() == key) {
            members.push((key, item));
        }
    }
    canonical_json::sort_members(&mut members);
    w.raw("{");
    stack.push(Open::Object { members: members.into_iter(), first: true });
    Ok(())
}

fn write_scalar<'a>(
    item: Item<'a>,
    w: &mut Writer,
    number: NumberWriter<'a, '_>,
) -> Result<(), CanonError> {
    match item {
        Item::String(s) => w.string_bytes(s),
        Item::Numeric(datum) => number(datum, w)?,
        Item::Bool(b) => w.raw(if b { "true" } else { "false" }),
        Item::Null => w.raw("null"),
        Item::Container(_) => return Err(CanonError::CorruptJsonb),
    }
    Ok(())
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
        let mut w = Writer::new(false);
        write(root, ignore, &mut w, &mut |_, w| {
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
        assert_eq!(canonical(&container(0x4000_0000 | 1, &[0x6000_0000], &[]), &[]), Err(CanonError::CorruptJsonb));
        assert_eq!(
            canonical(&container(JB_FOBJECT | 1, &[JENTRY_ISNULL, JENTRY_ISNULL], &[]), &[]),
            Err(CanonError::CorruptJsonb)
        );
    }
}
