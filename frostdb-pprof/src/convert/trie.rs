//! Pyroscope's binary `/ingest` bodies: the transport *trie* (`format=trie`, `Content-Type:
//! binary/octet-stream+trie`, what the first Go agent and the Ruby and Python gems built on
//! it sent) and the *tree* (`format=tree`, `binary/octet-stream+tree`, what `pyroscope
//! convert` wrote), as pprof.
//!
//! Both are one node record after another, depth first, parents before children:
//! `uvarint(name length)`, the name's bytes, `uvarint(value)`, `uvarint(children)`, with
//! unsigned LEB128 varints and no header. In a trie a node's name is a byte prefix of the
//! stacks below it (`root;caller;leaf`, `;` between frames, a name may end or begin inside a
//! frame) and a node with a value stands for the stack its path spells. In a tree a node is
//! one frame (a name holding `;` is several) and its value is its self value; the first node
//! is the root, no frame. (grafana/pyroscope `pkg/og/structs/transporttrie/serialize.go`
//! and `pkg/og/storage/tree/serialize.go`, `DeserializeNoDict`; the layout is described here
//! in our words, the code is our own.)
//!
//! Stricter than Pyroscope where it would store something other than what was sent: a body
//! that ends before a node's declared children, bytes after the root's subtree, a value on
//! an empty stack and (in a trie) a node below the root with an empty name are errors naming
//! the byte offset, not a partial or silently shortened profile. Same-named siblings of a
//! tree add up (Pyroscope keeps the last). Nothing is read recursively: the walk keeps its
//! own stack of open nodes, and what a small body can make the walk materialise (a deep
//! stack named once above many leaves) is bounded by the body's size ([`EXPANSION`] times)
//! and the decompressed-size limit.

use super::folded::{Stacks, Units};
use crate::proto::Profile;
use crate::{Error, Limits, Result};

/// The longest frame name, in bytes (Pyroscope's default symbol length limit).
pub const MAX_FRAME_BYTES: usize = 65_535;

/// The profile a trie body holds, of `units`.
pub fn trie_to_profile(body: &[u8], units: &Units, limits: &Limits) -> Result<Profile> {
    let mut r = Reader::new(body, "trie", limits);
    let mut stacks = new_stacks(units, body, limits);
    if body.is_empty() {
        return stacks.finish();
    }
    // The key so far (every name on the path), the location ids of its whole frames, and
    // where its last, unfinished frame starts.
    let mut key: Vec<u8> = Vec::new();
    let mut key_charged = 0usize;
    let mut frames: Vec<u64> = Vec::new();
    let mut partial = 0usize;
    // Open nodes: children still to come, and the key as it was before the node's name.
    let mut open: Vec<(u64, Mark)> = Vec::new();
    loop {
        let at = r.at;
        r.more(open.last().map(|o| o.0))?;
        let node = r.node()?;
        if node.name.is_empty() && !open.is_empty() {
            return Err(r.error_at(at, "a node below the root has an empty name".into()));
        }
        let mark = Mark {
            key: key.len(),
            frames: frames.len(),
            partial,
        };
        // The path's bytes are a copy of its nodes' names: charged as it grows past what
        // it held before.
        if key.len() + node.name.len() > key_charged {
            let more = key.len() + node.name.len() - key_charged;
            crate::decode::charge::take(more, "converting a trie")?;
            key_charged += more;
        }
        key.extend_from_slice(node.name);
        for (i, &b) in node.name.iter().enumerate() {
            if b == b';' {
                let end = mark.key + i;
                if end > partial {
                    r.push_frame(&mut stacks, &mut frames, &key[partial..end], at)?;
                }
                partial = end + 1;
            }
        }
        if key.len() - partial > MAX_FRAME_BYTES {
            return Err(r.error_at(
                at,
                format!("a frame is longer than {MAX_FRAME_BYTES} bytes"),
            ));
        }
        if node.value > 0 {
            let mut stack = frames.clone();
            if key.len() > partial {
                r.push_frame(&mut stacks, &mut stack, &key[partial..], at)?;
            }
            r.spend(stack.len() * 8)?;
            if stack.is_empty() {
                return Err(r.error_at(at, "a value on an empty stack (the root)".into()));
            }
            let value = r.value(node.value, at)?;
            stacks.add(&stack, value).map_err(|e| r.located(e, at))?;
        }
        if node.children > 0 {
            r.open_one_more(open.len(), at)?;
            open.push((node.children, mark));
            continue;
        }
        mark.restore(&mut key, &mut frames, &mut partial);
        while let Some((remaining, mark)) = open.last_mut() {
            *remaining -= 1;
            if *remaining > 0 {
                break;
            }
            mark.restore(&mut key, &mut frames, &mut partial);
            open.pop();
        }
        if open.is_empty() {
            r.end()?;
            return stacks.finish();
        }
    }
}

