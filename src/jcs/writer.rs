//! The one output path of canonical JSON: `Writer` for the pieces, `write_tree` for a whole
//! value walked in canonical order.

use sha2::{Digest, Sha256};

use super::{number, CanonError, MAX_DEPTH};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Bytes of canonical text gathered before they go to the hasher.
const HASH_CHUNK: usize = 16 * 1024;

/// "sha256:" + 64 lower-case hex digits of the bytes.
pub fn sha256_tagged(bytes: &[u8]) -> String {
    tagged(Sha256::digest(bytes).as_slice())
}

fn tagged(digest: &[u8]) -> String {
    let mut out = String::with_capacity(7 + 2 * digest.len());
    out.push_str("sha256:");
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Canonical JSON written piece by piece, in canonical order, and either hashed as it is
/// written (the text is never held whole) or kept.
pub struct Writer {
    out: Vec<u8>,
    /// Where numbers are formatted before they are appended to `out`.
    number: String,
    hasher: Option<Sha256>,
}

impl Writer {
    /// A writer that hashes what it is given: finish with `fingerprint`.
    pub fn hashing() -> Self {
        Writer {
            out: Vec::with_capacity(HASH_CHUNK + 1024),
            number: String::new(),
            hasher: Some(Sha256::new()),
        }
    }

    /// A writer that keeps the text: finish with `text`. For the tests.
    #[cfg(any(test, feature = "pg_test"))]
    pub fn keeping() -> Self {
        Writer { out: Vec::with_capacity(256), number: String::new(), hasher: None }
    }

    /// Punctuation and literals, written as they are: `[`, `,`, `true`, `null` ...
    pub fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// A string given as its UTF-8 bytes (not checked: bytes that are not UTF-8 are
    /// written as they are).
    pub fn string_bytes(&mut self, s: &[u8]) {
        write_string_bytes(s, &mut self.out);
        self.flush_full();
    }

    /// A number given as JSON number text (numeric_normalize's, or any).
    pub fn number(&mut self, text: &str) -> Result<(), CanonError> {
        let bytes = text.as_bytes();
        let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
        if !digits.is_empty()
            && digits.len() <= 15
            && digits.iter().all(u8::is_ascii_digit)
            && digits[0] != b'0'
        {
            // An integer below 10^15 without a leading zero is its own canonical form.
            self.out.extend_from_slice(bytes);
            return Ok(());
        }
        self.number.clear();
        number::write_number_text(text, &mut self.number)?;
        self.out.extend_from_slice(self.number.as_bytes());
        Ok(())
    }

    /// "sha256:" + hex of everything written (a hashing writer).
    pub fn fingerprint(mut self) -> String {
        let mut hasher = self.hasher.take().unwrap_or_default();
        hasher.update(&self.out);
        tagged(hasher.finalize().as_slice())
    }

    /// Everything written (a keeping writer), which is UTF-8 when the strings given were.
    #[cfg(any(test, feature = "pg_test"))]
    pub fn text(self) -> String {
        String::from_utf8(self.out).expect("valid UTF-8 in, valid UTF-8 out")
    }

    fn flush_full(&mut self) {
        if self.out.len() >= HASH_CHUNK {
            if let Some(hasher) = &mut self.hasher {
                hasher.update(&self.out);
                self.out.clear();
            }
        }
    }
}

/// What `Tree::visit` found at a node.
pub enum Visit<E, K, N> {
    /// A scalar, which `visit` has written.
    Written,
    /// An array: its elements, in order.
    Array(E),
    /// An object: its members in canonical order (`sort_members`), without ignored keys.
    Object(Vec<(K, N)>),
}

/// A value that `write_tree` can walk: the parsed JSON text (`text`) or a jsonb value's
/// binary form (`binary`).
pub trait Tree {
    type Node;
    type Key: AsRef<[u8]>;
    type Elements: Iterator<Item = Result<Self::Node, CanonError>>;

    /// Writes `node` if it is a scalar, else returns its children. `depth`: how many
    /// containers are around it (0 for the root).
    #[allow(clippy::type_complexity)]
    fn visit(
        &mut self,
        node: Self::Node,
        depth: usize,
        w: &mut Writer,
    ) -> Result<Visit<Self::Elements, Self::Key, Self::Node>, CanonError>;
}

/// Writes the canonical text of `root`, once, without recursion.
pub fn write_tree<T: Tree>(tree: &mut T, root: T::Node, w: &mut Writer) -> Result<(), CanonError> {
    enum Open<E, M> {
        Array(E),
        Object(M),
    }
    type Members<T> = std::vec::IntoIter<(<T as Tree>::Key, <T as Tree>::Node)>;
    // The open containers, each with "no element written yet".
    type Stack<T> = Vec<(Open<<T as Tree>::Elements, Members<T>>, bool)>;
    let mut stack: Stack<T> = Vec::new();
    let mut next = Some(root);
    loop {
        if let Some(node) = next.take() {
            let open = match tree.visit(node, stack.len(), w)? {
                Visit::Written => None,
                Visit::Array(elements) => {
                    w.raw("[");
                    Some(Open::Array(elements))
                }
                Visit::Object(members) => {
                    w.raw("{");
                    Some(Open::Object(members.into_iter()))
                }
            };
            if let Some(open) = open {
                if stack.len() >= MAX_DEPTH {
                    return Err(CanonError::TooDeep);
                }
                stack.push((open, true));
            }
        }
        let Some((open, first)) = stack.last_mut() else {
            return Ok(());
        };
        match open {
            Open::Array(elements) => match elements.next().transpose()? {
                Some(node) => {
                    if !std::mem::replace(first, false) {
                        w.raw(",");
                    }
                    next = Some(node);
                }
                None => {
                    w.raw("]");
                    stack.pop();
                }
            },
            Open::Object(members) => match members.next() {
                Some((key, node)) => {
                    if !std::mem::replace(first, false) {
                        w.raw(",");
                    }
                    w.string_bytes(key.as_ref());
                    w.raw(":");
                    next = Some(node);
                }
                None => {
                    w.raw("}");
                    stack.pop();
                }
            },
        }
    }
}

/// Sorts an object's members into JCS order: by the UTF-16 code units of their keys (UTF-8
/// text). That is the order of the UTF-8 bytes except between characters above U+FFFF (4
/// bytes, lead byte F0-F4) and U+E000-U+FFFF (lead byte EE or EF), which UTF-16 orders the
/// other way round: only objects with keys holding such characters take the slower
/// comparison. Stable: members with equal keys keep their order.
pub fn sort_members<K: AsRef<[u8]>, T>(members: &mut [(K, T)]) {
    if members.iter().any(|(key, _)| key.as_ref().iter().any(|&b| b >= 0xee)) {
        members.sort_by(|(a, _), (b, _)| {
            let (a, b) = (String::from_utf8_lossy(a.as_ref()), String::from_utf8_lossy(b.as_ref()));
            a.encode_utf16().cmp(b.encode_utf16())
        });
    } else {
        members.sort_by(|(a, _), (b, _)| a.as_ref().cmp(b.as_ref()));
    }
}

/// A string as ECMAScript's JSON.stringify writes it.
pub fn write_string(s: &str, out: &mut String) {
    // SAFETY: write_string_bytes appends runs of `s` cut before and after ASCII bytes, and
    // ASCII escapes, so valid UTF-8 stays valid UTF-8.
    write_string_bytes(s.as_bytes(), unsafe { out.as_mut_vec() });
}

/// write_string of UTF-8 bytes.
fn write_string_bytes(s: &[u8], out: &mut Vec<u8>) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    // Runs of bytes written as they are go in at once.
    let mut run = 0;
    while let Some(i) = next_to_escape(s, run) {
        out.extend_from_slice(&s[run..i]);
        run = i + 1;
        match s[i] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
    }
    out.extend_from_slice(&s[run..]);
    out.push(b'"');
}

