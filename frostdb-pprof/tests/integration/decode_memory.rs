//! What decoding a hostile pprof materialises before it is refused, measured by a counting
//! allocator (this binary's own, so no other test's allocations count).

use crate::common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use frostdb_pprof::{Error, Limits, decode};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

#[allow(unsafe_code)]
// SAFETY: both methods forward to the system allocator with the caller's arguments, so its
// contract is the caller's; the counters are plain atomics. (`realloc` is the trait's
// default: an `alloc` and a `dealloc` through these.)
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most bytes held at once while `f` runs, above what was held before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = NOW.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

/// Millions of empty samples (two bytes each, `12 00`), or of empty mappings (`1a 00`):
/// refused by counting them, before the arrays they would take (about 50 bytes each) are
/// made. Without the first pass's check, the samples took 25x their bytes before the
/// count was checked, and mappings had no limit at all.
#[test]
fn millions_of_empty_messages_are_refused_before_they_are_made() {
    let limits = Limits::default();
    for (tag, what) in [(0x12u8, "sample count"), (0x1a, "mapping count")] {
        let n = limits.max_samples.max(limits.max_locations) + 1;
        let raw: Vec<u8> = std::iter::repeat_n([tag, 0x00], n).flatten().collect();
        let (result, peak) = peak_of(|| decode(&raw, &limits));
        match result {
            Err(e @ Error::TooLarge { .. }) => assert!(e.to_string().contains(what), "{e}"),
            other => panic!("{what}: {:?}", other.map(|_| ())),
        }
        assert!(
            peak < raw.len(),
            "{what}: {peak} bytes held to refuse {} bytes",
            raw.len()
        );
    }
}

/// A sample of thousands of empty labels (two bytes each) is refused at the bound, naming
/// it.
#[test]
fn a_sample_of_too_many_labels_is_refused_naming_them() {
    let mut sample = Vec::new();
    for _ in 0..5_000 {
        sample.extend_from_slice(&[0x1a, 0x00]);
    }
    let mut raw = vec![0x12];
    let mut len = sample.len();
    while len >= 0x80 {
        raw.push((len as u8) | 0x80);
        len >>= 7;
    }
    raw.push(len as u8);
    raw.extend_from_slice(&sample);
    let err = decode(&raw, &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("labels of a sample"), "{err}");
}

/// Under [`frostdb_pprof::charging`], a decode first charges what it will make: the bytes
/// a gzipped profile inflates to (as its trailer states) and its arrays, before making
/// them; a refusal fails the decode naming it (Unavailable). Without a charge set, nothing
/// is asked.
#[test]
fn a_decode_charges_what_it_makes_before_making_it() {
    let path = common::shared().join("testdata/pprof/pyroscope__go-cpu.pb.gz");
    let gz = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let raw = frostdb_pprof::inflate(&gz, 1 << 30).unwrap().into_owned();
    let asked = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = asked.clone();
    let decoded = frostdb_pprof::charging(
        move |bytes, what| {
            log.borrow_mut().push((bytes, what));
            Ok(())
        },
        || decode(&gz, &Limits::default()),
    );
    assert!(decoded.is_ok());
    let asked = asked.borrow().clone();
    let gunzip: usize = asked
        .iter()
        .filter(|(_, w)| w.contains("gunzipping"))
        .map(|(b, _)| b)
        .sum();
    assert_eq!(gunzip, raw.len(), "{asked:?}");
    assert!(
        asked.iter().any(|(b, w)| w.contains("decoding") && *b > 0),
        "{asked:?}"
    );
    // Refused: the decode fails before inflating, naming why.
    let e = frostdb_pprof::charging(
        |bytes, what| {
            Err(frostdb_pprof::Error::Unavailable(format!(
                "{what}: {bytes} bytes over the budget"
            )))
        },
        || decode(&gz, &Limits::default()),
    )
    .unwrap_err();
    assert_eq!(e.kind(), frostdb_core::ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("gunzipping a profile"), "{e}");
    // Outside, nothing is charged.
    assert!(decode(&gz, &Limits::default()).is_ok());
}

/// A gzip of two members whose last trailer states nothing (an empty member after 20 MiB):
/// what the trailer does not state is charged a MiB at a time before it is inflated, so a
/// charge that refuses past 4 MiB stops it with little more than that made; the public
/// `inflate` (what JFR parts and request bodies use) is charged the same way.
#[test]
fn several_gzip_members_are_charged_as_they_inflate() {
    use std::io::Write;
    let member = |bytes: &[u8]| {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    };
    let mut two = member(&vec![0x12u8; 20 << 20]);
    two.extend(member(b""));
    let limits = Limits::default();
    let capped = |bytes: usize, what: &'static str| {
        if bytes > 4 << 20 {
            return Err(frostdb_pprof::Error::Unavailable(format!(
                "{what}: {bytes} bytes over the cap"
            )));
        }
        Ok(())
    };
    let total = std::rc::Rc::new(std::cell::Cell::new(0usize));
    for (name, run) in [
        (
            "decode",
            Box::new(|| decode(&two, &limits).map(|_| ())) as Box<dyn Fn() -> _>,
        ),
        (
            "inflate",
            Box::new(|| frostdb_pprof::inflate(&two, limits.max_decompressed_bytes).map(|_| ())),
        ),
    ] {
        let spent = total.clone();
        spent.set(0);
        let (result, peak) = peak_of(|| {
            frostdb_pprof::charging(
                move |bytes, what| {
                    spent.set(spent.get() + bytes);
                    capped(spent.get(), what)
                },
                &run,
            )
        });
        let e = result.unwrap_err();
        assert_eq!(
            e.kind(),
            frostdb_core::ErrorKind::Unavailable,
            "{name}: {e}"
        );
        assert!(
            peak < 12 << 20,
            "{name}: {peak} bytes made under a 4 MiB charge"
        );
    }
}

/// Storing a profile charges the rows it builds, a row for each sample value, before it
/// builds them (decoding charged about 8 bytes a value, and storing made ten times that,
/// charged nowhere): under a charge that refuses them, the profile is refused naming them
/// and nothing is stored.
#[test]
fn storing_charges_the_rows_it_builds_before_building_them() {
    use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions, validate};
    let store = ProfileStore::open(
        frostdb_core::Db::open_in_memory(frostdb_core::DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let mut p = frostdb_pprof::testing::profile(0, 1_000, 3);
    let first = p.sample_type[0];
    p.sample_type = vec![first; 4];
    for s in &mut p.sample {
        s.value = vec![1; 4];
    }
    let profile = validate(p, store.limits()).unwrap();
    let options = IngestOptions::default()
        .name("cpu")
        .timestamp_ms(1_700_000_000_000);
    let asked = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = asked.clone();
    frostdb_pprof::charging(
        move |bytes, what| {
            log.borrow_mut().push((bytes, what));
            Ok(())
        },
        || store.ingest_profile(&profile, &options),
    )
    .unwrap();
    let rows: usize = asked
        .borrow()
        .iter()
        .filter(|(_, w)| w.contains("sample rows"))
        .map(|(b, _)| b)
        .sum();
    assert!(rows >= 4_000 * 64, "{:?}", asked.borrow());
    let stored = store.samples().stats().rows;
    let e = frostdb_pprof::charging(
        |bytes, what| {
            if what.contains("sample rows") {
                return Err(Error::Unavailable(format!(
                    "{what}: {bytes} bytes over the budget"
                )));
            }
            Ok(())
        },
        || store.ingest_profile(&profile, &options.clone().timestamp_ms(1_700_000_060_000)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("sample rows"), "{e}");
    assert_eq!(store.samples().stats().rows, stored);
}
