//! Java Flight Recorder recordings (`format=jfr` on Pyroscope's `/ingest`: what
//! `pyroscope-java` sends from async-profiler, and what the JDK's own
//! `-XX:StartFlightRecording` writes) as pprof: a profile per kind of event the recording
//! holds, as Pyroscope makes them (grafana/jfr-parser's `pprof` package):
//!
//! | events | profile | sample types |
//! |---|---|---|
//! | `jdk.ExecutionSample` (not sleeping), `profiler.WallClockSample` (runnable, in wall mode) | `process_cpu` | `cpu` nanoseconds |
//! | `profiler.WallClockSample`, `jdk.ExecutionSample` in async-profiler's wall mode | `wall` | `wall` nanoseconds |
//! | `jdk.ObjectAllocationInNewTLAB` | `memory` | `alloc_in_new_tlab_objects`, `alloc_in_new_tlab_bytes` (the TLAB's size) |
//! | `jdk.ObjectAllocationOutsideTLAB` | `memory` | `alloc_outside_tlab_objects`, `alloc_outside_tlab_bytes` |
//! | `jdk.ObjectAllocationSample` | `memory` | `alloc_sample_objects`, `alloc_sample_bytes` (its weight) |
//! | `jdk.JavaMonitorEnter` | `mutex` | `contentions`, `delay` nanoseconds |
//! | `jdk.ThreadPark` | `block` | `contentions`, `delay` nanoseconds |
//! | `profiler.LiveObject` | `memory` | `live` count |
//! | `profiler.Malloc` | `memory` | `malloc_objects`, `malloc_bytes` |
//!
//! A CPU or wall sample stands for `1 s / sampleRate` (the request's, 100 by default), as
//! in Pyroscope. A frame is its method's class (`java/lang/Thread`, as the JVM names it) and
//! name (`java/lang/Thread.run`) at its line; the names the JVM makes up for lambdas and
//! reflection accessors (`Main$$Lambda$14/0x…`, `GeneratedMethodAccessor31`) are merged as
//! Pyroscope merges them, so that each run of a program does not make new functions. The
//! `labels` part `pyroscope-java` sends beside the recording ([`LabelsSnapshot`]) gives the
//! labels of each event's `contextId`; an event's `spanId` is its `span_id` and its
//! `spanName` its `span_name`.
//!
//! Where Pyroscope stores something other than the recording says, this does not: lock and
//! park delays are converted from the chunk's ticks to nanoseconds (Pyroscope stores ticks
//! as nanoseconds), a stack naming a method or class the recording does not hold is an error
//! rather than a shorter stack, an event without a stack is kept under one
//! `[no stack trace]` frame ([`NO_STACK`]) rather than dropped, and a recording cut short, with a dangling constant pool
//! reference or bytes that are not JFR is an error naming the byte. The reader is our own
//! ([`reader`]): the crates on crates.io (`jfrs`) read lengths and recursion depths from the
//! file unchecked.

mod reader;

use std::collections::HashMap as StdHashMap;

/// Hash maps of the conversion (foldhash: its keys are small and many).
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;

use prost::Message;

use self::reader::{Bad, Cursor, Header, Metadata, Slot, Str, Values};
use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use crate::string_table::StringTable;
use crate::{Error, Limits, Result};

/// The per-event context labels `pyroscope-java` sends beside a recording (its
/// `jfr_labels.proto`, package `io.pyroscope.labels.pb`).
#[derive(Clone, PartialEq, Message)]
pub struct LabelsSnapshot {
    /// Context id (an event's `contextId`) to its labels.
    #[prost(map = "int64, message", tag = "1")]
    pub contexts: StdHashMap<i64, Context>,
    /// The strings the labels name by id.
    #[prost(map = "int64, string", tag = "2")]
    pub strings: StdHashMap<i64, String>,
}

/// The labels of one context: string id to string id.
#[derive(Clone, PartialEq, Message)]
pub struct Context {
    /// Label name id to value id.
    #[prost(map = "int64, int64", tag = "1")]
    pub labels: StdHashMap<i64, i64>,
}

/// One profile of a recording.
#[derive(Debug)]
pub struct Converted {
    /// The store's profile name: `process_cpu`, `wall`, `memory`, `mutex` or `block`.
    pub profile_name: &'static str,
    /// The profile.
    pub profile: Profile,
}

/// What a recording says beside its profiles.
#[derive(Debug, Default)]
pub struct Recording {
    /// Its profiles, in the order of [`Kind`].
    pub profiles: Vec<Converted>,
    /// async-profiler's `event` setting (`cpu`, `itimer`, `wall`, ...): Pyroscope's
    /// `jfr_event` label. JDK recordings have none.
    pub event: Option<String>,
    /// Events read, of the kinds made into profiles (those without a stack too).
    pub events: u64,
}

/// The kinds of profile a recording makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Cpu,
    Wall,
    AllocInNewTlab,
    AllocOutsideTlab,
    AllocSample,
    Lock,
    Park,
    Live,
    Malloc,
}

const KINDS: usize = 9;

impl Kind {
    fn metric(self) -> &'static str {
        match self {
            Self::Cpu => "process_cpu",
            Self::Wall => "wall",
            Self::Lock => "mutex",
            Self::Park => "block",
            _ => "memory",
        }
    }

    /// Sample types, and the period type.
    fn types(
        self,
    ) -> (
        &'static [(&'static str, &'static str)],
        (&'static str, &'static str),
    ) {
        match self {
            Self::Cpu => (&[("cpu", "nanoseconds")], ("cpu", "nanoseconds")),
            Self::Wall => (&[("wall", "nanoseconds")], ("wall", "nanoseconds")),
            Self::AllocInNewTlab => (
                &[
                    ("alloc_in_new_tlab_objects", "count"),
                    ("alloc_in_new_tlab_bytes", "bytes"),
                ],
                ("space", "bytes"),
            ),
            Self::AllocOutsideTlab => (
                &[
                    ("alloc_outside_tlab_objects", "count"),
                    ("alloc_outside_tlab_bytes", "bytes"),
                ],
                ("space", "bytes"),
            ),
            Self::AllocSample => (
                &[
                    ("alloc_sample_objects", "count"),
                    ("alloc_sample_bytes", "bytes"),
                ],
                ("space", "bytes"),
            ),
            Self::Lock => (
                &[("contentions", "count"), ("delay", "nanoseconds")],
                ("mutex", "count"),
            ),
            Self::Park => (
                &[("contentions", "count"), ("delay", "nanoseconds")],
                ("block", "count"),
            ),
            Self::Live => (&[("live", "count")], ("objects", "count")),
            Self::Malloc => (
                &[("malloc_objects", "count"), ("malloc_bytes", "bytes")],
                ("space", "bytes"),
            ),
        }
    }
}

/// The one frame of the events a recording has no stack for.
pub const NO_STACK: &str = "[no stack trace]";

/// The events read, by class name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    ExecutionSample,
    WallClockSample,
    AllocInNewTlab,
    AllocOutsideTlab,
    AllocSample,
    MonitorEnter,
    ThreadPark,
    LiveObject,
    Malloc,
}

impl EventKind {
    fn of(class: &str) -> Option<Self> {
        Some(match class {
            "jdk.ExecutionSample" => Self::ExecutionSample,
            "profiler.WallClockSample" => Self::WallClockSample,
            "jdk.ObjectAllocationInNewTLAB" => Self::AllocInNewTlab,
            "jdk.ObjectAllocationOutsideTLAB" => Self::AllocOutsideTlab,
            "jdk.ObjectAllocationSample" => Self::AllocSample,
            "jdk.JavaMonitorEnter" => Self::MonitorEnter,
            "jdk.ThreadPark" => Self::ThreadPark,
            "profiler.LiveObject" => Self::LiveObject,
            "profiler.Malloc" => Self::Malloc,
            _ => return None,
        })
    }
}