/// The profile a tree body holds, of `units`.
pub fn tree_to_profile(body: &[u8], units: &Units, limits: &Limits) -> Result<Profile> {
    let mut r = Reader::new(body, "tree", limits);
    let mut stacks = new_stacks(units, body, limits);
    let root = r.node()?;
    if root.value != 0 {
        return Err(r.error_at(
            0,
            format!("the root has a value ({}) but no frame", root.value),
        ));
    }
    // Location ids of the frames on the path; per open node, its children still to come and
    // how many frames the path had before its name.
    let mut frames: Vec<u64> = Vec::new();
    let mut open: Vec<(u64, usize)> = Vec::new();
    if root.children > 0 {
        open.push((root.children, 0));
    }
    while let Some(&(remaining, _)) = open.last() {
        let at = r.at;
        r.more(Some(remaining))?;
        let node = r.node()?;
        let before = frames.len();
        for name in node.name.split(|&b| b == b';').filter(|n| !n.is_empty()) {
            r.push_frame(&mut stacks, &mut frames, name, at)?;
        }
        if node.value > 0 {
            if frames.is_empty() {
                return Err(r.error_at(at, "a value on a node with no frame name".into()));
            }
            r.spend(frames.len() * 8)?;
            let value = r.value(node.value, at)?;
            stacks.add(&frames, value).map_err(|e| r.located(e, at))?;
        }
        if node.children > 0 {
            r.open_one_more(open.len(), at)?;
            open.push((node.children, before));
            continue;
        }
        frames.truncate(before);
        while let Some((remaining, before)) = open.last_mut() {
            *remaining -= 1;
            if *remaining > 0 {
                break;
            }
            frames.truncate(*before);
            open.pop();
        }
    }
    r.end()?;
    stacks.finish()
}

/// Most bytes of frames a body of `len` bytes may expand to: [`EXPANSION`] times its size (at
/// least 16 MiB), and never past the decompressed-size limit.
fn expansion_limit(len: usize, limits: &Limits) -> usize {
    len.saturating_mul(EXPANSION)
        .max(16 << 20)
        .min(limits.max_decompressed_bytes)
}

/// How many times its size a trie or tree body may expand to in frames (8 bytes each). A
/// real profile shares long stacks between leaves that differ in a frame or two: a Java
/// stack of 200 frames above leaves of 30 bytes each is some 50 times; a body that names
/// one deep stack above thousands of one-byte leaves is thousands of times, and refused.
pub const EXPANSION: usize = 256;

fn new_stacks<'u>(units: &'u Units, body: &[u8], limits: &Limits) -> Stacks<'u> {
    // A frame of a stack is a location id (8 bytes).
    Stacks::new(units, limits, expansion_limit(body.len(), limits) / 8)
}

/// The key, frames and unfinished frame of a trie walk before a node's name.
struct Mark {
    key: usize,
    frames: usize,
    partial: usize,
}

impl Mark {
    fn restore(&self, key: &mut Vec<u8>, frames: &mut Vec<u64>, partial: &mut usize) {
        key.truncate(self.key);
        frames.truncate(self.frames);
        *partial = self.partial;
    }
}

