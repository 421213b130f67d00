//! A bounded reader of JFR recordings: chunks, their metadata, constant pools and events.
//!
//! A recording is one chunk after another. A chunk is a 68-byte header (magic `FLR\0`,
//! version, the chunk's size, where its last constant pool and its metadata are, its start
//! time and ticks per second, and whether its integers are compressed) and then events,
//! each `size` (an int counting itself), `type` (a long) and the fields its class declares.
//! Type 0 is the metadata event: a string table and a tree of elements (`class` elements
//! with `field` children) that says each class's fields. Type 1 is a constant pool
//! (checkpoint) event: for some classes, `(id, value)` pairs that other values name by id.
//! Compressed integers are little-endian base-128 varints, the ninth byte of a long
//! holding eight bits; floats and doubles are big-endian. (The JDK's `jdk.jfr.internal`
//! consumer and grafana/jfr-parser read it so; the code is our own.)
//!
//! Hostile input is the assumption: every length and count is checked against the bytes
//! left before anything is reserved, a value of nested classes is read with a stack of our
//! own (never recursively), and what one value may materialise is bounded by the bytes it
//! took (`Values::most_slots`), so a class that contains itself or an array of empty structs
//! is an error, not a hang or an allocation; metadata names are shared, never copied per
//! element.

/// Hash maps of the reader (foldhash).
use std::rc::Rc;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The most elements an array value may have: far over the deepest stack a JVM records
/// (2,048 frames), and what keeps one value's slots to a few megabytes.
pub(super) const MAX_ARRAY: usize = 1 << 16;

/// Most strings a chunk's metadata may hold (a JDK's recording holds a few thousand).
const MAX_METADATA_STRINGS: usize = 1 << 20;

/// Most metadata elements open around one (a recording's nest 4 or 5 deep): each open one
/// is a slot of the walk's stack, and an element takes 3 bytes, so a 128 MiB metadata
/// event of nothing but nesting held gigabytes of stack.
const MAX_METADATA_DEPTH: usize = 64;

/// The chunk header's size.
pub(super) const HEADER_BYTES: usize = 68;
const MAGIC: &[u8; 4] = b"FLR\0";

/// What is wrong, and the byte (from the start of the recording) where it was found.
#[derive(Debug)]
pub(super) struct Bad {
    pub(super) at: usize,
    pub(super) reason: String,
}

pub(super) type R<T> = std::result::Result<T, Bad>;

/// Elements a chunk's metadata may have (a JDK 17 recording's has about 5,000).
pub(super) const MAX_METADATA_ELEMENTS: usize = 1 << 16;

fn bad<T>(at: usize, reason: impl Into<String>) -> R<T> {
    Err(Bad {
        at,
        reason: reason.into(),
    })
}