/// The fields of an event class this reads, by index.
#[derive(Debug, Clone, Copy)]
struct EventFields {
    kind: EventKind,
    stack_trace: Option<usize>,
    state: Option<usize>,
    duration: Option<usize>,
    size: Option<usize>,
    tlab_size: Option<usize>,
    weight: Option<usize>,
    samples: Option<usize>,
    context_id: Option<usize>,
    span_id: Option<usize>,
    span_name: Option<usize>,
}

/// A recording (raw or gzip) and the labels part sent with it (protobuf, raw or gzip), as
/// profiles; a CPU or wall sample stands for `1 s / sample_rate`.
pub fn convert(
    body: &[u8],
    labels: Option<&[u8]>,
    sample_rate: i64,
    limits: &Limits,
) -> Result<Recording> {
    let body = crate::decode::inflate(body, limits.max_decompressed_bytes)?;
    let mut labels_bytes = 0;
    let labels = match labels {
        Some(bytes) => {
            let bytes = crate::decode::inflate(bytes, limits.max_decompressed_bytes)?;
            labels_bytes = bytes.len();
            // Its maps decode to many times their bytes (an empty entry is 2 bytes, a
            // hash map slot and a context decoded): charged before they are made.
            crate::decode::charge::charge(
                labels_bytes.saturating_mul(LABELS_DECODED_PER_BYTE),
                "decoding a JFR labels part",
            )?;
            LabelsSnapshot::decode(&*bytes).map_err(|e| Error::Convert {
                format: "JFR labels",
                at: "the labels part".into(),
                reason: format!("not a LabelsSnapshot protobuf: {e}"),
            })?
        }
        None => LabelsSnapshot::default(),
    };
    let mut converter = Converter::new(&labels, sample_rate, limits);
    converter.may_make = body
        .len()
        .saturating_add(labels_bytes)
        .saturating_mul(EXPANSION)
        .max(MIN_MAKE);
    let at_byte = |b: Bad, chunk: usize| Error::Convert {
        format: "JFR",
        at: format!("byte {} (chunk {chunk})", b.at),
        reason: b.reason,
    };
    if body.is_empty() {
        return Err(Error::Convert {
            format: "JFR",
            at: "byte 0".into(),
            reason: "the recording is empty".into(),
        });
    }
    let mut start = 0;
    let mut chunk = 0;
    while start < body.len() {
        let header = Header::read(&body, start).map_err(|b| at_byte(b, chunk))?;
        converter.chunk(&body, &header).map_err(|e| match e {
            Failure::Bad(b) => at_byte(b, chunk),
            Failure::Limit(e) => e,
        })?;
        start = header.end();
        chunk += 1;
    }
    converter.finish()
}

/// What a recording may convert to, at most: [`EXPANSION`] times its bytes (and its labels
/// part's, inflated), or [`MIN_MAKE`] for a small one. Counted are the bytes made beyond
/// the recording's own: frame names (held in four places), label sets, and each sample's
/// frames and labels (copied into its pprof sample, and again when it is validated). A
/// recording names a stack once in its constant pool and its events name it by id, so
/// samples of distinct contexts on deep stacks, or many methods of a long class name,
/// make gigabytes of a few megabytes; real recordings make a few times their size.
const EXPANSION: usize = 64;

/// See [`EXPANSION`].
const MIN_MAKE: usize = 64 << 20;

/// What a labels part (`LabelsSnapshot`) takes decoded, at most, per byte: its smallest
/// map entry is 2 bytes, and a context decoded (a map of its own, in a map) some 60.
const LABELS_DECODED_PER_BYTE: usize = 32;

/// What is made is charged to the caller's budget ([`crate::charging`]) in steps of this.
const CHARGE_STEP: usize = 1 << 20;

/// The longest frame name (`class.method`) a recording may give.
const MAX_FRAME_NAME_BYTES: usize = crate::convert::trie::MAX_FRAME_BYTES;

/// A failure: bad bytes, or a limit met.
enum Failure {
    Bad(Bad),
    Limit(Error),
}

impl From<Bad> for Failure {
    fn from(b: Bad) -> Self {
        Self::Bad(b)
    }
}

type F<T> = std::result::Result<T, Failure>;

/// One profile being built.
struct Builder {
    strings: StringTable,
    functions: Vec<Function>,
    function_ids: HashMap<String, u64>,
    locations: Vec<Location>,
    location_ids: HashMap<(u64, i64), u64>,
    /// Stacks of location ids, leaf first, and their index.
    stacks: HashMap<Vec<u64>, u32>,
    /// Frames of each stack, by index.
    lens: Vec<usize>,
    /// (stack, label set) to values.
    samples: HashMap<(u32, u32), [i64; 2]>,
}

impl Builder {
    fn new() -> Self {
        Self {
            strings: StringTable::new(),
            functions: Vec::new(),
            function_ids: HashMap::default(),
            locations: Vec::new(),
            location_ids: HashMap::default(),
            stacks: HashMap::default(),
            lens: Vec::new(),
            samples: HashMap::default(),
        }
    }

    fn location(&mut self, name: &str, line: i64) -> Result<u64> {
        let function = self.function(name)?;
        Ok(self.location_of(function, line))
    }

    /// The id of the function named `name`, made once.
    fn function(&mut self, name: &str) -> Result<u64> {
        Ok(match self.function_ids.get(name) {
            Some(&id) => id,
            None => {
                let id = self.functions.len() as u64 + 1;
                let name_index = self.strings.get(name)?;
                self.functions.push(Function {
                    id,
                    name: name_index,
                    ..Function::default()
                });
                self.function_ids.insert(name.to_owned(), id);
                id
            }
        })
    }

    /// The index of `stack`, made once; its frames are counted in `lens`.
    fn stack_id(&mut self, stack: Vec<u64>) -> u32 {
        let next = self.stacks.len() as u32;
        let len = stack.len();
        let id = *self.stacks.entry(stack).or_insert(next);
        if id == next {
            self.lens.push(len);
        }
        id
    }

    /// The id of the location of `function` at `line`, made once.
    fn location_of(&mut self, function: u64, line: i64) -> u64 {
        *self
            .location_ids
            .entry((function, line))
            .or_insert_with(|| {
                let id = self.locations.len() as u64 + 1;
                self.locations.push(Location {
                    id,
                    mapping_id: 1,
                    line: vec![Line {
                        function_id: function,
                        line,
                        ..Line::default()
                    }],
                    ..Location::default()
                });
                id
            })
    }
}

/// What a builder keeps for a location: the `Location`, its `Line` and its key's slot.
const LOCATION_BYTES: usize = 160;

/// What a constant pool keeps for an entry besides its text or frames: the key, the value
/// and the hash map's slot.
const POOL_ENTRY_BYTES: usize = 64;

/// A chunk's constant pools, as far as stacks need them.
#[derive(Default)]
struct Pools {
    strings: HashMap<i64, String>,
    symbols: HashMap<i64, Str>,
    /// Class id to its name's symbol id.
    classes: HashMap<i64, i64>,
    /// Method id to its class id and name's symbol id.
    methods: HashMap<i64, (i64, i64)>,
    /// Stack trace id to its frames in `frames` (leaf first).
    stack_traces: HashMap<i64, (usize, usize)>,
    /// (method id, line) of every stack trace's frames.
    frames: Vec<(i64, i64)>,
    thread_states: HashMap<i64, String>,
}

impl Pools {
    fn string(&self, s: &Str) -> Option<String> {
        match s {
            Str::Null => Some(String::new()),
            Str::Text(t) => Some(t.clone()),
            Str::Ref(id) => self.strings.get(id).cloned(),
        }
    }

    fn symbol(&self, id: i64) -> Option<String> {
        self.string(self.symbols.get(&id)?)
    }

