//! What /proc and /sys say about processes, cgroups and this process's privileges.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Checks this process may load BPF programs and open system-wide perf events: root, or
/// CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN stands in for both). The error says what is
/// missing, so callers (and tests) can report why they skip.
pub fn check_permitted() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| Error::Io("reading /proc/self/status".into(), e))?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| Error::NotPermitted("/proc/self/status has no CapEff line".into()))?;
    let has = |cap: u32| eff & (1 << cap) != 0;
    let admin = has(CAP_SYS_ADMIN); // stands in for both
    if admin || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    Err(Error::NotPermitted(format!(
        "loading BPF programs needs CAP_BPF and CAP_PERFMON (or root); this process has \
         CapEff={eff:#x}"
    )))
}

/// The cgroup (v2) id of `path` and its depth below the cgroup2 mount, as
/// `bpf_get_current_ancestor_cgroup_id` counts them.
pub(crate) fn cgroup_id(path: &Path) -> Result<(u64, u32)> {
    let mount = cgroup2_mount()?;
    let canonical = path
        .canonicalize()
        .map_err(|e| Error::Config(format!("cgroup {}: {e}", path.display())))?;
    let relative = canonical.strip_prefix(&mount).map_err(|_| {
        Error::Config(format!(
            "{} is not below the cgroup2 mount {}",
            path.display(),
            mount.display()
        ))
    })?;
    let meta = std::fs::metadata(&canonical)
        .map_err(|e| Error::Config(format!("cgroup {}: {e}", path.display())))?;
    if !meta.is_dir() {
        return Err(Error::Config(format!(
            "{} is not a cgroup directory",
            path.display()
        )));
    }
    let level = relative.components().count() as u32;
    Ok((meta.ino(), level))
}

fn cgroup2_mount() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")
        .map_err(|e| Error::Io("reading /proc/self/mounts".into(), e))?;
    mounts
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(dir))
        })
        .ok_or_else(|| Error::Config("no cgroup2 file system is mounted".into()))
}

/// A file a process maps executable: a line of `/proc/<pid>/maps` with `x` permission and
/// a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutableMapping {
    /// First address mapped.
    pub start: u64,
    /// One past the last address mapped.
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// Device (`major:minor`) and inode of the file: the same file, however many
    /// processes or paths map it.
    pub device: String,
    /// Inode of the file.
    pub inode: u64,
    /// The path as the process sees it (in its own mount namespace).
    pub path: String,
}

/// The path [`executable_mappings`] gives the vDSO: the kernel's small shared library in
/// every process (`clock_gettime`, `gettimeofday`), in memory only.
pub const VDSO: &str = "[vdso]";

/// The bytes of the vDSO image `m` maps in `pid` (an ELF file, a page or two).
pub fn read_vdso(pid: u32, m: &ExecutableMapping) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let path = format!("/proc/{pid}/mem");
    // The kernel's image is a few pages; a range that says otherwise is not it.
    const MAX_VDSO_BYTES: u64 = 1 << 20;
    if m.end.saturating_sub(m.start) > MAX_VDSO_BYTES {
        return Err(Error::Io(
            path,
            std::io::Error::other(format!(
                "a {VDSO} of {} bytes, more than {MAX_VDSO_BYTES}",
                m.end.saturating_sub(m.start)
            )),
        ));
    }
    let mem = std::fs::File::open(&path).map_err(|e| Error::Io(path.clone(), e))?;
    let mut bytes = vec![0; (m.end - m.start) as usize];
    mem.read_exact_at(&mut bytes, m.start)
        .map_err(|e| Error::Io(format!("{path} at {:#x} ({VDSO})", m.start), e))?;
    Ok(bytes)
}

/// Most bytes of one process's `/proc/<pid>/maps` read: a process may map tens of thousands
/// of ranges, and the kernel prints each path whole, however deep (a path of 64 KiB mapped
/// 65,530 times was 4 GiB of text, read every interval).
const MAX_MAPS_BYTES: u64 = 32 << 20;

/// Most bytes of one line of `/proc/<pid>/maps`: its fields and a path of `PATH_MAX`.
const MAX_MAPS_LINE: u64 = 4096 + 256;

/// Most executable mappings kept of one process, in address order (the unwinder keeps 256).
pub(crate) const MAX_EXECUTABLE_MAPPINGS: usize = 1024;