/// The position of the first byte at or after `from` that a JSON string must escape: a
/// control character, '"' or '\\'. Eight bytes at a time while there is none (the
/// "has a byte less than n" and "has a zero byte" word tests).
fn next_to_escape(s: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while let Some(chunk) = s.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let control = w.wrapping_sub(ONES * 0x20) & !w;
        let quote = (w ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES) & !(w ^ (ONES * u64::from(b'"')));
        let backslash = (w ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES) & !(w ^ (ONES * u64::from(b'\\')));
        if (control | quote | backslash) & HIGHS != 0 {
            break;
        }
        i += 8;
    }
    s[i..].iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\').map(|p| i + p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_hashes_what_it_writes() {
        // Long enough to be hashed in several chunks.
        let mut w = Writer::hashing();
        let mut text = Writer::keeping();
        w.raw("[");
        text.raw("[");
        for i in 0..5000 {
            for writer in [&mut w, &mut text] {
                if i > 0 {
                    writer.raw(",");
                }
                writer.string_bytes("caf\u{e9} \"x\"\n".as_bytes());
                writer.raw(",");
                writer.number(&format!("{i}.50")).unwrap();
            }
        }
        w.raw("]");
        text.raw("]");
        let text = text.text();
        assert!(text.len() > 3 * HASH_CHUNK);
        assert!(text.starts_with("[\"caf\u{e9} \\\"x\\\"\\n\",0.5,\"caf"));
        assert_eq!(w.fingerprint(), sha256_tagged(text.as_bytes()));
    }

    #[test]
    fn sort_members_orders_by_utf16() {
        fn sorted(keys: &[&str]) -> Vec<String> {
            let mut members: Vec<(&[u8], usize)> = keys.iter().map(|k| k.as_bytes()).zip(0..).collect();
            sort_members(&mut members);
            members.iter().map(|(k, _)| String::from_utf8(k.to_vec()).unwrap()).collect()
        }
        assert_eq!(
            sorted(&["b", "\u{10000}", "a", "\u{e000}", "", "ab"]),
            ["", "a", "ab", "b", "\u{10000}", "\u{e000}"]
        );
        assert_eq!(sorted(&["ab", "B", "a", ""]), ["", "B", "a", "ab"]);
    }

    #[test]
    fn escapes_are_found_in_every_position() {
        // The word-at-a-time scan: one character to escape at each position of strings of
        // every length around the word size, and none.
        for len in 0..20 {
            for at in 0..=len {
                for special in ['"', '\\', '\u{0}', '\u{1f}', '\n'] {
                    let s: String = (0..len).map(|i| if i == at { special } else { 'x' }).collect();
                    let mut out = String::new();
                    write_string(&s, &mut out);
                    assert_eq!(out, slow_escape(&s), "{s:?}");
                }
            }
        }
        for c in ['\u{7f}', '\u{80}', '\u{e9}', '\u{ffff}', ' ', '!', '#', '[', ']', '~'] {
            let s = c.to_string().repeat(17);
            let mut out = String::new();
            write_string(&s, &mut out);
            assert_eq!(out, format!("\"{s}\""));
        }
    }

    /// The escaping of JSON.stringify, written the slow and obvious way.
    fn slow_escape(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn sha256_known_vectors() {
        assert_eq!(
            sha256_tagged(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_tagged(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