/// Bytes read from a position, integers compressed or not.
#[derive(Clone)]
pub(super) struct Cursor<'a> {
    buf: &'a [u8],
    pub(super) pos: usize,
    /// Where this cursor must stop (the end of the event or chunk it reads).
    pub(super) end: usize,
    compressed: bool,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(buf: &'a [u8], pos: usize, end: usize, compressed: bool) -> Self {
        Self {
            buf,
            pos,
            end: end.min(buf.len()),
            compressed,
        }
    }

    pub(super) fn left(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    pub(super) fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.left() {
            return bad(
                self.pos,
                format!("{n} bytes are needed and {} are left", self.left()),
            );
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    pub(super) fn byte(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A varint long: seven bits a byte, low first; the ninth byte has eight.
    fn varint(&mut self) -> R<i64> {
        let start = self.pos;
        let mut value: u64 = 0;
        for i in 0..8 {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value as i64);
            }
        }
        let b = self.byte().map_err(|_| Bad {
            at: start,
            reason: "a varint runs past the end".into(),
        })?;
        Ok((value | (u64::from(b) << 56)) as i64)
    }

    pub(super) fn long(&mut self) -> R<i64> {
        if self.compressed {
            self.varint()
        } else {
            Ok(i64::from_be_bytes(self.be()?))
        }
    }

    pub(super) fn int(&mut self) -> R<i32> {
        if self.compressed {
            // The JDK writes an int as the varint of its 32 bits unsigned; a writer that
            // sign-extends to 64 bits is read alike.
            let at = self.pos;
            let v = self.varint()?;
            match u32::try_from(v) {
                Ok(u) => Ok(u as i32),
                Err(_) => {
                    i32::try_from(v).or_else(|_| bad(at, format!("the int {v} is out of range")))
                }
            }
        } else {
            Ok(i32::from_be_bytes(self.be()?))
        }
    }

    fn short(&mut self) -> R<i64> {
        if self.compressed {
            self.varint()
        } else {
            Ok(i64::from(i16::from_be_bytes(self.be()?)))
        }
    }

    /// A count (of elements, strings, pool entries): not negative, and each of them takes
    /// at least `min_bytes`, so no more than the bytes left allow.
    pub(super) fn count(&mut self, what: &str, min_bytes: usize) -> R<usize> {
        let at = self.pos;
        let n = self.int()?;
        let n = usize::try_from(n).or_else(|_| bad(at, format!("{what}: negative count {n}")))?;
        if n.saturating_mul(min_bytes) > self.left() {
            return bad(
                at,
                format!(
                    "{what}: {n} declared and only {} bytes are left",
                    self.left()
                ),
            );
        }
        Ok(n)
    }

    /// A string value: null, empty, a reference into the `java.lang.String` pool, or UTF-8,
    /// UTF-16 or Latin-1 characters.
    pub(super) fn string(&mut self) -> R<Str> {
        let at = self.pos;
        match self.byte()? {
            0 => Ok(Str::Null),
            1 => Ok(Str::Text(String::new())),
            2 => Ok(Str::Ref(self.long()?)),
            3 => {
                let n = self.count("string length", 1)?;
                let bytes = self.take(n)?;
                match std::str::from_utf8(bytes) {
                    Ok(s) => Ok(Str::Text(s.to_owned())),
                    Err(_) => bad(at, "a UTF-8 string is not valid UTF-8"),
                }
            }
            4 => {
                // Decoded as the units are read: a unit is a byte at least, so reserving
                // `n` units up front was twice the bytes left, before any was read.
                let n = self.count("string length", 1)?;
                let mut failed = Ok(());
                let mut left = n;
                let units = std::iter::from_fn(|| {
                    left = left.checked_sub(1)?;
                    self.short()
                        .map(|c| c as u16)
                        .map_err(|e| failed = Err(e))
                        .ok()
                });
                let text: String = char::decode_utf16(units)
                    .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                    .collect();
                failed?;
                Ok(Str::Text(text))
            }
            5 => {
                let n = self.count("string length", 1)?;
                Ok(Str::Text(
                    self.take(n)?.iter().map(|&b| b as char).collect(),
                ))
            }
            e => bad(at, format!("unknown string encoding {e}")),
        }
    }
}

/// A string as a value holds it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Str {
    Null,
    Text(String),
    /// An id in the chunk's `java.lang.String` pool.
    Ref(i64),
}

/// A chunk's header.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    /// Where the chunk starts in the recording.
    pub(super) start: usize,
    /// Its size, header included.
    pub(super) size: usize,
    pub(super) metadata_offset: usize,
    pub(super) start_nanos: i64,
    pub(super) duration_nanos: i64,
    pub(super) ticks_per_second: i64,
    pub(super) compressed: bool,
}