/// The files `pid` maps executable, and its vDSO (path [`VDSO`]), from `/proc/<pid>/maps`,
/// in address order: at most [`MAX_EXECUTABLE_MAPPINGS`]. A process whose maps are longer
/// than [`MAX_MAPS_BYTES`], or hold a line longer than a path may be, is an error, read
/// no further (what a hostile process could make of them is bounded by the limits, not by
/// its memory).
pub fn executable_mappings(pid: u32) -> Result<Vec<ExecutableMapping>> {
    use std::io::{BufRead, Read};
    let path = format!("/proc/{pid}/maps");
    let file = std::fs::File::open(&path).map_err(|e| Error::Io(path.clone(), e))?;
    let mut maps = std::io::BufReader::with_capacity(64 << 10, file);
    let mut line = Vec::new();
    let (mut read, mut out) = (0u64, Vec::new());
    while out.len() < MAX_EXECUTABLE_MAPPINGS {
        line.clear();
        let n = (&mut maps)
            .take(MAX_MAPS_LINE + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::Io(path.clone(), e))?;
        if n == 0 {
            break;
        }
        read += n as u64;
        let over = if n as u64 > MAX_MAPS_LINE {
            Some(format!("a line of more than {MAX_MAPS_LINE} bytes"))
        } else if read > MAX_MAPS_BYTES {
            Some(format!("more than {MAX_MAPS_BYTES} bytes"))
        } else {
            None
        };
        if let Some(over) = over {
            return Err(Error::Io(path, std::io::Error::other(over)));
        }
        // A path need not be UTF-8: read as it would print (the file is opened through
        // its mapping, not its path, first).
        let text = String::from_utf8_lossy(&line);
        out.extend(executable_mapping(text.trim_end_matches('\n')));
    }
    Ok(out)
}

/// A line of `/proc/<pid>/maps` (`address perms offset dev inode path`) if it maps a file
/// (or the vDSO) executable. The path is the rest of the line, spaces and all (`/opt/my
/// app/bin`), less the kernel's ` (deleted)` when the file was removed or replaced since:
/// the unwinder then reads its bytes through the mapping's own `map_files` link, or at the
/// path only while that names the mapped inode.
fn executable_mapping(line: &str) -> Option<ExecutableMapping> {
    let mut rest = line;
    let mut f = [""; 5];
    for field in &mut f {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let path = rest.trim_start();
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    if !f[1].contains('x') || !(path.starts_with('/') || path == VDSO) {
        return None;
    }
    let (start, end) = f[0].split_once('-')?;
    Some(ExecutableMapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(f[2], 16).ok()?,
        device: f[3].to_owned(),
        inode: f[4].parse().ok()?,
        path: path.to_owned(),
    })
}

/// Nanoseconds per clock tick (`USER_HZ`), the unit of [`start_time`].
pub(crate) fn tick_ns() -> u32 {
    (1_000_000_000 / rustix::param::clock_ticks_per_second().max(1)) as u32
}

/// When `pid` started, in clock ticks after boot (`/proc/<pid>/stat`, field 22): with the
/// pid, it names one process, as a reused pid has another start time.
pub(crate) fn start_time(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| Error::Io(path.clone(), e))?;
    // The fields after the command name, which is in parentheses and may hold anything.
    stat.rfind(')')
        .and_then(|i| stat.get(i + 2..))
        .and_then(|rest| rest.split(' ').nth(19))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            Error::Io(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, "no start time"),
            )
        })
}

/// What a process is, for its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The process's name (`/proc/<pid>/comm`), or the sampled thread's when it is gone.
    pub comm: String,
    /// The executable's path (`/proc/<pid>/exe`), empty when unknown.
    pub exe: String,
    /// The cgroup v2 path (`/proc/<pid>/cgroup`), empty when unknown.
    pub cgroup: String,
    /// A container id (64 hex digits) found in the cgroup path, as Docker, containerd and
    /// CRI-O name their scopes.
    pub container_id: Option<String>,
    /// Whether the process shares this process's mount namespace (its paths are ours).
    pub same_mount_ns: bool,
}

impl ProcessInfo {
    /// Reads what /proc says of `pid`; fields it cannot read stay empty.
    pub fn read(pid: u32, fallback_comm: &str) -> Self {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let comm = std::fs::read_to_string(proc.join("comm"))
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_else(|_| fallback_comm.to_owned());
        let exe = std::fs::read_link(proc.join("exe"))
            .map(|p| {
                p.to_string_lossy()
                    .trim_end_matches(" (deleted)")
                    .to_owned()
            })
            .unwrap_or_default();
        let cgroup = std::fs::read_to_string(proc.join("cgroup"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
            })
            .unwrap_or_default();
        let container_id = container_id(&cgroup);
        // This process's own mount namespace does not change: read it once.
        static OURS: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
        let ours = OURS.get_or_init(|| std::fs::read_link("/proc/self/ns/mnt").ok());
        let same_mount_ns = match (std::fs::read_link(proc.join("ns/mnt")).ok(), ours) {
            (Some(a), Some(b)) => a == *b,
            _ => false,
        };
        Self {
            comm,
            exe,
            cgroup,
            container_id,
            same_mount_ns,
        }
    }
}

