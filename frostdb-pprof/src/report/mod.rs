//! What a profiler shows of a merged profile: a pprof file, a flame graph (JSON, Arrow, SVG),
//! the top table, folded stacks, diffs.

/// Maps keyed by names and symbols built per query: foldhash, not SipHash (a report hashes
/// every frame of every stack it shows; the keys come from stored symbols).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod pprof;
pub mod pyroscope;
pub mod svg;
pub mod top;
pub mod tree;

use crate::symbols::{Frame, Partition, StackId, Symbols, location_frames};

/// Walks stacks root first, resolving each distinct location's frames to a key once (a
/// report's node, a name) however many stacks hold it: stacks share most of their locations,
/// so a report's cost follows the distinct locations, not the frames of every stack.
pub(crate) struct Walker<'a, K> {
    symbols: &'a Symbols,
    /// Per partition: per location index, `start << 32 | len` of its keys in `keys`, plus
    /// one (0: not resolved yet).
    spans: Vec<(u32, Vec<u64>)>,
    /// Keys of resolved locations, outermost frame first within each.
    keys: Vec<K>,
}

impl<'a, K: Copy> Walker<'a, K> {
    pub(crate) fn new(symbols: &'a Symbols) -> Self {
        Self {
            symbols,
            spans: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// Replaces `out` with the keys of `stack`'s frames, root first (outermost first within
    /// a location); `key` resolves a frame the first time its location is met.
    pub(crate) fn root_first(
        &mut self,
        stack: StackId,
        key: &mut impl FnMut(Frame<'a>) -> K,
        out: &mut Vec<K>,
    ) {
        out.clear();
        let Some((p, locations)) = self.symbols.locations(stack) else {
            return;
        };
        let at = match self.spans.iter().position(|(id, _)| *id == p.id()) {
            Some(at) => at,
            None => {
                self.spans.push((p.id(), vec![0; p.counts().locations]));
                self.spans.len() - 1
            }
        };
        for &l in locations.iter().rev() {
            let (start, len) = self.resolve(at, p, l, key);
            out.extend_from_slice(&self.keys[start..start + len]);
        }
    }

    fn resolve(
        &mut self,
        at: usize,
        p: &'a Partition,
        l: u32,
        key: &mut impl FnMut(Frame<'a>) -> K,
    ) -> (usize, usize) {
        let slots = &mut self.spans[at].1;
        if l as usize >= slots.len() {
            // Written after the walk began: the partition is still taking symbols.
            slots.resize(l as usize + 1, 0);
        }
        let span = slots[l as usize];
        if span != 0 {
            let span = span - 1;
            return ((span >> 32) as usize, (span & 0xffff_ffff) as usize);
        }
        let start = self.keys.len();
        location_frames(p, l, &mut |f| self.keys.push(key(f)));
        self.keys[start..].reverse();
        let len = self.keys.len() - start;
        self.spans[at].1[l as usize] = ((start as u64) << 32 | len as u64) + 1;
        (start, len)
    }
}