impl Header {
    /// The header of the chunk at `start`.
    pub(super) fn read(buf: &[u8], start: usize) -> R<Self> {
        let mut c = Cursor::new(buf, start, buf.len(), false);
        let magic = c
            .take(4)
            .or_else(|_| bad(start, "a chunk header is cut short"))?;
        if magic != MAGIC {
            return bad(start, "not a JFR chunk (no FLR magic)");
        }
        if c.left() < HEADER_BYTES - 4 {
            return bad(start, "a chunk header is cut short");
        }
        let major = u16::from_be_bytes(c.be()?);
        let _minor = u16::from_be_bytes(c.be()?);
        if !(1..=2).contains(&major) {
            return bad(start + 4, format!("JFR version {major} is not 1 or 2"));
        }
        let size = i64::from_be_bytes(c.be()?);
        let _constant_pool_offset = i64::from_be_bytes(c.be()?);
        let metadata_offset = i64::from_be_bytes(c.be()?);
        let start_nanos = i64::from_be_bytes(c.be()?);
        let duration_nanos = i64::from_be_bytes(c.be()?);
        let _start_ticks = i64::from_be_bytes(c.be()?);
        let ticks_per_second = i64::from_be_bytes(c.be()?);
        let features = i32::from_be_bytes(c.be()?);
        let left = buf.len() - start;
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size < HEADER_BYTES {
            return bad(
                start + 8,
                format!("the chunk size {size} is under its header's"),
            );
        }
        if size > left {
            return bad(
                start + 8,
                format!("the chunk says it is {size} bytes and {left} are left (truncated?)"),
            );
        }
        let metadata_offset = usize::try_from(metadata_offset).unwrap_or(usize::MAX);
        if metadata_offset < HEADER_BYTES || metadata_offset >= size {
            return bad(
                start + 24,
                format!("the metadata offset {metadata_offset} is outside the chunk"),
            );
        }
        if ticks_per_second <= 0 {
            return bad(
                start + 56,
                format!("ticks per second {ticks_per_second} is not positive"),
            );
        }
        Ok(Self {
            start,
            size,
            metadata_offset,
            start_nanos,
            duration_nanos: duration_nanos.max(0),
            ticks_per_second,
            compressed: major >= 2 && features & 1 != 0,
        })
    }

    pub(super) fn end(&self) -> usize {
        self.start + self.size
    }
}

/// What kind of value a class is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Boolean,
    Byte,
    Short,
    Char,
    Int,
    Long,
    Float,
    Double,
    String,
    /// Its fields, one after another.
    Struct,
}

impl Kind {
    fn of(name: &str) -> Self {
        match name {
            "boolean" => Self::Boolean,
            "byte" => Self::Byte,
            "short" => Self::Short,
            "char" => Self::Char,
            "int" => Self::Int,
            "long" => Self::Long,
            "float" => Self::Float,
            "double" => Self::Double,
            "java.lang.String" => Self::String,
            _ => Self::Struct,
        }
    }
}

/// A class the metadata declares.
#[derive(Debug, Clone)]
pub(super) struct Class {
    /// Shared with the metadata's string table: a name given to many elements is held once.
    pub(super) name: Rc<str>,
    pub(super) kind: Kind,
    pub(super) fields: Vec<Field>,
}

impl Class {
    /// The index of the field named `name`.
    pub(super) fn field(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| &*f.name == name)
    }
}

/// A field of a class.
#[derive(Debug, Clone)]
pub(super) struct Field {
    pub(super) name: Rc<str>,
    pub(super) class: i64,
    /// Its value is an id into the class's constant pool.
    pub(super) constant_pool: bool,
    /// An array of values.
    pub(super) array: bool,
}

/// The classes a chunk's metadata declares, by id.
#[derive(Debug, Default)]
pub(super) struct Metadata {
    pub(super) classes: HashMap<i64, Class>,
}

impl Metadata {
    /// The id of the class named `name`.
    pub(super) fn id(&self, name: &str) -> Option<i64> {
        self.classes
            .iter()
            .find(|(_, c)| &*c.name == name)
            .map(|(&id, _)| id)
    }