/// One node record.
struct Node<'a> {
    name: &'a [u8],
    value: u64,
    children: u64,
}

/// Reads node records, every length checked, and keeps the budget of bytes the walk may
/// still spend on frames it makes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    format: &'static str,
    /// Bytes of frames made so far, charged against `limit`.
    spent: usize,
    limit: usize,
    /// Most nodes open at once (nested on one path): [`max_open`].
    max_open: usize,
    /// Most frames on a path: the stack depth limit.
    max_depth: usize,
}

/// Most nodes a path may nest: four times the stack depth limit (a path's nodes are its
/// frames, and the splits where stacks branch mid-frame). Each open node is held until its
/// last child: without a bound, 4-byte nodes of one child each hold 32 bytes apiece, a
/// gigabyte of a gzipped 128 MiB body.
fn max_open(limits: &Limits) -> usize {
    limits.max_stack_depth.saturating_mul(4).max(1024)
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], format: &'static str, limits: &Limits) -> Self {
        Self {
            bytes,
            at: 0,
            format,
            spent: 0,
            limit: expansion_limit(bytes.len(), limits),
            max_open: max_open(limits),
            max_depth: limits.max_stack_depth,
        }
    }

    /// Adds the frame named `name` to the path's `frames`, refusing a path deeper than the
    /// stack depth limit as it is read: one node's name may hold millions of frames (`a;`
    /// is two bytes of them), which no other bound counts before they are made.
    fn push_frame(
        &mut self,
        stacks: &mut Stacks<'_>,
        frames: &mut Vec<u64>,
        name: &[u8],
        at: usize,
    ) -> Result<()> {
        if frames.len() >= self.max_depth {
            return Err(Error::TooLarge {
                what: "stack depth",
                limit: self.max_depth,
            });
        }
        frames.push(self.frame(stacks, name, at)?);
        Ok(())
    }

    /// Refuses a node at `at` that would be one open node more than [`max_open`].
    fn open_one_more(&self, open: usize, at: usize) -> Result<()> {
        if open >= self.max_open {
            return Err(self.error_at(
                at,
                format!(
                    "nodes nested deeper than {} (four times the stack depth limit)",
                    self.max_open
                ),
            ));
        }
        Ok(())
    }

    fn error_at(&self, at: usize, reason: String) -> Error {
        Error::Convert {
            format: self.format,
            at: format!("byte {at}"),
            reason,
        }
    }

    /// `e` (from adding a stack) at the node at `at`.
    fn located(&self, e: Error, at: usize) -> Error {
        match e {
            Error::Convert { reason, .. } => self.error_at(at, reason),
            other => other,
        }
    }

    fn uvarint(&mut self, what: &str) -> Result<u64> {
        let start = self.at;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(self.error_at(start, format!("the body ends inside the {what}")));
            };
            self.at += 1;
            if shift == 63 && b > 1 {
                return Err(self.error_at(start, format!("the {what} overflows 64 bits")));
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.error_at(start, format!("the {what} overflows 64 bits")))
    }

    fn node(&mut self) -> Result<Node<'a>> {
        let start = self.at;
        let len = self.uvarint("length of a node's name")?;
        let left = self.bytes.len() - self.at;
        if len > left as u64 {
            return Err(self.error_at(
                start,
                format!("a node's name of {len} bytes, but {left} bytes are left"),
            ));
        }
        let name = &self.bytes[self.at..self.at + len as usize];
        self.at += len as usize;
        let value = self.uvarint("value of a node")?;
        let children = self.uvarint("number of a node's children")?;
        Ok(Node {
            name,
            value,
            children,
        })
    }

    /// The location of the frame named `name` (of the node at `at`), its bytes spent.
    fn frame(&mut self, stacks: &mut Stacks<'_>, name: &[u8], at: usize) -> Result<u64> {
        if name.len() > MAX_FRAME_BYTES {
            return Err(self.error_at(
                at,
                format!("a frame is longer than {MAX_FRAME_BYTES} bytes"),
            ));
        }
        self.spend(name.len())?;
        stacks.frame(&String::from_utf8_lossy(name))
    }

    /// Spends `bytes` of the budget: what the walk makes of frames it names again and
    /// again (a deep stack above many leaves) may not pass the decompressed-size limit.
    fn spend(&mut self, bytes: usize) -> Result<()> {
        let limit = self.limit;
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > limit {
            return Err(Error::TooLarge {
                what: "bytes of frames the body expands to (256 times its size, at least 16 MiB, at most the decompressed-size limit)",
                limit,
            });
        }
        Ok(())
    }

    fn value(&self, value: u64, at: usize) -> Result<i64> {
        i64::try_from(value).map_err(|_| self.error_at(at, format!("the value {value} overflows")))
    }

    /// Checks that the body goes on where a node still expects `children`.
    fn more(&self, children: Option<u64>) -> Result<()> {
        match children {
            Some(n) if self.at == self.bytes.len() => Err(self.error_at(
                self.at,
                format!("the body ends while a node still expects {n} more children"),
            )),
            _ => Ok(()),
        }
    }

    /// Checks that the body ends here.
    fn end(&self) -> Result<()> {
        let left = self.bytes.len() - self.at;
        if left > 0 {
            return Err(self.error_at(self.at, format!("{left} bytes after the root's last node")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::folded::stack_lines as folded;

    fn units() -> Units {
        Units {
            sample: ("cpu".into(), "nanoseconds".into()),
            period: ("cpu".into(), "nanoseconds".into()),
            period_value: 10_000_000,
            scale: 1,
        }
    }

    fn trie(body: &[u8]) -> Result<Vec<String>> {
        let p = trie_to_profile(body, &units(), &Limits::default())?;
        crate::validate(p.clone(), &Limits::default())?;
        Ok(folded(&p))
    }

    fn tree(body: &[u8]) -> Result<Vec<String>> {
        let p = tree_to_profile(body, &units(), &Limits::default())?;
        crate::validate(p.clone(), &Limits::default())?;
        Ok(folded(&p))
    }

    #[test]
    fn tries_as_pyroscope_clients_send_them() {
        // `a;b 1`, `a;c 2` as the transport trie serialises them.
        assert_eq!(
            trie(b"\x00\x00\x01\x02a;\x00\x02\x01b\x01\x00\x01c\x02\x00").unwrap(),
            ["a;b 1", "a;c 2"]
        );
        // The first server's ingest test: a name ends inside a frame.
        assert_eq!(
            trie(b"\x00\x00\x01\x06foo;ba\x00\x02\x01r\x02\x00\x01z\x03\x00").unwrap(),
            ["foo;bar 2", "foo;baz 3"]
        );
        // Values on inner nodes, names beginning with `;`, a two-byte varint (300).
        let body = b"\x00\x00\x01\x04main\x05\x01\x01;\x00\x02\x02fo\x00\x02\x01b\x02\x00\
\x01o\x07\x01\x03;ba\x04\x02\x01r\x01\x01\x04;qux\x01\x00\x01z\xac\x02\x00\
\x03b;c\x00\x00";
        assert_eq!(
            trie(body).unwrap(),
            [
                "main 5",
                "main;fob 2",
                "main;foo 7",
                "main;foo;ba 4",
                "main;foo;bar 1",
                "main;foo;bar;qux 1",
                "main;foo;baz 300",
            ]
        );
        assert_eq!(trie(b"").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn trees_as_pyroscope_writes_them() {
        assert_eq!(
            tree(b"\x00\x00\x01\x01a\x00\x02\x01b\x01\x00\x01c\x02\x00").unwrap(),
            ["a;b 1", "a;c 2"]
        );
        assert_eq!(
            tree(b"\x00\x00\x01\x03foo\x00\x02\x03bar\x02\x00\x03baz\x03\x00").unwrap(),
            ["foo;bar 2", "foo;baz 3"]
        );
        // Self values on inner nodes; a name holding `;` is two frames; same-named siblings
        // add up.
        assert_eq!(
            tree(b"\x00\x00\x03\x04main\x05\x01\x03x;y\x02\x00\x01a\x01\x00\x01a\x02\x00").unwrap(),
            ["a 3", "main 5", "main;x;y 2"]
        );
    }

    #[test]
    fn broken_bodies_name_the_byte_and_store_nothing() {
        let cases: [(&[u8], bool, &str); 10] = [
            // A trie that ends before its root's second child.
            (
                b"\x00\x00\x02\x01a\x01\x00",
                false,
                "byte 7: the body ends while a node still expects 1 more",
            ),
            (
                b"\x00\x00\x01\x05ab",
                false,
                "byte 3: a node's name of 5 bytes, but 2",
            ),
            (b"\x00\x00\x00\x01a\x01\x00", false, "byte 3: 4 bytes after"),
            (
                b"\x00\x00\x01\x00\x01\x00",
                false,
                "byte 3: a node below the root has an empty",
            ),
            (b"\x00\x05\x00", false, "byte 0: a value on an empty stack"),
            (
                b"\x00\x00\x01\x01a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x00",
                false,
                "the value of a node overflows",
            ),
            (
                b"\x00\x00\x01\x01a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01\x00",
                false,
                "byte 3: the value 9223372036854775808 overflows",
            ),
            (b"", true, "byte 0: the body ends inside"),
            (b"\x00\x07\x00", true, "the root has a value (7)"),
            (
                b"\x00\x00\x01\x00\x04\x00",
                true,
                "byte 3: a value on a node with no frame",
            ),
        ];
        for (body, is_tree, want) in cases {
            let got = if is_tree { tree(body) } else { trie(body) };
            let e = got.expect_err(want).to_string();
            assert!(e.contains(want), "{body:?}: {e}");
            let format = if is_tree {
                "invalid tree"
            } else {
                "invalid trie"
            };
            assert!(e.starts_with(format), "{e}");
        }
    }

    /// Nodes of one child each, nested 20,000 deep (4 bytes a trie node, 3 a tree node,
    /// with no frame in them): refused past four times the stack depth limit rather than
    /// held open, 32 bytes each, until the body ends.
    #[test]
    fn frames_in_one_name_past_the_depth_limit_are_refused_as_they_are_read() {
        // One node whose name is a stack of millions of frames: two bytes each of the body,
        // eight each of the walk's path, and no value (nothing stored) to check them at.
        // Refused at the depth limit, not grown to gigabytes first.
        let node = |name: &[u8], value: u8| {
            let mut n = Vec::new();
            let mut len = name.len() as u64;
            while len >= 0x80 {
                n.push((len as u8) | 0x80);
                len >>= 7;
            }
            n.push(len as u8);
            n.extend_from_slice(name);
            n.extend([value, 0]);
            n
        };
        let limit = Limits::default().max_stack_depth;
        let too_deep = b"a;".repeat(limit + 1);
        let mut tree_body = b"\x00\x00\x01".to_vec();
        tree_body.extend(node(&too_deep, 0));
        for (format, e) in [
            ("trie", trie(&node(&too_deep, 0)).unwrap_err()),
            ("tree", tree(&tree_body).unwrap_err()),
        ] {
            let e = e.to_string();
            assert!(
                e.contains(&format!("stack depth exceeds the limit of {limit}")),
                "{format}: {e}"
            );
        }
        // A leaf's last frame counts too; a stack at the limit is taken.
        let at_limit = b"a;".repeat(limit - 1);
        assert!(trie(&node(&[at_limit.as_slice(), b"a;b"].concat(), 1)).is_err());
        assert_eq!(
            trie(&node(&[at_limit.as_slice(), b"b"].concat(), 1))
                .unwrap()
                .len(),
            1
        );
        let mut tree_body = b"\x00\x00\x01".to_vec();
        tree_body.extend(node(&[at_limit.as_slice(), b"b"].concat(), 1));
        assert_eq!(tree(&tree_body).unwrap().len(), 1);
    }

    /// A trie's path is a copy of its nodes' names: charged as it grows. One root named
    /// `;` a million times makes no frame, and was a megabyte copied uncharged (128 MiB
    /// from a 130 KB gzip body).
    #[test]
    fn a_tries_path_is_charged_as_it_grows() {
        let name = b";".repeat(1 << 20);
        let mut body = vec![0x80, 0x80, 0x40];
        body.extend(&name);
        body.extend([0, 0]);
        let (got, asked) = crate::decode::charge::under_budget(1 << 19, || {
            trie_to_profile(&body, &units(), &Limits::default())
        });
        let e = got.err().unwrap_or_else(|| panic!("copied uncharged"));
        assert!(e.to_string().contains("converting a trie"), "{e}");
        assert!(asked >= 1 << 20);
        // Within the budget, the same body converts (to no samples).
        let (got, _) = crate::decode::charge::under_budget(4 << 20, || {
            trie_to_profile(&body, &units(), &Limits::default())
        });
        assert!(got.unwrap().sample.is_empty());
    }

    #[test]
    fn nodes_nested_deeper_than_the_limit_are_refused() {
        let mut trie_body = b"\x00\x00\x01".to_vec();
        trie_body.extend(b"\x01;\x00\x01".repeat(20_000));
        let e = trie_to_profile(&trie_body, &units(), &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("nested deeper than 16384"), "{e}");
        let mut tree_body = b"\x00\x00\x01".to_vec();
        tree_body.extend(b"\x00\x00\x01".repeat(20_000));
        let e = tree_to_profile(&tree_body, &units(), &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("nested deeper than 16384"), "{e}");
        // A stack at the depth limit, a node a frame, is taken.
        let mut deep = b"\x00\x00\x01".to_vec();
        for _ in 0..4_095 {
            deep.extend(b"\x02f;\x00\x01");
        }
        deep.extend(b"\x01g\x01\x00");
        assert_eq!(trie(&deep).unwrap().len(), 1);
    }

    /// One node naming 2,000 distinct frames is refused at the location limit as the
    /// frames are made (each a function and a location, some 300 bytes of a few-byte
    /// name), not after all of them are.
    #[test]
    fn distinct_frames_past_the_location_limit_are_refused_as_they_are_made() {
        let name: String = (0..2_000).map(|i| format!("f{i};")).collect();
        let mut body = b"\x00\x00\x01".to_vec();
        let mut len = name.len();
        while len >= 0x80 {
            body.push(0x80 | (len & 0x7f) as u8);
            len >>= 7;
        }
        body.push(len as u8);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(b"\x01\x00");
        let small = Limits {
            max_locations: 1_000,
            ..Limits::default()
        };
        let e = trie_to_profile(&body, &units(), &small).unwrap_err();
        assert!(e.to_string().contains("distinct frames"), "{e}");
        assert_eq!(trie(&body).unwrap().len(), 1);
    }

    #[test]
    fn a_deep_stack_above_many_leaves_is_bounded_by_the_decompressed_limit() {
        // A chain of 2,000 frames, then 2,000 one-byte leaves under it: 4 million frames of
        // stacks from 12 kB.
        let mut body = b"\x00\x00\x01".to_vec();
        for _ in 0..2_000 {
            body.extend_from_slice(b"\x02f;\x00\x01");
        }
        body.pop();
        body.extend_from_slice(&[0x80 | (2_000 & 0x7f) as u8, (2_000 >> 7) as u8]);
        for i in 0..2_000u32 {
            let name = format!("{:03}", i % 1000);
            body.push(name.len() as u8);
            body.extend_from_slice(name.as_bytes());
            body.extend_from_slice(b"\x01\x00");
        }
        let limits = Limits {
            max_decompressed_bytes: 16 << 20,
            ..Limits::default()
        };
        let e = trie_to_profile(&body, &units(), &limits).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    }
}