    /// `class.method`, as Pyroscope names a Java frame.
    fn frame_name(&self, method: i64) -> std::result::Result<String, String> {
        let &(class, name) = self.methods.get(&method).ok_or_else(|| {
            format!("a stack frame names method {method}, which no constant pool holds")
        })?;
        let class_name = self
            .classes
            .get(&class)
            .and_then(|&s| self.symbol(s))
            .ok_or_else(|| {
                format!("method {method} is of class {class}, which no constant pool names")
            })?;
        let method_name = self.symbol(name).ok_or_else(|| {
            format!("method {method}'s name (symbol {name}) is in no constant pool")
        })?;
        Ok(format!("{}.{}", merge_generated(&class_name), method_name))
    }
}

/// The class names the JVM makes up per run, merged as Pyroscope merges them:
/// `…$$Lambda$14/0x0000000800c03000` and `…$$Lambda.0x…` to `…$$Lambda_`,
/// `jdk/internal/reflect/GeneratedMethodAccessor31` to `…GeneratedMethodAccessor_`.
fn merge_generated(class: &str) -> std::borrow::Cow<'_, str> {
    const ACCESSOR: &str = "jdk/internal/reflect/GeneratedMethodAccessor";
    if let Some(n) = class.strip_prefix(ACCESSOR)
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
    {
        return format!("{ACCESSOR}_").into();
    }
    if class.contains('$')
        && let Some(i) = class.rfind("$$Lambda")
    {
        let (head, tail) = class.split_at(i + "$$Lambda".len());
        if !head.is_empty() && generated_lambda_suffix(tail) {
            return format!("{head}_").into();
        }
    }
    class.into()
}

/// `$14/0x7f…`, `.0x7f…`, `$14.0x…` or digits: what follows `$$Lambda` in a lambda's class.
fn generated_lambda_suffix(s: &str) -> bool {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let s = s.strip_prefix('$').unwrap_or(s);
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let s = &s[digits..];
    let Some(s) = s.strip_prefix('.').or_else(|| s.strip_prefix('/')) else {
        return false;
    };
    let s = s.strip_prefix("0x").unwrap_or(s);
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

struct Converter<'l> {
    labels: &'l LabelsSnapshot,
    period_ns: i64,
    limits: &'l Limits,
    builders: [Option<Builder>; KINDS],
    /// Label sets by (context id, span id, span name id), and their labels.
    label_set_ids: HashMap<(i64, i64, i64), u32>,
    label_sets: Vec<Vec<(String, String)>>,
    /// This chunk's stack trace ids, by profile, as stacks: each distinct stack trace's
    /// frames are resolved once, not once per event naming it.
    stacks: HashMap<(Kind, i64), u32>,
    /// This chunk's functions by profile and method id (`class.method`), each name made
    /// and hashed once.
    functions: HashMap<(Kind, i64), u64>,
    /// Bytes made so far, most that may be made, and bytes charged ([`EXPANSION`]).
    made: usize,
    may_make: usize,
    charged: usize,
    event: Option<String>,
    events: u64,
    start_nanos: Option<i64>,
    end_nanos: i64,
    /// Events read, every chunk's: the recording's conversion stops once its request ended.
    pace: crate::decode::charge::Pace,
}

impl<'l> Converter<'l> {
    fn new(labels: &'l LabelsSnapshot, sample_rate: i64, limits: &'l Limits) -> Self {
        Self {
            labels,
            period_ns: 1_000_000_000 / sample_rate.max(1),
            limits,
            builders: Default::default(),
            label_set_ids: [((0, 0, 0), 0)].into_iter().collect(),
            label_sets: vec![Vec::new()],
            stacks: HashMap::default(),
            functions: HashMap::default(),
            made: 0,
            may_make: MIN_MAKE,
            charged: 0,
            event: None,
            events: 0,
            start_nanos: None,
            end_nanos: 0,
            pace: crate::decode::charge::Pace::new(),
        }
    }

    fn chunk(&mut self, buf: &[u8], header: &Header) -> F<()> {
        self.stacks.clear();
        self.functions.clear();
        let metadata = Metadata::read(buf, header)?;
        let named = |name: &str| metadata.id(name);
        let pool_classes = PoolClasses::new(&metadata);
        let active_setting = named("jdk.ActiveSetting");
        let mut events: HashMap<i64, EventFields> = HashMap::default();
        for (&id, class) in &metadata.classes {
            if let Some(kind) = EventKind::of(&class.name) {
                events.insert(
                    id,
                    EventFields {
                        kind,
                        stack_trace: class.field("stackTrace"),
                        state: class.field("state"),
                        duration: class.field("duration"),
                        size: class
                            .field("allocationSize")
                            .or_else(|| class.field("size")),
                        tlab_size: class.field("tlabSize"),
                        weight: class.field("weight"),
                        samples: class.field("samples"),
                        context_id: class.field("contextId"),
                        span_id: class.field("spanId"),
                        span_name: class.field("spanName"),
                    },
                );
            }
        }
        let mut values = Values::new(&metadata);
        let mut pools = Pools::default();
        // First the constant pools, wherever they are in the chunk; then the settings
        // (async-profiler's `event` says what its samples are); then, walking the chunk
        // again (nothing is kept per event), the events.
        let mut settings: Vec<(usize, usize)> = Vec::new();
        let chunk_cursor = || {
            Cursor::new(
                buf,
                header.start + reader::HEADER_BYTES,
                header.end(),
                header.compressed,
            )
        };
        let mut c = chunk_cursor();
        while let Some((at, size, mut e, kind)) = reader::next_event(&mut c)? {
            self.pace.tick().map_err(Failure::Limit)?;
            if kind == 1 {
                pool_event(
                    &mut e,
                    &mut values,
                    &pool_classes,
                    &mut pools,
                    &mut |bytes| self.make(bytes),
                )?;
            } else if Some(kind) == active_setting {
                // Two bytes of event, 16 of position: charged (a chunk of millions was
                // gigabytes of positions, uncharged).
                crate::decode::charge::take(16, "a recording's setting events")
                    .map_err(Failure::Limit)?;
                settings.push((at, size));
            }
        }
        for &(at, size) in &settings {
            let mut e = Cursor::new(buf, at, at + size, header.compressed);
            reader::event_size(&mut e)?;
            let class = e.long()?;
            values.read(&mut e, class)?;
            let cls = &metadata.classes[&class];
            let get = |name| match cls.field(name).and_then(|i| values.field(0, i)) {
                Some(Slot::Str(s)) => pools.string(s),
                _ => None,
            };
            if get("name").as_deref() == Some("event")
                && let Some(event) = get("value")
            {
                self.event = Some(event);
            }
        }
        let mut c = chunk_cursor();
        while let Some((at, _, mut e, kind)) = reader::next_event(&mut c)? {
            self.pace.tick().map_err(Failure::Limit)?;
            if let Some(fields) = events.get(&kind) {
                values.read(&mut e, kind)?;
                self.event(at, &values, fields, &pools, header)?;
            }
        }
        let start = header.start_nanos;
        self.start_nanos = Some(self.start_nanos.map_or(start, |s| s.min(start)));
        self.end_nanos = self
            .end_nanos
            .max(start.saturating_add(header.duration_nanos));
        Ok(())
    }