    /// The metadata event of the chunk.
    pub(super) fn read(buf: &[u8], header: &Header) -> R<Self> {
        let at = header.start + header.metadata_offset;
        let mut c = Cursor::new(buf, at, header.end(), header.compressed);
        let size = event_size(&mut c)?;
        c.end = at + size;
        let kind = c.long()?;
        if kind != 0 {
            return bad(
                at,
                format!("the metadata offset points at an event of type {kind}"),
            );
        }
        let _start = c.long()?;
        let _duration = c.long()?;
        let _id = c.long()?;
        let n = c.count("metadata strings", 1)?;
        if n > MAX_METADATA_STRINGS {
            return bad(
                at,
                format!("{n} metadata strings (at most {MAX_METADATA_STRINGS})"),
            );
        }
        // Grown as they are read (a string may be one byte, a slot 16), the null ones
        // sharing one empty string.
        let empty: Rc<str> = "".into();
        let mut strings: Vec<Rc<str>> = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let at = c.pos;
            strings.push(match c.string()? {
                Str::Text(s) => s.into(),
                Str::Null => empty.clone(),
                Str::Ref(_) => return bad(at, "a metadata string refers to a constant pool"),
            });
        }
        // The element tree, walked with our own stack: (element name, children left). Names
        // and attributes are the string table's, never copied: a metadata of many elements
        // naming one long string holds that string once.
        let mut metadata = Metadata::default();
        let mut open: Vec<(&str, usize)> = Vec::new();
        let mut class: Option<(i64, Class)> = None;
        let mut root = true;
        // Elements read: five bytes each may be a field of 32 kept (a metadata event of
        // millions of them was gigabytes, uncharged); a JDK's metadata has a few thousand.
        let mut elements = 0usize;
        while root || !open.is_empty() {
            elements += 1;
            if elements > MAX_METADATA_ELEMENTS {
                return bad(
                    c.pos,
                    format!("metadata of more than {MAX_METADATA_ELEMENTS} elements"),
                );
            }
            if let Some((name, left)) = open.last_mut() {
                if *left == 0 {
                    if *name == "class"
                        && let Some((id, done)) = class.take()
                    {
                        metadata.classes.insert(id, done);
                    }
                    open.pop();
                    continue;
                }
                *left -= 1;
            }
            root = false;
            let parent = open.last().map(|(n, _)| *n).unwrap_or("");
            let parent_is_class = parent == "class";
            let name: &str = meta_string(&strings, &mut c)?;
            let attrs = c.count("element attributes", 2)?;
            let mut attributes: HashMap<&str, &Rc<str>> = HashMap::default();
            for _ in 0..attrs {
                let key = meta_string(&strings, &mut c)?;
                let value = meta_string(&strings, &mut c)?;
                attributes.insert(&**key, value);
            }
            let text = |key: &str| attributes.get(key).map_or("", |v| &***v);
            let shared = |key: &str| {
                attributes
                    .get(key)
                    .map_or_else(|| Rc::from(""), |v| Rc::clone(v))
            };
            let children = c.count("element children", 3)?;
            let number = |key: &str| -> R<i64> {
                let v = text(key);
                v.parse().or_else(|_| {
                    bad(
                        c.pos,
                        format!("metadata {name} attribute {key} {v:?} is not a number"),
                    )
                })
            };
            if name == "class" {
                let class_name = shared("name");
                class = Some((
                    number("id")?,
                    Class {
                        kind: Kind::of(&class_name),
                        name: class_name,
                        fields: Vec::new(),
                    },
                ));
            } else if name == "field" && parent_is_class {
                let field = Field {
                    name: shared("name"),
                    class: number("class")?,
                    constant_pool: text("constantPool") == "true",
                    array: text("dimension").parse::<i64>().unwrap_or(0) > 0,
                };
                if let Some((_, c)) = class.as_mut() {
                    c.fields.push(field);
                }
            }
            if open.len() == MAX_METADATA_DEPTH {
                return bad(
                    c.pos,
                    format!(
                        "metadata elements nested more than {MAX_METADATA_DEPTH} deep (a \
                         recording's are 4 or 5)"
                    ),
                );
            }
            open.push((name, children));
        }
        // Every field's class is declared.
        for class in metadata.classes.values() {
            for f in &class.fields {
                if !metadata.classes.contains_key(&f.class) {
                    return bad(
                        at,
                        format!(
                            "field {}.{} is of class {}, which the metadata does not declare",
                            class.name, f.name, f.class
                        ),
                    );
                }
            }
        }
        Ok(metadata)
    }
}

