//! Pipes as large as the messages they carry.
//!
//! A pipe holds 64 KiB by default. A larger message crosses it in pieces: the writer fills it
//! and sleeps, the reader wakes, drains it and waits, the writer wakes for the next piece. A
//! relay that reads a whole message before passing it on (Tether checks a result before the
//! agent gets it) pays those turns on both of its pipes. So each pipe Tether reads lines from
//! or writes them to (a stdio server's stdout and stdin, `tether serve`'s own stdin and
//! stdout) grows to hold the largest message it has carried: a pipe read from once such a
//! message has been read, a pipe written to before such a message is written. Measured with
//! 100 KB and 2 MB results at one client: docs/BENCHMARKS.md, section 8.
//!
//! Pipe space is the user's, not the process's: past `pipe-user-pages-soft` (64 MiB by
//! default) every new pipe that user makes holds 8 KiB, for every program the user runs. So
//! the room a Tether process adds to its pipes, in all, stays within an eighth of that limit
//! (several Tethers of one user each have their own eighth), and a pipe grows only as far as
//! `pipe-max-size` (1 MiB by default). A pipe that cannot grow (no room left, or the kernel
//! refuses) keeps its size; nothing else changes.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a pipe of `capacity` bytes should grow to, to hold a `message` of that many bytes
/// whole: the next power of two (the kernel's sizes are powers of two pages), within `max`;
/// none when it holds it already, or cannot grow. The room it takes is the difference.
fn grown_capacity(capacity: usize, message: usize, max: usize) -> Option<usize> {
    if message <= capacity || capacity >= max {
        return None;
    }
    Some(message.checked_next_power_of_two().unwrap_or(max).min(max))
}

/// Room for pipe growth, shared by a process's pipes: taken before a pipe grows, given back
/// when the pipe goes (or did not grow after all).
pub struct Room {
    limit: usize,
    taken: AtomicUsize,
}