    /// Adds one event to the profiles it belongs to.
    fn event(
        &mut self,
        at: usize,
        v: &Values<'_>,
        f: &EventFields,
        pools: &Pools,
        header: &Header,
    ) -> F<()> {
        let int = |i: Option<usize>| reader::int(v, 0, i);
        let state = int(f.state).and_then(|s| pools.thread_states.get(&s).map(String::as_str));
        let wall_mode = self.event.as_deref() == Some("wall");
        let period = self.period_ns;
        let ns = |ticks: i64| -> i64 {
            (i128::from(ticks) * 1_000_000_000 / i128::from(header.ticks_per_second))
                .clamp(0, i128::from(i64::MAX)) as i64
        };
        let mut adds: [(Option<Kind>, [i64; 2]); 2] = [(None, [0; 2]); 2];
        match f.kind {
            EventKind::ExecutionSample => {
                if state != Some("STATE_SLEEPING") {
                    adds[0] = (Some(Kind::Cpu), [period, 0]);
                }
                if wall_mode {
                    adds[1] = (Some(Kind::Wall), [period, 0]);
                }
            }
            EventKind::WallClockSample => {
                let samples = int(f.samples).unwrap_or(1).max(0);
                let value = samples.saturating_mul(period);
                if state == Some("STATE_RUNNABLE") && wall_mode {
                    adds[0] = (Some(Kind::Cpu), [value, 0]);
                }
                adds[1] = (Some(Kind::Wall), [value, 0]);
            }
            EventKind::AllocInNewTlab => {
                adds[0] = (
                    Some(Kind::AllocInNewTlab),
                    [1, int(f.tlab_size).unwrap_or(0)],
                );
            }
            EventKind::AllocOutsideTlab => {
                adds[0] = (Some(Kind::AllocOutsideTlab), [1, int(f.size).unwrap_or(0)]);
            }
            EventKind::AllocSample => {
                adds[0] = (Some(Kind::AllocSample), [1, int(f.weight).unwrap_or(0)]);
            }
            EventKind::MonitorEnter => {
                adds[0] = (Some(Kind::Lock), [1, ns(int(f.duration).unwrap_or(0))]);
            }
            EventKind::ThreadPark => {
                adds[0] = (Some(Kind::Park), [1, ns(int(f.duration).unwrap_or(0))]);
            }
            EventKind::LiveObject => adds[0] = (Some(Kind::Live), [1, 0]),
            EventKind::Malloc => adds[0] = (Some(Kind::Malloc), [1, int(f.size).unwrap_or(0)]),
        }
        if adds.iter().all(|(k, _)| k.is_none()) {
            return Ok(());
        }
        // An event without a stack (id 0; the JDK writes a few) keeps its value, under
        // one frame that says so ([`NO_STACK`]), rather than being dropped.
        let stack_id = int(f.stack_trace).unwrap_or(0);
        self.events += 1;
        let label_set = self.label_set(
            int(f.context_id).unwrap_or(0),
            int(f.span_id).unwrap_or(0),
            int(f.span_name).unwrap_or(0),
        )?;
        for (kind, values) in adds {
            let Some(kind) = kind else { continue };
            let stack = self.stack(at, kind, stack_id, pools)?;
            let limit = self.limits.max_samples;
            let builder = self.builders[kind as usize].get_or_insert_with(Builder::new);
            let samples = builder.samples.len();
            if !builder.samples.contains_key(&(stack, label_set)) {
                if samples >= limit {
                    return Err(Failure::Limit(Error::TooLarge {
                        what: "samples",
                        limit,
                    }));
                }
                // A new sample holds its stack's frames (twice: its pprof sample, then
                // validated) and its labels.
                let frames = builder.lens.get(stack as usize).copied().unwrap_or(0);
                let labels = self.label_sets.get(label_set as usize).map_or(0, Vec::len);
                self.make(16 * frames + 32 * labels + 64)?;
            }
            let builder = self.builders[kind as usize].get_or_insert_with(Builder::new);
            let slot = builder.samples.entry((stack, label_set)).or_insert([0; 2]);
            slot[0] = slot[0].saturating_add(values[0]);
            slot[1] = slot[1].saturating_add(values[1]);
        }
        Ok(())
    }

    /// The stack (of `kind`'s profile) of a stack trace id.
    fn stack(&mut self, at: usize, kind: Kind, id: i64, pools: &Pools) -> F<u32> {
        if let Some(&stack) = self.stacks.get(&(kind, id)) {
            return Ok(stack);
        }
        let (first, n) = match id {
            0 => (0, 0),
            _ => *pools.stack_traces.get(&id).ok_or_else(|| {
                Failure::Bad(Bad {
                    at,
                    reason: format!(
                        "an event names stack trace {id}, which no constant pool holds"
                    ),
                })
            })?,
        };
        // No stack (id 0), or a stack trace of no frames (the JDK writes both, the
        // second for monitor events of threads with no Java frames).
        if n == 0 {
            let builder = self.builders[kind as usize].get_or_insert_with(Builder::new);
            let stack = vec![builder.location(NO_STACK, 0).map_err(Failure::Limit)?];
            let stack = builder.stack_id(stack);
            self.stacks.insert((kind, id), stack);
            return Ok(stack);
        }
        if n > self.limits.max_stack_depth {
            return Err(Failure::Limit(Error::TooLarge {
                what: "stack depth",
                limit: self.limits.max_stack_depth,
            }));
        }
        let max_locations = self.limits.max_locations;
        let mut stack = Vec::with_capacity(n);
        for &(method, line) in &pools.frames[first..first + n] {
            let function = match self.functions.get(&(kind, method)) {
                Some(&function) => function,
                None => {
                    let name = pools.frame_name(method).map_err(|reason| {
                        Failure::Bad(Bad {
                            at,
                            reason: format!("stack trace {id}: {reason}"),
                        })
                    })?;
                    if name.len() > MAX_FRAME_NAME_BYTES {
                        return Err(Failure::Bad(Bad {
                            at,
                            reason: format!(
                                "stack trace {id}: method {method}'s name is {} bytes, over \
                                 the limit of {MAX_FRAME_NAME_BYTES}",
                                name.len()
                            ),
                        }));
                    }
                    // Held as the string table's entry and key, and the function's key.
                    self.make(3 * name.len() + 64)?;
                    let builder = self.builders[kind as usize].get_or_insert_with(Builder::new);
                    let function = builder.function(&name).map_err(Failure::Limit)?;
                    self.functions.insert((kind, method), function);
                    function
                }
            };
            let builder = self.builders[kind as usize].get_or_insert_with(Builder::new);
            let before = builder.locations.len();
            stack.push(builder.location_of(function, line));
            let made = builder.locations.len() - before;
            if builder.locations.len() > max_locations {
                return Err(Failure::Limit(Error::TooLarge {
                    what: "locations",
                    limit: max_locations,
                }));
            }
            // A location, its line and its key: each kind's builder keeps its own.
            self.make(made * LOCATION_BYTES)?;
        }
        let builder = self.builders[kind as usize].get_or_insert_with(Builder::new);
        let stack = builder.stack_id(stack);
        self.stacks.insert((kind, id), stack);
        Ok(stack)
    }

    /// Counts `bytes` more made, refusing past what the recording may convert to
    /// ([`EXPANSION`]), and charges them to the caller's budget.
    fn make(&mut self, bytes: usize) -> F<()> {
        self.made = self.made.saturating_add(bytes);
        if self.made > self.may_make {
            return Err(Failure::Limit(Error::TooLarge {
                what: "bytes a JFR recording converts to (64 times its own, at least 64 MiB)",
                limit: self.may_make,
            }));
        }
        while self.charged < self.made {
            crate::decode::charge::charge(CHARGE_STEP, "converting a JFR recording")
                .map_err(Failure::Limit)?;
            self.charged = self.charged.saturating_add(CHARGE_STEP);
        }
        Ok(())
    }