/// A metadata string, by its index in the metadata's string table.
fn meta_string<'s>(strings: &'s [Rc<str>], c: &mut Cursor<'_>) -> R<&'s Rc<str>> {
    let at = c.pos;
    let i = c.int()?;
    usize::try_from(i)
        .ok()
        .and_then(|i| strings.get(i))
        .ok_or(Bad {
            at,
            reason: format!("metadata string {i} of {}", strings.len()),
        })
}

/// An event's size, checked to lie within what the cursor may read; the cursor is left
/// after the size.
pub(super) fn event_size(c: &mut Cursor<'_>) -> R<usize> {
    let at = c.pos;
    let size = c.int()?;
    let size = usize::try_from(size).unwrap_or(0);
    let read = c.pos - at;
    if size <= read || size > c.end - at {
        return bad(
            at,
            format!(
                "an event's size {size} does not fit in the {} bytes left",
                c.end - at
            ),
        );
    }
    Ok(size)
}

/// The next event of a chunk: where it starts, its size, a cursor on it after its type,
/// and its type; the chunk's cursor is left after it. `None` at the chunk's end.
pub(super) fn next_event<'a>(c: &mut Cursor<'a>) -> R<Option<(usize, usize, Cursor<'a>, i64)>> {
    if c.left() == 0 {
        return Ok(None);
    }
    let at = c.pos;
    let size = event_size(c)?;
    let mut e = c.clone();
    e.end = at + size;
    let kind = e.long()?;
    c.pos = at + size;
    Ok(Some((at, size, e, kind)))
}

/// A value read: leaves, and structs and arrays whose parts are other slots.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Slot {
    Int(i64),
    Float(f64),
    Str(Str),
    /// An id in the field class's constant pool.
    Ref(i64),
    /// Fields (or array elements) in slots `at..at + n`.
    Struct {
        at: usize,
        n: usize,
    },
    Array {
        at: usize,
        n: usize,
    },
}

/// Reads values of the metadata's classes into slots, reusing them from one value to the
/// next.
pub(super) struct Values<'m> {
    pub(super) metadata: &'m Metadata,
    pub(super) slots: Vec<Slot>,
    /// The values still to read, kept from one value to the next.
    tasks: Vec<Task>,
    /// Where the value being read starts: its slots are bounded by the bytes it has taken.
    start: usize,
    /// Over every value read: values, the bytes they took, the slots they held. All of
    /// them together get one array's room ([`Values::most_slots_in_all`]), not one each.
    reads: usize,
    read_bytes: usize,
    held: usize,
}

enum Task {
    Value {
        slot: usize,
        class: i64,
        constant_pool: bool,
        array: bool,
    },
}

impl<'m> Values<'m> {
    pub(super) fn new(metadata: &'m Metadata) -> Self {
        Self {
            metadata,
            slots: Vec::new(),
            tasks: Vec::new(),
            start: 0,
            reads: 0,
            read_bytes: 0,
            held: 0,
        }
    }

    /// Most slots all values read so far may have held, once the one being read has taken
    /// `bytes`: two a byte, 64 a value and one array's room in all. Each value alone may
    /// hold an array's room ([`Values::most_slots`]), but a value of a few bytes (an array
    /// of 65,536 structs of no fields is 3) is not that many slots again and again: a
    /// chunk of such values would take hours.
    fn most_slots_in_all(&self, bytes: usize) -> usize {
        self.read_bytes
            .saturating_add(bytes)
            .saturating_mul(2)
            .saturating_add(self.reads.saturating_mul(64))
            .saturating_add(MAX_ARRAY)
    }