/// The last run of exactly 64 hex digits in a cgroup path.
pub(crate) fn container_id(cgroup: &str) -> Option<String> {
    cgroup
        .split(|c: char| !c.is_ascii_hexdigit())
        .rev()
        .find(|part| part.len() == 64)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_from_cgroup_paths() {
        let id = "3f4e2b1c9d8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e";
        assert_eq!(
            container_id(&format!("/system.slice/docker-{id}.scope")).as_deref(),
            Some(id)
        );
        assert_eq!(
            container_id(&format!("/kubepods/burstable/pod1234/{id}")).as_deref(),
            Some(id)
        );
        assert_eq!(
            container_id("/user.slice/user-0.slice/session-1.scope"),
            None
        );
    }

    /// A path is the rest of the line, spaces and all, less ` (deleted)`: cut at the first
    /// space, `/opt/my app/bin` was `/opt/my`, and a replaced library's new file was read
    /// for its old mapping.
    #[test]
    fn a_maps_line_keeps_its_whole_path() {
        let m = |line: &str| executable_mapping(line).map(|m| (m.start, m.inode, m.path));
        assert_eq!(
            m("7f00-7f10 r-xp 00001000 fd:01 42                         /opt/my app/bin"),
            Some((0x7f00, 42, "/opt/my app/bin".to_owned()))
        );
        assert_eq!(
            m("7f00-7f10 r-xp 00001000 fd:01 42   /usr/lib/libc.so.6 (deleted)"),
            Some((0x7f00, 42, "/usr/lib/libc.so.6".to_owned()))
        );
        assert_eq!(
            m("7fff0-7fff2 r-xp 00000000 00:00 0                  [vdso]"),
            Some((0x7fff0, 0, VDSO.to_owned()))
        );
        for skipped in [
            "7f00-7f10 r--p 00000000 fd:01 42 /usr/lib/libc.so.6",
            "7f00-7f10 r-xp 00000000 00:00 0 ",
            "7f00-7f10 r-xp 00000000 00:00 0 [anon:x]",
            "7f00-7f10 r-xp",
            "",
        ] {
            assert_eq!(m(skipped), None, "{skipped:?}");
        }
        // This process's own maps read as before.
        let mine = executable_mappings(std::process::id()).unwrap();
        assert!(mine.iter().any(|m| m.path.starts_with('/')));
    }

    /// A maps line longer than a path may be (a file mapped at a path of more than
    /// `PATH_MAX`, made by relative names) refuses the process's maps, read no further:
    /// the kernel prints such paths whole, and they were read whole, however many.
    #[test]
    fn a_maps_line_longer_than_a_path_is_refused() {
        use rustix::fs::{Mode, OFlags};
        use rustix::mm::{MapFlags, ProtFlags};
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let open_dir = |at: &dyn rustix::fd::AsFd, name: &str| {
            rustix::fs::openat(at, name, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap()
        };
        let mut at = open_dir(&rustix::fs::CWD, dir.path().to_str().unwrap());
        let name = "d".repeat(200);
        for _ in 0..25 {
            rustix::fs::mkdirat(&at, name.as_str(), Mode::RWXU).unwrap();
            at = open_dir(&at, &name);
        }
        let fd = rustix::fs::openat(&at, "f", OFlags::CREATE | OFlags::RDWR, Mode::RWXU).unwrap();
        let mut file = std::fs::File::from(fd);
        file.write_all(&[0u8; 4096]).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: a new mapping of a file of ours, at an address the kernel picks; nothing
        // reads it, and it is unmapped below.
        let map = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                4096,
                ProtFlags::READ | ProtFlags::EXEC,
                MapFlags::PRIVATE,
                &file,
                0,
            )
        }
        .unwrap();
        let refused = executable_mappings(std::process::id());
        #[allow(unsafe_code)]
        // SAFETY: the mapping made above, of its length, used by nothing.
        unsafe { rustix::mm::munmap(map, 4096) }.unwrap();
        let e = refused.unwrap_err().to_string();
        assert!(e.contains("a line of more than"), "{e}");
        assert!(!executable_mappings(std::process::id()).unwrap().is_empty());
    }

    #[test]
    fn a_start_time_names_one_process() {
        let me = start_time(std::process::id()).unwrap();
        assert_eq!(start_time(std::process::id()).unwrap(), me);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let other = start_time(child.id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(other >= me, "{other} < {me}");
        assert!(start_time(u32::MAX).is_err());
    }

    #[test]
    fn reads_this_process() {
        let me = ProcessInfo::read(std::process::id(), "fallback");
        assert!(!me.comm.is_empty() && me.comm != "fallback");
        assert!(
            me.exe.ends_with(
                &*std::env::current_exe()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
            )
        );
        assert!(me.same_mount_ns);
        let gone = ProcessInfo::read(u32::MAX - 1, "fallback");
        assert_eq!((gone.comm.as_str(), gone.exe.as_str()), ("fallback", ""));
    }
}