    /// The label set of an event's context and span.
    fn label_set(&mut self, context: i64, span_id: i64, span_name: i64) -> F<u32> {
        if let Some(&id) = self.label_set_ids.get(&(context, span_id, span_name)) {
            return Ok(id);
        }
        let strings = &self.labels.strings;
        // What the set's labels take, counted before they are copied: a context may name
        // one long string under thousands of keys.
        let size = |id: &i64| strings.get(id).map_or(0, String::len);
        let bytes = self.labels.contexts.get(&context).map_or(0, |ctx| {
            ctx.labels
                .iter()
                .map(|(k, v)| size(k) + size(v) + 64)
                .sum::<usize>()
        }) + size(&span_name)
            + 128;
        self.make(bytes)?;
        let strings = &self.labels.strings;
        let mut labels: Vec<(String, String)> = Vec::new();
        if let Some(ctx) = self.labels.contexts.get(&context) {
            for (k, v) in &ctx.labels {
                if let (Some(k), Some(v)) = (strings.get(k), strings.get(v))
                    && !k.is_empty()
                    && !v.is_empty()
                {
                    labels.push((k.clone(), v.clone()));
                }
            }
        }
        if span_id != 0 {
            labels.push(("span_id".into(), format!("{:016x}", span_id as u64)));
        }
        if let Some(name) = strings.get(&span_name).filter(|n| !n.is_empty()) {
            labels.push(("span_name".into(), name.clone()));
        }
        labels.sort();
        labels.dedup();
        // Two values of one name (a context's two keys of one text, or a context label
        // named as the event's span): refused, as the store refuses it in a pprof. Before,
        // the smaller value was kept and the other lost without a word.
        if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Failure::Limit(Error::LabelCollision {
                label: w[0].0.clone(),
                first: w[0].1.clone(),
                second: w[1].1.clone(),
            }));
        }
        let id = self.label_sets.len() as u32;
        self.label_sets.push(labels);
        self.label_set_ids.insert((context, span_id, span_name), id);
        Ok(id)
    }

    fn finish(self) -> Result<Recording> {
        let mut profiles = Vec::new();
        let start = self.start_nanos.unwrap_or(0);
        for (k, builder) in self.builders.into_iter().enumerate() {
            let Some(mut b) = builder else { continue };
            if b.samples.is_empty() {
                continue;
            }
            let kind = KIND_ORDER[k];
            let (types, period) = kind.types();
            let sample_type = types
                .iter()
                .map(|(t, u)| {
                    Ok(ValueType {
                        r#type: b.strings.get(t)?,
                        unit: b.strings.get(u)?,
                    })
                })
                .collect::<Result<_>>()?;
            let period_type = ValueType {
                r#type: b.strings.get(period.0)?,
                unit: b.strings.get(period.1)?,
            };
            let mut stacks: Vec<(Vec<u64>, u32)> = b.stacks.into_iter().collect();
            stacks.sort_by_key(|s| s.1);
            let mut samples: Vec<((u32, u32), [i64; 2])> = b.samples.into_iter().collect();
            samples.sort_unstable_by_key(|s| s.0);
            let width = types.len();
            let label_sets: Vec<Vec<Label>> = self
                .label_sets
                .iter()
                .map(|set| {
                    set.iter()
                        .map(|(k, v)| {
                            Ok(Label {
                                key: b.strings.get(k)?,
                                str: b.strings.get(v)?,
                                ..Label::default()
                            })
                        })
                        .collect()
                })
                .collect::<Result<_>>()?;
            let sample = samples
                .into_iter()
                .map(|((stack, set), values)| Sample {
                    location_id: stacks[stack as usize].0.clone(),
                    value: values[..width].to_vec(),
                    label: label_sets[set as usize].clone(),
                })
                .collect();
            let period_value = match kind {
                Kind::Cpu | Kind::Wall => self.period_ns,
                _ => 0,
            };
            profiles.push(Converted {
                profile_name: kind.metric(),
                profile: Profile {
                    sample_type,
                    sample,
                    mapping: vec![Mapping {
                        id: 1,
                        has_functions: true,
                        ..Mapping::default()
                    }],
                    location: b.locations,
                    function: b.functions,
                    string_table: b.strings.into_table(),
                    time_nanos: start,
                    duration_nanos: self.end_nanos.saturating_sub(start).max(0),
                    period_type: Some(period_type),
                    period: period_value,
                    ..Profile::default()
                },
            });
        }
        Ok(Recording {
            profiles,
            event: self.event,
            events: self.events,
        })
    }
}

const KIND_ORDER: [Kind; KINDS] = [
    Kind::Cpu,
    Kind::Wall,
    Kind::AllocInNewTlab,
    Kind::AllocOutsideTlab,
    Kind::AllocSample,
    Kind::Lock,
    Kind::Park,
    Kind::Live,
    Kind::Malloc,
];

/// The ids of the pooled classes stacks need, and the fields read of them.
struct PoolClasses {
    string: Option<i64>,
    symbol: Option<(i64, Option<usize>)>,
    class: Option<(i64, Option<usize>)>,
    method: Option<(i64, Option<usize>, Option<usize>)>,
    stack_trace: Option<(i64, Option<usize>)>,
    /// StackFrame's `method` and `lineNumber`.
    frame: (Option<usize>, Option<usize>),
    thread_state: Option<(i64, Option<usize>)>,
}

impl PoolClasses {
    fn new(m: &Metadata) -> Self {
        let with = |name: &str, field: &str| m.id(name).map(|id| (id, m.classes[&id].field(field)));
        let frame = m
            .id("jdk.types.StackFrame")
            .map(|id| {
                let c = &m.classes[&id];
                (c.field("method"), c.field("lineNumber"))
            })
            .unwrap_or((None, None));
        Self {
            string: m.id("java.lang.String"),
            symbol: with("jdk.types.Symbol", "string"),
            class: with("java.lang.Class", "name"),
            method: m.id("jdk.types.Method").map(|id| {
                let c = &m.classes[&id];
                (id, c.field("type"), c.field("name"))
            }),
            stack_trace: with("jdk.types.StackTrace", "frames"),
            frame,
            thread_state: with("jdk.types.ThreadState", "name"),
        }
    }
}

/// Most bytes a pool may keep of the value in `values`: its texts, and 16 bytes a slot (a
/// frame kept is 16 bytes, and takes a slot at least).
fn values_kept(values: &Values<'_>) -> usize {
    values
        .slots
        .iter()
        .map(|slot| match slot {
            Slot::Str(Str::Text(s)) => 16 + s.len(),
            _ => 16,
        })
        .sum()
}