    /// Most slots a value may hold once it has taken `bytes`: a leaf takes at least a byte
    /// and a struct's slot is its fields', so real values hold about two slots a byte; the
    /// room of one array or struct more lets a value reserve its parts before reading them.
    /// Values that take no bytes (structs of no fields, a class that contains itself) meet
    /// it after one array's worth, however many a value nests: what a value holds stays
    /// proportional to what it took, never to the bytes left after it.
    fn most_slots(bytes: usize) -> usize {
        2 * bytes + MAX_ARRAY + 64
    }

    fn reserve(&mut self, n: usize, at: usize) -> R<usize> {
        let first = self.slots.len();
        let bytes = at.saturating_sub(self.start);
        if first + n > Self::most_slots(bytes) {
            return bad(
                at,
                "a value takes more slots than its bytes allow (a class that contains itself?)",
            );
        }
        self.held = self.held.saturating_add(n);
        if self.held > self.most_slots_in_all(bytes) {
            return bad(
                at,
                format!(
                    "{} values hold {} slots in all, more than their {} bytes allow (arrays of \
                     values that take no bytes?)",
                    self.reads,
                    self.held,
                    self.read_bytes.saturating_add(bytes)
                ),
            );
        }
        self.slots.resize(first + n, Slot::Int(0));
        Ok(first)
    }

    /// Reads one value of `class` (a struct of its fields, or a primitive) into slot 0,
    /// forgetting the previous value.
    pub(super) fn read(&mut self, c: &mut Cursor<'_>, class: i64) -> R<()> {
        self.slots.clear();
        self.start = c.pos;
        self.reads += 1;
        self.slots.push(Slot::Int(0));
        let mut tasks = std::mem::take(&mut self.tasks);
        tasks.clear();
        tasks.push(Task::Value {
            slot: 0,
            class,
            constant_pool: false,
            array: false,
        });
        while let Some(Task::Value {
            slot,
            class,
            constant_pool,
            array,
        }) = tasks.pop()
        {
            let at = c.pos;
            let value = if array {
                let n = c.count("array length", 0)?;
                if n > MAX_ARRAY {
                    return bad(
                        at,
                        format!("an array of {n} elements (at most {MAX_ARRAY})"),
                    );
                }
                let first = self.reserve(n, at)?;
                // Pending tasks are bounded as the slots are.
                for i in (0..n).rev() {
                    tasks.push(Task::Value {
                        slot: first + i,
                        class,
                        constant_pool,
                        array: false,
                    });
                }
                Slot::Array { at: first, n }
            } else if constant_pool {
                Slot::Ref(c.long()?)
            } else {
                let Some(cls) = self.metadata.classes.get(&class) else {
                    return bad(
                        at,
                        format!("a value of class {class}, which is not declared"),
                    );
                };
                match cls.kind {
                    Kind::Boolean | Kind::Byte => Slot::Int(i64::from(c.byte()? as i8)),
                    Kind::Short | Kind::Char => Slot::Int(c.short()?),
                    Kind::Int => Slot::Int(i64::from(c.int()?)),
                    Kind::Long => Slot::Int(c.long()?),
                    Kind::Float => Slot::Float(f64::from(f32::from_be_bytes(c.be()?))),
                    Kind::Double => Slot::Float(f64::from_be_bytes(c.be()?)),
                    Kind::String => Slot::Str(c.string()?),
                    Kind::Struct => {
                        let n = cls.fields.len();
                        let first = self.reserve(n, at)?;
                        for (i, f) in cls.fields.iter().enumerate().rev() {
                            tasks.push(Task::Value {
                                slot: first + i,
                                class: f.class,
                                constant_pool: f.constant_pool,
                                array: f.array,
                            });
                        }
                        Slot::Struct { at: first, n }
                    }
                }
            };
            self.slots[slot] = value;
        }
        self.tasks = tasks;
        self.read_bytes = self
            .read_bytes
            .saturating_add(c.pos.saturating_sub(self.start));
        Ok(())
    }

    /// Field `i` of the struct in `slot`.
    pub(super) fn field(&self, slot: usize, i: usize) -> Option<&Slot> {
        match self.slots.get(slot)? {
            Slot::Struct { at, n } if i < *n => self.slots.get(at + i),
            _ => None,
        }
    }
}