impl Room {
    pub const fn new(limit: usize) -> Self {
        Self {
            limit,
            taken: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` if that much is left.
    pub fn take(&self, bytes: usize) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                taken.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    pub fn give_back(&self, bytes: usize) {
        self.taken.fetch_sub(bytes, Ordering::AcqRel);
    }

    #[cfg(test)]
    fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

/// The kernel's bounds on this user's pipes: the largest one pipe may be, and the room for
/// this process's growth in all (an eighth of the user's soft limit; of 256 MiB if there is
/// none).
struct Bounds {
    max_pipe: usize,
    room: Room,
}

fn bounds() -> &'static Bounds {
    static BOUNDS: OnceLock<Bounds> = OnceLock::new();
    BOUNDS.get_or_init(|| {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/fs/{name}"))
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
        };
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let soft_pages = read("pipe-user-pages-soft").unwrap_or(16384);
        let soft = match soft_pages {
            0 => 256 << 20,
            pages => pages.saturating_mul(page),
        };
        Bounds {
            max_pipe: read("pipe-max-size").unwrap_or(1 << 20),
            room: Room::new(soft / 8),
        }
    })
}

/// One pipe that may grow. The owner of the pipe's file descriptor keeps it open for as long
/// as this lives.
pub struct Pipe {
    fd: RawFd,
    /// The size last set or found, read without the lock on every message.
    capacity: AtomicUsize,
    state: Mutex<PipeState>,
}

struct PipeState {
    /// Room taken for this pipe, given back when it goes.
    taken: usize,
    /// The kernel cannot resize it: not asked again. (A refusal for want of the user's room
    /// may pass; it is asked again with the next line too large.)
    stuck: bool,
}

impl Pipe {
    /// `fd`'s pipe, if it is one (its size known).
    pub fn of(fd: &impl AsFd) -> Option<Self> {
        let fd = fd.as_fd().as_raw_fd();
        let capacity = capacity_of(fd)?;
        Some(Self {
            fd,
            capacity: AtomicUsize::new(capacity),
            state: Mutex::new(PipeState {
                taken: 0,
                stuck: false,
            }),
        })
    }

    /// Grows the pipe to hold a message of `message` bytes whole, if there is room.
    pub fn fit(&self, message: usize) {
        if message <= self.capacity.load(Ordering::Relaxed) {
            return;
        }
        let bounds = bounds();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.stuck {
            return;
        }
        // The size now, not as last seen: the other end may have resized it, and a smaller
        // size set here would shrink it.
        let Some(capacity) = capacity_of(self.fd) else {
            state.stuck = true;
            return;
        };
        self.capacity.store(capacity, Ordering::Relaxed);
        let Some(wanted) = grown_capacity(capacity, message, bounds.max_pipe) else {
            return;
        };
        let more = wanted - capacity;
        if !bounds.room.take(more) {
            return;
        }
        match set_capacity(self.fd, wanted) {
            Ok(set) => {
                state.taken += more;
                self.capacity.store(set.max(capacity), Ordering::Relaxed);
            }
            Err(error) => {
                bounds.room.give_back(more);
                // EPERM and ENOMEM: the user's pipes, or the system, are short of room for now.
                state.stuck = !matches!(error.raw_os_error(), Some(libc::EPERM | libc::ENOMEM));
            }
        }
    }

    /// The pipe's size, as last set or found.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let taken = self.state.get_mut().unwrap_or_else(|e| e.into_inner()).taken;
        if taken > 0 {
            bounds().room.give_back(taken);
        }
    }
}

#[cfg(target_os = "linux")]
fn capacity_of(fd: RawFd) -> Option<usize> {
    // SAFETY: F_GETPIPE_SZ reads the size of the pipe `fd` is; any other descriptor fails.
    let size = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    usize::try_from(size).ok().filter(|&size| size > 0)
}

#[cfg(target_os = "linux")]
fn set_capacity(fd: RawFd, bytes: usize) -> std::io::Result<usize> {
    let bytes = libc::c_int::try_from(bytes).map_err(std::io::Error::other)?;
    // SAFETY: F_SETPIPE_SZ resizes the pipe `fd` is; it fails for anything else, or when the
    // pipe holds more than the new size.
    let size = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, bytes) };
    usize::try_from(size).map_err(|_| std::io::Error::last_os_error())
}

/// Elsewhere pipes keep their size.
#[cfg(not(target_os = "linux"))]
fn capacity_of(_: RawFd) -> Option<usize> {
    None
}

#[cfg(not(target_os = "linux"))]
fn set_capacity(_: RawFd, _: usize) -> std::io::Result<usize> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// The size of the pipe `end` is an end of, for tests.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn size_of(end: &impl AsFd) -> usize {
    capacity_of(end.as_fd().as_raw_fd()).expect("a pipe")
}

/// The size a new pipe has here, if pipes can grow to four times it (not so on kernels whose
/// pipes start near `pipe-max-size`, as with 64 KiB pages): tests of growth skip otherwise.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn growable_default() -> Option<usize> {
    let (read, _write) = std::io::pipe().ok()?;
    let default = size_of(&read);
    let growable = default * 4 <= bounds().max_pipe;
    if !growable {
        eprintln!("skipped: pipes here start at {default} bytes, near pipe-max-size");
    }
    growable.then_some(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_grows_to_the_next_power_of_two_that_holds_the_message_within_the_maximum() {
        const KIB: usize = 1 << 10;
        assert_eq!(grown_capacity(64 * KIB, 100, 1024 * KIB), None);
        assert_eq!(grown_capacity(64 * KIB, 64 * KIB, 1024 * KIB), None);
        assert_eq!(grown_capacity(64 * KIB, 100_000, 1024 * KIB), Some(128 * KIB));
        assert_eq!(grown_capacity(64 * KIB, 2_000_000, 1024 * KIB), Some(1024 * KIB));
        assert_eq!(grown_capacity(1024 * KIB, 2_000_000, 1024 * KIB), None);
        assert_eq!(grown_capacity(64 * KIB, usize::MAX, 1024 * KIB), Some(1024 * KIB));
    }

    #[test]
    fn room_taken_stays_within_its_limit_and_comes_back() {
        let room = Room::new(100);
        assert!(room.take(60));
        assert!(!room.take(41));
        assert!(room.take(40));
        assert!(!room.take(1));
        room.give_back(60);
        assert!(room.take(50));
        assert_eq!(room.taken(), 90);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_real_pipe_grows_for_a_message_larger_than_it_holds() {
        let (read, write) = std::io::pipe().unwrap();
        let Some(before) = growable_default() else {
            return;
        };
        let pipe = Pipe::of(&read).expect("a pipe");
        pipe.fit(before / 2);
        assert_eq!(pipe.capacity(), before, "a message it holds changes nothing");
        pipe.fit(before * 3);
        assert_eq!(pipe.capacity(), (before * 3).next_power_of_two());
        assert_eq!(capacity_of(read.as_raw_fd()), Some(pipe.capacity()), "the kernel's size");

        // The other end makes it larger still: a message between the two sizes shrinks nothing.
        let largest = bounds().max_pipe;
        assert_eq!(set_capacity(write.as_raw_fd(), largest).ok(), Some(largest));
        pipe.fit(before * 6);
        assert_eq!(capacity_of(read.as_raw_fd()), Some(largest));
    }

    #[test]
    fn what_is_not_a_pipe_is_left_alone() {
        let file = tempfile::tempfile().unwrap();
        assert!(Pipe::of(&file).is_none());
    }
}