/// A constant pool event: each pool's values, those stacks need kept, each entry counted
/// to `made` as it is kept (16 bytes a frame: a chunk of stack traces of two-byte frames
/// keeps 8 times its bytes).
fn pool_event(
    c: &mut Cursor<'_>,
    values: &mut Values<'_>,
    classes: &PoolClasses,
    pools: &mut Pools,
    made: &mut dyn FnMut(usize) -> F<()>,
) -> F<()> {
    let _start = c.long()?;
    let _duration = c.long()?;
    let _delta = c.long()?;
    let _flags = c.byte()?;
    let n = c.count("constant pools", 2)?;
    for _ in 0..n {
        let class = c.long()?;
        let entries = c.count("constant pool entries", 1)?;
        for _ in 0..entries {
            let id = c.long()?;
            let at = c.pos;
            values.read(c, class)?;
            let took = c.pos - at;
            let field = |f: Option<usize>| f.and_then(|i| values.field(0, i));
            let id_of = |f: Option<usize>| match field(f) {
                Some(Slot::Ref(r) | Slot::Int(r)) => Some(*r),
                _ => None,
            };
            // At most what the entry's value decoded to is kept: its text, or its frames.
            made(POOL_ENTRY_BYTES + values_kept(values))?;
            if Some(class) == classes.string {
                if let Some(Slot::Str(Str::Text(s))) = values.slots.first() {
                    pools.strings.insert(id, s.clone());
                } else if let Some(Slot::Str(Str::Null)) = values.slots.first() {
                    pools.strings.insert(id, String::new());
                }
            } else if let Some((sym, f)) = classes.symbol
                && sym == class
            {
                if let Some(Slot::Str(s)) = field(f) {
                    pools.symbols.insert(id, s.clone());
                }
            } else if let Some((cls, f)) = classes.class
                && cls == class
            {
                if let Some(name) = id_of(f) {
                    pools.classes.insert(id, name);
                }
            } else if let Some((m, ty, name)) = classes.method
                && m == class
            {
                if let (Some(ty), Some(name)) = (id_of(ty), id_of(name)) {
                    pools.methods.insert(id, (ty, name));
                }
            } else if let Some((st, f)) = classes.stack_trace
                && st == class
            {
                let first = pools.frames.len();
                if let Some(Slot::Array { at: slot, n }) = field(f) {
                    // A frame takes at least two bytes (its method and line, the fields read
                    // of it): frames that take none (a frame class of no fields) would keep
                    // 16 bytes each for nothing read, a megabyte for four bytes of input.
                    if n.saturating_mul(2) > took {
                        return Err(Failure::Bad(reader::Bad {
                            at,
                            reason: format!(
                                "stack trace {id} has {n} frames in {took} bytes (a frame \
                                 takes at least two)"
                            ),
                        }));
                    }
                    let (method, line) = classes.frame;
                    for i in *slot..*slot + *n {
                        let m = reader::int(values, i, method).unwrap_or(0);
                        let l = reader::int(values, i, line).unwrap_or(0);
                        pools.frames.push((m, l));
                    }
                }
                pools
                    .stack_traces
                    .insert(id, (first, pools.frames.len() - first));
            } else if let Some((ts, f)) = classes.thread_state
                && ts == class
                && let Some(Slot::Str(s)) = field(f)
                && let Some(name) = pools.string(s)
            {
                pools.thread_states.insert(id, name);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_class_names_merge_as_pyroscope_merges_them() {
        for (class, merged) in [
            (
                "jdk/internal/reflect/GeneratedMethodAccessor31",
                "jdk/internal/reflect/GeneratedMethodAccessor_",
            ),
            (
                "org/example/OrderService$$Lambda$669.0x0000000800fd7318",
                "org/example/OrderService$$Lambda_",
            ),
            ("Fib$$Lambda.0x00007ffa600c4da0", "Fib$$Lambda_"),
            ("Main$$Lambda$14/0x0000000800c03000", "Main$$Lambda_"),
            ("Main$$Lambda$14", "Main$$Lambda$14"),
            ("java/lang/Thread", "java/lang/Thread"),
            (
                "jdk/internal/reflect/GeneratedMethodAccessor",
                "jdk/internal/reflect/GeneratedMethodAccessor",
            ),
        ] {
            assert_eq!(merge_generated(class), merged, "{class}");
        }
    }

    /// A varint, as JFR writes it.
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// An event of `body`, its size (which counts itself) in front.
    fn event(out: &mut Vec<u8>, body: &[u8]) {
        let mut size = body.len() + 1;
        loop {
            let mut s = Vec::new();
            varint(&mut s, size as u64);
            if s.len() + body.len() == size {
                out.extend_from_slice(&s);
                out.extend_from_slice(body);
                return;
            }
            size = s.len() + body.len();
        }
    }

    /// A one-chunk recording written here: one method, a stack trace of `depth` frames of
    /// it, `samples` execution samples of that stack and `stackless` without a stack.
    fn recording(depth: u64, samples: usize, stackless: usize) -> Vec<u8> {
        recording_of(depth, samples, stackless, "Deep", false)
    }

    /// [`recording`], the method's class named `class`, and with `contexts` each sample
    /// of its own context id (its number).
    fn recording_of(
        depth: u64,
        samples: usize,
        stackless: usize,
        class: &str,
        contexts: bool,
    ) -> Vec<u8> {
        let strings = [
            "root",
            "metadata",
            "class",
            "field",
            "id",
            "name",
            "class",
            "constantPool",
            "dimension",
            "true",
            "1",
            "long",
            "int",
            "boolean",
            "java.lang.String",
            "jdk.types.Symbol",
            "string",
            "java.lang.Class",
            "jdk.types.Method",
            "type",
            "jdk.types.StackFrame",
            "method",
            "lineNumber",
            "jdk.types.StackTrace",
            "truncated",
            "frames",
            "jdk.ExecutionSample",
            "startTime",
            "stackTrace",
            "contextId",
        ];
        let s = |name: &str| strings.iter().position(|x| *x == name).unwrap() as u64;
        let sample_fields: &[(&str, u64, bool, bool)] = if contexts {
            &[
                ("startTime", 1, false, false),
                ("stackTrace", 9, true, false),
                ("contextId", 1, false, false),
            ]
        } else {
            &[
                ("startTime", 1, false, false),
                ("stackTrace", 9, true, false),
            ]
        };
        // (class id, name, [(field, class id, constant pool, array)])
        type Fields<'a> = &'a [(&'a str, u64, bool, bool)];
        let classes: [(u64, &str, Fields<'_>); 10] = [
            (1, "long", &[]),
            (2, "int", &[]),
            (3, "boolean", &[]),
            (4, "java.lang.String", &[]),
            (5, "jdk.types.Symbol", &[("string", 4, false, false)]),
            (6, "java.lang.Class", &[("name", 5, true, false)]),
            (
                7,
                "jdk.types.Method",
                &[("type", 6, true, false), ("name", 5, true, false)],
            ),
            (
                8,
                "jdk.types.StackFrame",
                &[("method", 7, true, false), ("lineNumber", 2, false, false)],
            ),
            (
                9,
                "jdk.types.StackTrace",
                &[("truncated", 3, false, false), ("frames", 8, false, true)],
            ),
            (10, "jdk.ExecutionSample", sample_fields),
        ];
        let ids: Vec<String> = (0..=10).map(|i| i.to_string()).collect();
        let mut strings: Vec<String> = strings.iter().map(|s| s.to_string()).collect();
        strings.extend(ids.iter().cloned());
        let id = |i: u64| 30 + i;
        let mut meta = Vec::new();
        for v in [0u64, 0, 0, 0] {
            varint(&mut meta, v); // type 0, start, duration, metadata id
        }
        varint(&mut meta, strings.len() as u64);
        for x in &strings {
            meta.push(3);
            varint(&mut meta, x.len() as u64);
            meta.extend_from_slice(x.as_bytes());
        }
        // root { metadata { class* } }
        for v in [s("root"), 0, 1, s("metadata"), 0, classes.len() as u64] {
            varint(&mut meta, v);
        }
        for (cid, name, fields) in &classes {
            for v in [
                s("class"),
                2,
                s("id"),
                id(*cid),
                s("name"),
                s(name),
                fields.len() as u64,
            ] {
                varint(&mut meta, v);
            }
            for (fname, fclass, cp, array) in fields.iter() {
                let attrs = 2 + u64::from(*cp) + u64::from(*array);
                for v in [
                    s("field"),
                    attrs,
                    s("name"),
                    s(fname),
                    s("class"),
                    id(*fclass),
                ] {
                    varint(&mut meta, v);
                }
                if *cp {
                    varint(&mut meta, s("constantPool"));
                    varint(&mut meta, s("true"));
                }
                if *array {
                    varint(&mut meta, s("dimension"));
                    varint(&mut meta, s("1"));
                }
                varint(&mut meta, 0);
            }
        }
        let mut pool = Vec::new();
        for v in [1u64, 0, 0, 0] {
            varint(&mut pool, v); // type 1, start, duration, delta
        }
        pool.push(0); // flags
        varint(&mut pool, 4); // pools: Symbol, Class, Method, StackTrace
        let text = |out: &mut Vec<u8>, t: &str| {
            out.push(3);
            varint(out, t.len() as u64);
            out.extend_from_slice(t.as_bytes());
        };
        for v in [5u64, 2, 1] {
            varint(&mut pool, v);
        }
        text(&mut pool, class);
        varint(&mut pool, 2);
        text(&mut pool, "recurse");
        for v in [6u64, 1, 1, 1, 7, 1, 1, 1, 2, 9, 1, 1] {
            varint(&mut pool, v); // Class 1 {name 1}, Method 1 {Class 1, name 2}, StackTrace 1
        }
        pool.push(0); // not truncated
        varint(&mut pool, depth);
        for line in 0..depth {
            varint(&mut pool, 1);
            varint(&mut pool, line);
        }
        let mut body = Vec::new();
        let mut bytes = Vec::new();
        event(&mut bytes, &pool);
        for t in 0..samples + stackless {
            body.clear();
            for v in [10u64, t as u64 % 100, u64::from(t < samples)] {
                varint(&mut body, v);
            }
            if contexts {
                varint(&mut body, t as u64 + 1);
            }
            event(&mut bytes, &body);
        }
        let metadata_offset = reader::HEADER_BYTES + bytes.len();
        event(&mut bytes, &meta);
        chunk_of(
            &bytes,
            reader::HEADER_BYTES,
            metadata_offset,
            1_700_000_000_000_000_000,
        )
    }

    /// A chunk of `events` (its constant pool at `pool`, 0 for none, and its metadata at
    /// `metadata`), starting at `start_ns` and lasting a second; integers compressed.
    fn chunk_of(events: &[u8], pool: usize, metadata: usize, start_ns: i64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"FLR\0");
        out.extend_from_slice(&2u16.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        let size = (reader::HEADER_BYTES + events.len()) as i64;
        for v in [
            size,
            pool as i64,
            metadata as i64,
            start_ns,
            1_000_000_000,
            0,
            1_000_000_000,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&1i32.to_be_bytes());
        out.extend_from_slice(events);
        out
    }

    /// A chunk of no pools: its metadata one class `X` of `fields` fields and the class
    /// `jdk.ActiveSetting`, then `settings` setting events of two bytes.
    fn settings_chunk(fields: usize, settings: usize) -> Vec<u8> {
        let strings = [
            "root",
            "metadata",
            "class",
            "id",
            "name",
            "field",
            "1",
            "2",
            "X",
            "jdk.ActiveSetting",
        ];
        let s = |name: &str| strings.iter().position(|x| *x == name).unwrap() as u64;
        let mut meta = Vec::new();
        for v in [0u64, 0, 0, 0, strings.len() as u64] {
            varint(&mut meta, v);
        }
        for x in strings {
            meta.push(3);
            varint(&mut meta, x.len() as u64);
            meta.extend_from_slice(x.as_bytes());
        }
        for v in [s("root"), 0, 1, s("metadata"), 0, 2] {
            varint(&mut meta, v);
        }
        for v in [
            s("class"),
            2,
            s("id"),
            s("1"),
            s("name"),
            s("X"),
            fields as u64,
        ] {
            varint(&mut meta, v);
        }
        for _ in 0..fields {
            for v in [s("field"), 2, s("name"), s("X"), s("class"), s("1"), 0] {
                varint(&mut meta, v);
            }
        }
        for v in [
            s("class"),
            2,
            s("id"),
            s("2"),
            s("name"),
            s("jdk.ActiveSetting"),
            0,
        ] {
            varint(&mut meta, v);
        }
        let mut bytes = Vec::new();
        for _ in 0..settings {
            event(&mut bytes, &[2]);
        }
        let metadata_offset = reader::HEADER_BYTES + bytes.len();
        event(&mut bytes, &meta);
        chunk_of(&bytes, 0, metadata_offset, 0)
    }

    /// A chunk's metadata may have 65,536 elements (a JDK's has a few thousand), and its
    /// setting events' positions are charged as they are kept: before, millions of either
    /// were gigabytes, uncharged, from a small gzipped recording.
    #[test]
    fn metadata_elements_are_bounded_and_setting_events_charged() {
        let limits = Limits::default();
        let many = settings_chunk(reader::MAX_METADATA_ELEMENTS, 0);
        let e = convert(&many, None, 100, &limits).unwrap_err().to_string();
        assert!(e.contains("metadata of more than 65536 elements"), "{e}");
        let settings = settings_chunk(10, 1_000_000);
        let (got, _) =
            crate::decode::charge::under_budget(4 << 20, || convert(&settings, None, 100, &limits));
        let e = got.unwrap_err().to_string();
        assert!(e.contains("setting events"), "{e}");
        let (_, asked) = crate::decode::charge::under_budget(usize::MAX, || {
            convert(&settings, None, 100, &limits)
        });
        assert!(asked >= 16_000_000, "{asked}");
    }

    /// What the constant pools and each kind's locations keep is charged as it is kept:
    /// one stack trace of 60,000 frames of distinct lines is 60,000 locations and pool
    /// frames. Before, only frame names and samples were charged, a tenth of it.
    #[test]
    fn pools_and_locations_are_charged_as_they_are_kept() {
        let depth = 60_000;
        let r = recording(depth, 1, 0);
        let limits = Limits {
            max_stack_depth: 65_536,
            ..Limits::default()
        };
        let charged = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let seen = charged.clone();
        crate::charging(
            move |bytes, _| {
                seen.set(seen.get() + bytes);
                Ok(())
            },
            || convert(&r, None, 100, &limits),
        )
        .unwrap();
        let kept = depth as usize * (LOCATION_BYTES + POOL_ENTRY_BYTES / 4);
        assert!(
            charged.get() >= kept,
            "{} charged, {kept} kept",
            charged.get()
        );
    }

    /// Samples of distinct contexts on one deep stack each hold its frames: 100,000 of
    /// them on 4,096 frames are 6.5 GB made of a 1 MB recording. They are refused once
    /// they pass 64 times the recording (charged to the caller's budget as they are
    /// made); a thousand pass.
    #[test]
    fn samples_of_many_contexts_on_a_deep_stack_are_bounded_by_the_recordings_size() {
        let r = recording_of(4_096, 100_000, 0, "Deep", true);
        assert!(r.len() < 2 << 20, "{}", r.len());
        let e = convert(&r, None, 100, &Limits::default()).unwrap_err();
        assert!(
            e.to_string().contains("bytes a JFR recording converts to"),
            "{e}"
        );
        let charged = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let seen = charged.clone();
        let e = crate::charging(
            move |bytes, _| {
                seen.set(seen.get() + bytes);
                match seen.get() > 8 << 20 {
                    true => Err(Error::Unavailable("over the budget".into())),
                    false => Ok(()),
                }
            },
            || convert(&r, None, 100, &Limits::default()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("over the budget"), "{e}");
        assert!(charged.get() > 8 << 20);
        let few = recording_of(4_096, 1_000, 0, "Deep", true);
        let cpu = &convert(&few, None, 100, &Limits::default())
            .unwrap()
            .profiles[0]
            .profile;
        assert_eq!(cpu.sample.len(), 1_000);
        assert!(cpu.sample.iter().all(|s| s.location_id.len() == 4_096));
    }

    /// Two labels of one name in a sample's context (two keys naming one text) are
    /// refused naming both values, as the store refuses them in a pprof: before, one of
    /// them was kept and the other lost, silently.
    #[test]
    fn a_context_naming_a_label_twice_is_refused() {
        let snapshot = |labels: &[(i64, i64)]| {
            let snapshot = LabelsSnapshot {
                contexts: [(
                    1,
                    Context {
                        labels: labels.iter().copied().collect(),
                    },
                )]
                .into(),
                strings: [(1, "env"), (2, "env"), (3, "b"), (4, "a")]
                    .map(|(k, v)| (k, v.to_owned()))
                    .into(),
            };
            prost::Message::encode_to_vec(&snapshot)
        };
        let r = recording_of(1, 1, 0, "Deep", true);
        let e = convert(
            &r,
            Some(&snapshot(&[(1, 3), (2, 4)])),
            100,
            &Limits::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("env") && e.contains("given twice"), "{e}");
        let one = convert(&r, Some(&snapshot(&[(1, 3)])), 100, &Limits::default()).unwrap();
        assert_eq!(one.profiles.len(), 1);
    }

    /// A labels part is charged what it decodes to before it is decoded: a megabyte of
    /// empty contexts (2 bytes each, tens decoded) under a 16 MiB charge is refused.
    #[test]
    fn a_labels_part_is_charged_before_it_is_decoded() {
        let labels = [0x12u8, 0x00].repeat(1 << 19);
        let e = crate::charging(
            |bytes, what| match bytes > 16 << 20 {
                true => Err(Error::Unavailable(format!("{what}: {bytes} bytes"))),
                false => Ok(()),
            },
            || convert(&recording(1, 1, 0), Some(&labels), 100, &Limits::default()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("decoding a JFR labels part"), "{e}");
        let fits = crate::charging(
            |_, _| Ok(()),
            || convert(&recording(1, 1, 0), Some(&labels), 100, &Limits::default()),
        );
        assert!(fits.is_ok());
    }

    /// A class name of a megabyte, named by a method: refused naming the limit, rather
    /// than made into frame names of a megabyte each (and hashed at every frame).
    #[test]
    fn a_frame_name_longer_than_the_limit_is_refused() {
        let long = "A".repeat(1 << 20);
        let e = convert(
            &recording_of(2, 1, 0, &long, false),
            None,
            100,
            &Limits::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("over the limit of 65535"), "{e}");
        let fits = "A".repeat(60_000);
        let converted = convert(
            &recording_of(2, 1, 0, &fits, false),
            None,
            100,
            &Limits::default(),
        )
        .unwrap();
        let cpu = &converted.profiles[0].profile;
        assert_eq!(
            cpu.string_table[cpu.function[0].name as usize],
            format!("{fits}.recurse")
        );
    }

    #[test]
    fn a_deep_stack_named_by_many_events_is_resolved_once() {
        // 2,000 frames named by 200,000 four-byte events: 400 million frames if each event
        // resolved its stack, 2,000 as it is.
        let r = recording(2_000, 200_000, 0);
        let converted = convert(&r, None, 100, &Limits::default()).unwrap();
        let cpu = &converted.profiles[0].profile;
        assert_eq!(cpu.sample.len(), 1);
        assert_eq!(cpu.sample[0].location_id.len(), 2_000);
        assert_eq!(cpu.sample[0].value, [200_000 * 10_000_000]);
        assert_eq!(
            cpu.string_table[cpu.function[0].name as usize],
            "Deep.recurse"
        );
    }

    #[test]
    fn metadata_names_are_shared_with_the_string_table_not_copied_per_element() {
        // Elements naming one string hold it once: many elements naming a long string
        // cost a pointer each, not the string each.
        let r = recording(1, 1, 0);
        let header = reader::Header::read(&r, 0).unwrap();
        let metadata = reader::Metadata::read(&r, &header).unwrap();
        let class = |name: &str| &metadata.classes[&metadata.id(name).unwrap()];
        let (of_class, of_method) = (class("java.lang.Class"), class("jdk.types.Method"));
        let name = |c: &reader::Class| c.fields[c.field("name").unwrap()].name.clone();
        assert!(std::rc::Rc::ptr_eq(&name(of_class), &name(of_method)));
    }

    #[test]
    fn a_stack_trace_of_frames_that_take_no_bytes_is_refused_before_it_is_kept() {
        // StackFrame a class of no fields: an array of 65,536 frames takes the three bytes of
        // its length, and would keep a megabyte for every constant pool entry.
        let mut metadata = reader::Metadata::default();
        let class = |name: &str, fields: Vec<reader::Field>| reader::Class {
            name: name.into(),
            kind: reader::Kind::Struct,
            fields,
        };
        metadata
            .classes
            .insert(8, class("jdk.types.StackFrame", Vec::new()));
        metadata.classes.insert(
            9,
            class(
                "jdk.types.StackTrace",
                vec![reader::Field {
                    name: "frames".into(),
                    class: 8,
                    constant_pool: false,
                    array: true,
                }],
            ),
        );
        let mut bytes = Vec::new();
        for v in [0u64, 0, 0] {
            varint(&mut bytes, v); // start, duration, delta
        }
        bytes.push(0); // flags
        for v in [1u64, 9] {
            varint(&mut bytes, v); // one pool, of StackTrace
        }
        let entries = 1_000u64;
        varint(&mut bytes, entries);
        for id in 1..=entries {
            varint(&mut bytes, id);
            varint(&mut bytes, reader::MAX_ARRAY as u64);
        }
        let mut c = Cursor::new(&bytes, 0, bytes.len(), true);
        let mut values = Values::new(&metadata);
        let mut pools = Pools::default();
        let Err(Failure::Bad(e)) = pool_event(
            &mut c,
            &mut values,
            &PoolClasses::new(&metadata),
            &mut pools,
            &mut |_| Ok(()),
        ) else {
            panic!("refused as bad input");
        };
        assert!(e.reason.contains("65536 frames in 3 bytes"), "{}", e.reason);
        assert!(
            pools.frames.is_empty(),
            "{} frames kept",
            pools.frames.len()
        );
    }

    #[test]
    fn events_without_a_stack_keep_their_value_under_one_frame() {
        let converted = convert(&recording(3, 5, 2), None, 100, &Limits::default()).unwrap();
        let cpu = &converted.profiles[0].profile;
        let name = |s: &Sample| {
            let location = &cpu.location[s.location_id[0] as usize - 1];
            let function = &cpu.function[location.line[0].function_id as usize - 1];
            cpu.string_table[function.name as usize].clone()
        };
        let no_stack: Vec<&Sample> = cpu.sample.iter().filter(|s| name(s) == NO_STACK).collect();
        assert_eq!(no_stack.len(), 1);
        assert_eq!(no_stack[0].value, [2 * 10_000_000]);
        assert_eq!(
            cpu.sample.iter().map(|s| s.value[0]).sum::<i64>(),
            7 * 10_000_000
        );
        assert_eq!(converted.events, 7);
    }

    #[test]
    fn a_stack_trace_of_no_frames_is_the_no_stack_frame() {
        // The JDK writes stack traces of no frames (monitor events of threads with no Java
        // frames): their samples get the one frame, never a sample without locations.
        let converted = convert(&recording(0, 5, 0), None, 100, &Limits::default()).unwrap();
        let cpu = &converted.profiles[0].profile;
        assert_eq!(cpu.sample.len(), 1);
        assert_eq!(cpu.sample[0].location_id.len(), 1);
        assert_eq!(cpu.sample[0].value, [5 * 10_000_000]);
        let location = &cpu.location[cpu.sample[0].location_id[0] as usize - 1];
        let function = &cpu.function[location.line[0].function_id as usize - 1];
        assert_eq!(cpu.string_table[function.name as usize], NO_STACK);
    }

    #[test]
    fn stacks_over_the_limits_are_refused() {
        let r = recording(5_000, 1, 0);
        let e = convert(&r, None, 100, &Limits::default()).unwrap_err();
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded, "{e}");
        let r = recording(70_000, 1, 0);
        let e = convert(&r, None, 100, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("an array of 70000 elements"), "{e}");
    }

    #[test]
    fn bytes_that_are_not_jfr_are_refused_naming_the_byte() {
        let e = convert(b"not a recording", None, 100, &Limits::default()).unwrap_err();
        assert!(
            e.to_string().contains("byte 0") && e.to_string().contains("FLR"),
            "{e}"
        );
        let e = convert(b"", None, 100, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }
}