/// Field `i` of the struct in `slot` as an integer (a long, an int, a boolean) or a
/// constant pool id.
pub(super) fn int(values: &Values<'_>, slot: usize, i: Option<usize>) -> Option<i64> {
    match values.field(slot, i?)? {
        Slot::Int(v) | Slot::Ref(v) => Some(*v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_take_seven_bits_a_byte_and_eight_in_the_ninth() {
        let mut c = Cursor::new(&[0x7f], 0, 1, true);
        assert_eq!(c.long().unwrap(), 127);
        let mut c = Cursor::new(&[0x80, 0x01], 0, 2, true);
        assert_eq!(c.long().unwrap(), 128);
        let all = [0xff; 9];
        let mut c = Cursor::new(&all, 0, 9, true);
        assert_eq!(c.long().unwrap(), -1);
        let mut c = Cursor::new(&[0x80, 0x80], 0, 2, true);
        assert!(c.long().is_err(), "a varint cut short is an error");
    }

    #[test]
    fn utf16_strings_are_decoded_as_read_and_cut_ones_refused() {
        // "hé😀": h, é (a two-byte varint), and a surrogate pair (three-byte varints).
        let bytes = [4, 4, b'h', 0xe9, 0x01, 0xbd, 0xb0, 0x03, 0x80, 0xbc, 0x03];
        let mut c = Cursor::new(&bytes, 0, bytes.len(), true);
        assert_eq!(c.string().unwrap(), Str::Text("hé😀".into()));
        assert_eq!(c.left(), 0);
        // A lone surrogate is replaced, as Java would show it.
        let lone = [4, 1, 0xbd, 0xb0, 0x03];
        let mut c = Cursor::new(&lone, 0, lone.len(), true);
        assert_eq!(c.string().unwrap(), Str::Text("\u{fffd}".into()));
        // Cut short: an error, not a shorter string.
        let cut = &bytes[..6];
        let mut c = Cursor::new(cut, 0, cut.len(), true);
        assert!(c.string().is_err());
    }

    /// A metadata event of more strings than any recording holds (each a one-byte null)
    /// is refused naming the limit, before they are read.
    #[test]
    fn metadata_of_more_strings_than_the_limit_is_refused() {
        let n = MAX_METADATA_STRINGS + 1;
        let mut body = vec![0u8, 0, 0, 0];
        let mut v = n;
        while v >= 0x80 {
            body.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        body.push(v as u8);
        body.resize(body.len() + n, 0);
        let (buf, header) = metadata_event(body);
        let e = Metadata::read(&buf, &header).unwrap_err();
        assert!(
            e.reason.contains("metadata strings (at most 1048576)"),
            "{}",
            e.reason
        );
    }

    /// The metadata event `body` (after its size), as a chunk's bytes and header.
    fn metadata_event(body: Vec<u8>) -> (Vec<u8>, Header) {
        // The event's size, itself included, as a varint padded to 5 bytes.
        let size = body.len() + 5;
        let mut buf: Vec<u8> = (0..4)
            .map(|i| 0x80 | ((size >> (7 * i)) & 0x7f) as u8)
            .collect();
        buf.push((size >> 28) as u8);
        buf.extend(body);
        let header = Header {
            start: 0,
            size: buf.len(),
            metadata_offset: 0,
            start_nanos: 0,
            duration_nanos: 0,
            ticks_per_second: 1,
            compressed: true,
        };
        (buf, header)
    }

    /// Metadata elements nested past the limit are refused where the limit is passed, not
    /// walked to the end of the event with a slot each (3 bytes an element: 24 bytes of
    /// stack each, gigabytes from a 128 MiB event before).
    #[test]
    fn metadata_nested_past_the_limit_is_refused() {
        // Type, start, duration, id; one string, "x".
        let mut body = vec![0u8, 0, 0, 0, 1, 3, 1, b'x'];
        for _ in 0..100_000 {
            body.extend([0, 0, 1]); // named "x", no attributes, one child
        }
        body.extend([0, 0, 0]);
        let (buf, header) = metadata_event(body);
        let e = Metadata::read(&buf, &header).unwrap_err();
        assert!(
            e.reason.contains("nested more than 64 deep"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn counts_past_the_bytes_left_are_refused_before_anything_is_reserved() {
        // 1,000,000 as a varint, and nothing after it.
        let mut c = Cursor::new(&[0xc0, 0x84, 0x3d], 0, 3, true);
        let e = c.count("strings", 1).unwrap_err();
        assert!(e.reason.contains("1000000 declared"), "{}", e.reason);
    }

    #[test]
    fn a_value_holds_slots_in_proportion_to_its_bytes_not_to_the_bytes_after_it() {
        // Outer { a: Empty[], b: Empty[], ... }: each array of 65,536 field-less structs
        // takes three bytes. One is room a value may reserve ahead; the second is refused
        // however many bytes follow.
        let mut metadata = Metadata::default();
        let field = |name: &str| Field {
            name: name.into(),
            class: 2,
            constant_pool: false,
            array: true,
        };
        metadata.classes.insert(
            1,
            Class {
                name: "Outer".into(),
                kind: Kind::Struct,
                fields: vec![field("a"), field("b")],
            },
        );
        metadata.classes.insert(
            2,
            Class {
                name: "Empty".into(),
                kind: Kind::Struct,
                fields: Vec::new(),
            },
        );
        let mut bytes = vec![0x80, 0x80, 0x04, 0x80, 0x80, 0x04];
        bytes.resize(1 << 20, 0);
        let mut values = Values::new(&metadata);
        let mut c = Cursor::new(&bytes, 0, bytes.len(), true);
        let e = values.read(&mut c, 1).unwrap_err();
        assert!(
            e.reason.contains("more slots than its bytes"),
            "{}",
            e.reason
        );
        assert!(
            values.slots.len() <= MAX_ARRAY + 3,
            "{}",
            values.slots.len()
        );
    }

    /// Values of three bytes each holding an array of 65,536 structs of no fields: one is
    /// read, but they do not each get an array's room. The slots all of them hold stay
    /// within two a byte, 64 a value and one array's room, so a chunk of them is refused
    /// after a few, not walked for hours.
    #[test]
    fn values_that_take_no_bytes_share_one_arrays_room() {
        let mut metadata = Metadata::default();
        metadata.classes.insert(
            1,
            Class {
                name: "Holder".into(),
                kind: Kind::Struct,
                fields: vec![Field {
                    name: "empties".into(),
                    class: 2,
                    constant_pool: false,
                    array: true,
                }],
            },
        );
        metadata.classes.insert(
            2,
            Class {
                name: "Empty".into(),
                kind: Kind::Struct,
                fields: Vec::new(),
            },
        );
        let bytes = [0x80, 0x80, 0x04].repeat(2_000);
        let mut values = Values::new(&metadata);
        let mut c = Cursor::new(&bytes, 0, bytes.len(), true);
        values.read(&mut c, 1).unwrap();
        let e = (0..2_000)
            .find_map(|_| values.read(&mut c, 1).err())
            .expect("2,000 arrays of 65,536 read");
        assert!(e.reason.contains("slots in all"), "{}", e.reason);
        assert!(values.reads <= 3, "{} values read", values.reads);
    }

    #[test]
    fn a_class_that_contains_itself_is_an_error_not_a_hang() {
        let mut metadata = Metadata::default();
        metadata.classes.insert(
            7,
            Class {
                name: "Loop".into(),
                kind: Kind::Struct,
                fields: vec![Field {
                    name: "again".into(),
                    class: 7,
                    constant_pool: false,
                    array: false,
                }],
            },
        );
        let mut values = Values::new(&metadata);
        let bytes = [0u8; 16];
        let mut c = Cursor::new(&bytes, 0, bytes.len(), true);
        let e = values.read(&mut c, 7).unwrap_err();
        assert!(e.reason.contains("contains itself"), "{}", e.reason);
    }
}
