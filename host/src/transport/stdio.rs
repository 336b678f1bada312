//! Upstream servers as child processes speaking MCP on stdin/stdout.
//!
//! Every child gets its own process group (so grandchildren die with it), a minimal environment
//! (an allowlist of the host's plus what the config sets: host secrets never leak), its stderr
//! appended to a private per-server log file, and on Linux a guard process (`mod guard`) that
//! takes the whole group down with the host even when the host is SIGKILLed, and reaps all the
//! server leaves. A reaper task owns the `Child`, so no child is ever left a zombie, and ends the
//! session with the exit status the moment the server is reaped ([`SessionEnd`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::{ClientHandler, ClientServiceExt, RoleClient};

use super::gate::Guarded;
use super::lines::{CallSender, Lines};
use super::pipe_size::Pipe;
use super::server_log::ServerLog;
use super::{Fault, SessionEnd, generation};
use crate::config::ServerSpec;
use crate::upstream::route::Routes;

/// Host environment variables a child inherits; everything else must be configured explicitly.
const ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "SHELL", "TMPDIR",
];

/// A running (or exited, not yet forgotten) child process.
#[derive(Debug)]
pub struct ChildProcess {
    /// The server's own pid (what operators see and may signal), also its process group's id.
    pid: u32,
    exit: watch::Receiver<Option<Option<i32>>>,
}

impl ChildProcess {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Some(code)` once the process has exited (`code` is `None` when a signal killed it).
    pub fn exit_status(&self) -> Option<Option<i32>> {
        *self.exit.borrow()
    }

    pub fn is_alive(&self) -> bool {
        self.exit_status().is_none()
    }

    /// Waits up to `within` for the process to exit; returns its status if it did.
    pub async fn wait_exit(&self, within: Duration) -> Option<Option<i32>> {
        self.exit_watch().within(within).await
    }

    /// Its exit, to wait for apart from the process (the watcher of a stopped session).
    pub fn exit_watch(&self) -> ExitWatch {
        ExitWatch(self.exit.clone())
    }

    /// Stops the process group: the caller has already closed stdin; wait `grace`, then SIGTERM,
    /// wait `grace`, then SIGKILL. Returns once the process (on Linux, its guard) is reaped, and
    /// with it everything left in its group.
    pub async fn terminate(&self, grace: Duration) {
        if self.wait_exit(grace).await.is_none() {
            signal_group(self.pid, libc::SIGTERM);
            if self.wait_exit(grace).await.is_none() {
                signal_group(self.pid, libc::SIGKILL);
                let _ = self.wait_exit(Duration::from_secs(5)).await;
            }
        }
    }
}

/// A child's exit, published by its reaper the moment it is reaped.
#[derive(Debug, Clone)]
pub struct ExitWatch(watch::Receiver<Option<Option<i32>>>);

impl ExitWatch {
    /// Resolves with the exit status (`None`: killed by a signal) once the child is reaped.
    pub async fn exited(mut self) -> Option<i32> {
        match self.0.wait_for(Option::is_some).await {
            Ok(status) => status.flatten(),
            // The reaper never drops its sender before publishing.
            Err(_) => None,
        }
    }

    /// The exit status, if the child exits within `within`.
    pub async fn within(self, within: Duration) -> Option<Option<i32>> {
        tokio::time::timeout(within, self.exited()).await.ok()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.is_alive() {
            // Dropped without terminate(): kill hard; the reaper task still reaps it.
            signal_group(self.pid, libc::SIGKILL);
        }
    }
}

fn signal_group(pid: u32, signal: libc::c_int) {
    // Never group 0: that would be Tether's own.
    if let Ok(pgid) = libc::pid_t::try_from(pid)
        && pgid > 0
    {
        // SAFETY: killpg only sends a signal; the group is the child's own.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// What to start for a stdio server: its command line, environment and working directory, and
/// where its stderr is logged.
pub struct Spawn<'a> {
    /// The server's name (for its log file and messages).
    pub server: &'a str,
    pub command: &'a str,
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a Path>,
    pub log_dir: &'a Path,
}

/// A stdio server's MCP session, its process, and why the session ended once it has.
pub struct StdioSession<H: ClientHandler> {
    pub service: RunningService<RoleClient, H>,
    pub process: ChildProcess,
    pub end: SessionEnd,
    /// Tool calls go to the server this way, not through rmcp's loop.
    pub calls: CallSender,
}

/// Starts the server and completes the MCP handshake within `spec`'s connect timeout. Its
/// stdout is bounded to `spec.max_message` per line as it is read, and everything it
/// sends passes the gate ([`Guarded`]). A handshake that fails names why: the exit status of a
/// server that died, its refusal, or the timeout; the process is stopped then.
pub async fn connect_session<H: ClientHandler>(
    child: &Spawn<'_>,
    spec: &ServerSpec,
    lifecycle: rmcp::ClientLifecycleMode,
    routes: Arc<Routes>,
    handler: H,
) -> Result<StdioSession<H>, Fault> {
    let end = SessionEnd::new();
    let (process, stdout, stdin) = spawn(child, &end)?;
    let pipes = (Pipe::of(&stdout), Pipe::of(&stdin));
    let transport: Lines<RoleClient, _, _> =
        Lines::limited(stdout, stdin, spec.max_message).with_pipes(pipes.0, pipes.1);
    let calls = transport.call_sender();
    let transport = Guarded::new(transport, end.clone()).with_routes(routes);
    let opening = handler.serve_with_lifecycle(transport, lifecycle);
    match tokio::time::timeout(spec.timeouts.connect, opening).await {
        Ok(Ok(service)) => Ok(StdioSession {
            service,
            process,
            end,
            calls,
        }),
        Ok(Err(error)) => {
            // A server that answered and refused the handshake exits afterwards because its
            // stdin closes: its refusal is the fault, not the exit.
            let answered = !matches!(
                error,
                ClientInitializeError::ConnectionClosed(_)
                    | ClientInitializeError::TransportError { .. }
            );
            let exited = match answered {
                true => None,
                false => process.wait_exit(Duration::from_millis(200)).await,
            };
            let fault = match exited {
                Some(code) => Fault::ProcessExited(code),
                None => Fault::HandshakeFailed(generation::describe_refusal(&error, spec.protocol)),
            };
            process.terminate(spec.timeouts.stop_grace).await;
            Err(fault)
        }
        Err(_) => {
            process.terminate(spec.timeouts.stop_grace).await;
            Err(Fault::HandshakeTimedOut)
        }
    }
}

/// Starts the child; returns the process and its stdio pipes. Its reaper ends `end` with the
/// exit status.
pub fn spawn(
    child: &Spawn<'_>,
    end: &SessionEnd,
) -> Result<(ChildProcess, ChildStdout, ChildStdin), Fault> {
    let Spawn {
        server,
        command,
        args,
        env,
        cwd,
        log_dir,
    } = *child;
    if let Some(dir) = cwd
        && !dir.is_dir()
    {
        return Err(Fault::SpawnFailed(format!(
            "working directory {} does not exist",
            dir.display()
        )));
    }
    let log = ServerLog::open(server, command, args.len(), log_dir).map_err(|e| {
        Fault::SpawnFailed(format!(
            "cannot open the log file in {}: {e}",
            log_dir.display()
        ))
    })?;
    let stderr = log.for_child().map_err(|e| {
        Fault::SpawnFailed(format!(
            "cannot open the log file in {}: {e}",
            log_dir.display()
        ))
    })?;
    let mut cmd = Command::new(command);
    cmd.args(args)
        .env_clear()
        .envs(allowed_host_env())
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        // Its own group (on Linux the guard's; the server then makes its own).
        .process_group(0)
        .kill_on_drop(false);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    // The guard reports the server's pid on this pipe (both ends close-on-exec).
    #[cfg(target_os = "linux")]
    let (mut report, report_tx) =
        std::io::pipe().map_err(|e| Fault::SpawnFailed(format!("cannot start {command}: {e}")))?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let host = std::process::id() as libc::pid_t;
        let report_fd = report_tx.as_raw_fd();
        // SAFETY: the closure runs between fork and exec, where `guard::split` belongs; it
        // makes async-signal-safe calls only.
        unsafe {
            cmd.pre_exec(move || guard::split(host, report_fd));
        }
    }
    let mut child = cmd.spawn().map_err(|e| spawn_fault(command, &e))?;
    #[cfg(target_os = "linux")]
    let (pid, mut report) = {
        // spawn() returned, so the guard has written the pid (or died): no wait here.
        drop(report_tx);
        let pid = guard::server_pid(&mut report).or(child.id());
        // The server's exit comes on the same pipe, read without blocking.
        let report = tokio::net::unix::pipe::Receiver::from_owned_fd(report.into()).ok();
        (pid, report)
    };
    #[cfg(not(target_os = "linux"))]
    let pid = child.id();
    let pid = pid.unwrap_or_default();
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (exit_tx, exit_rx) = watch::channel(None);
    tokio::spawn(log.keep_bounded(exit_rx.clone()));
    let end = end.clone();
    tokio::spawn(async move {
        // On Linux the guard tells the server's exit as soon as it has reaped it, and may live
        // on to reap what the server left outside its group.
        #[cfg(target_os = "linux")]
        let told = match report.as_mut() {
            // A guard that ended told the exit before it did, or never will.
            Some(report) => tokio::select! {
                told = guard::server_exit(report) => told,
                _ = child.wait() => guard::server_exit_told(report),
            },
            None => None,
        };
        #[cfg(target_os = "linux")]
        drop(report);
        #[cfg(not(target_os = "linux"))]
        let told: Option<Option<i32>> = None;
        let code = match told {
            Some(code) => code,
            None => {
                // `code()` is None when a signal ended the process.
                let code = child.wait().await.ok().and_then(|status| status.code());
                // The group never outlives its leader (on Linux the guard saw to it already,
                // unless it was killed itself).
                signal_group(pid, libc::SIGKILL);
                code
            }
        };
        // The session's end first: whoever sees the exit finds the end recorded.
        end.finish(Fault::ProcessExited(code));
        let _ = exit_tx.send(Some(code));
        // The guard is reaped whenever it ends: never a zombie.
        let _ = child.wait().await;
    });
    Ok((ChildProcess { pid, exit: exit_rx }, stdout, stdin))
}

/// Linux: a guard process between Tether and the server, so the server's process group dies
/// with Tether even when Tether is SIGKILLed (a death signal only reaches a direct child, and
/// `npx` → `node` style servers leave the real work to a grandchild).
///
/// Tether → guard (what Tether spawned and reaps) → server (the command; leads its own process
/// group, whose id is the pid Tether reports and signals) → the server's children.
///
/// The guard is Tether's forked child; after std has set up the pipes, `split` forks again in
/// `pre_exec`. The server returns from it to exec the command, with a death signal tied to the
/// guard. The guard stays outside the server's group, so it outlives any signal to the group;
/// it never execs: it closes every fd, then waits for signals with everything blocked, using
/// async-signal-safe calls only (it is a fork of a multithreaded process):
/// - its own death signal (Tether died): SIGKILL the server's group;
/// - SIGTERM/SIGINT/SIGHUP sent to the guard: pass them on to the server's group;
/// - SIGCHLD: once the server has exited, SIGKILL what it left in its group, reap the server and
///   tell Tether its exit status on the report pipe at once. Then reap everything the server
///   left (the guard is a subreaper, so orphans come to it): the killed group, and processes
///   that left the group (`setsid` daemons, such as a `tmux` server), which live on as they
///   would without Tether. Once none is left, exit the way the server did (its code, or its
///   signal). Nothing the server started is ever left a zombie, even when Tether runs as PID 1
///   and would otherwise inherit them.
#[cfg(target_os = "linux")]
mod guard {
    use std::io::{self, Read};
    use std::ptr;

    use libc::{c_int, c_uint, c_ulong, pid_t, sigset_t};

    /// The guard's death signal. Catchable, unlike SIGKILL, so the guard can act on it.
    /// Checked against getppid(): it also comes when the Tether thread that forked the guard
    /// exits (the guard then moves to another thread of Tether), or from a stray kill.
    const HOST_DIED: c_int = libc::SIGUSR1;
    const FORWARDED: [c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

    /// Runs in `pre_exec`, in Tether's forked child; returns only in the server process (which
    /// then execs). `report` is the pipe on which the guard writes the server's pid.
    ///
    /// # Safety
    /// Only between fork and exec (`pre_exec`): it makes async-signal-safe calls only.
    pub unsafe fn split(host: pid_t, report: c_int) -> io::Result<()> {
        // SAFETY: raw syscalls on local sigsets and plain integers; nothing allocates, locks
        // or touches memory shared with Tether. `fork` in a single-threaded child is safe.
        unsafe {
            // Block everything before forking: the guard takes signals only through
            // sigwaitinfo (handlers inherited from Tether must never run) and loses none.
            let mut all: sigset_t = std::mem::zeroed();
            let mut inherited: sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::sigprocmask(libc::SIG_SETMASK, &all, &mut inherited);
            libc::prctl(libc::PR_SET_PDEATHSIG, HOST_DIED as c_ulong);
            // Tether may have died before the death signal was armed.
            if libc::getppid() != host {
                libc::_exit(1);
            }
            // Before the fork: an ignored SIGCHLD (inherited by Tether) would reap the server
            // unseen, and resetting it once the server may have exited would discard the
            // pending signal (POSIX), leaving the guard waiting forever.
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            let guard = libc::getpid();
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => {
                    // Its own group, before anyone can signal it (the guard does it too).
                    libc::setpgid(0, 0);
                    libc::sigprocmask(libc::SIG_SETMASK, &inherited, ptr::null_mut());
                    // The server dies with its guard, even a SIGKILLed one.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as c_ulong);
                    if libc::getppid() != guard {
                        libc::_exit(1);
                    }
                    Ok(())
                }
                server => {
                    libc::setpgid(server, server);
                    watch(host, server, report)
                }
            }
        }
    }

    /// The guard's whole life after the fork; never returns.
    ///
    /// # Safety
    /// Only in the guard, right after `split` forked the server.
    unsafe fn watch(host: pid_t, server: pid_t, report: c_int) -> ! {
        // SAFETY: as in `split`: syscalls on local values only.
        unsafe {
            tell(report, server);
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as c_ulong);
            // Its name in ps and top; it would otherwise show the forking thread's.
            libc::prctl(libc::PR_SET_NAME, c"tether-guard".as_ptr() as c_ulong);
            // Close every fd but the report pipe: the pipes are the server's business now, and
            // std's exec-error socket must close here or spawn() would wait for it forever.
            let report = report as c_uint;
            let closed =
                |from: c_uint, to: c_uint| libc::syscall(libc::SYS_close_range, from, to, 0 as c_uint) == 0;
            if !((report == 0 || closed(0, report - 1)) && closed(report + 1, c_uint::MAX)) {
                // Kernels before 5.9 (or a seccomp profile without close_range): every fd up
                // to the limit, so no other spawn's report pipe stays open here.
                let mut limit: libc::rlimit = std::mem::zeroed();
                let top = match libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) {
                    0 => limit.rlim_cur.min(1 << 20) as c_int,
                    _ => 1024,
                };
                for fd in (0..top).filter(|&fd| fd != report as c_int) {
                    libc::close(fd);
                }
            }
            let report = report as c_int;
            release_host_memory();
            let mut waited: sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut waited);
            for signal in FORWARDED.into_iter().chain([HOST_DIED, libc::SIGCHLD]) {
                libc::sigaddset(&mut waited, signal);
            }
            // A server gone already (its exec failed) is seen here, whatever became of its
            // SIGCHLD; later ones come as signals, which stay pending while blocked.
            if let Some(status) = reap(server) {
                tell(report, status);
                libc::close(report);
                linger(status);
            }
            loop {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                match libc::sigwaitinfo(&waited, &mut info) {
                    // The server's exit comes as SIGCHLD, next.
                    HOST_DIED if libc::getppid() != host => {
                        libc::killpg(server, libc::SIGKILL);
                    }
                    libc::SIGCHLD => {
                        if let Some(status) = reap(server) {
                            tell(report, status);
                            libc::close(report);
                            linger(status);
                        }
                    }
                    signal if FORWARDED.contains(&signal) => {
                        libc::killpg(server, signal);
                    }
                    _ => {} // EINTR, or a stray HOST_DIED while Tether lives
                }
            }
        }
    }

    /// Anonymous regions smaller than this are kept (a library's `.bss` tail, which libc may
    /// use); heaps and other threads' stacks are far larger.
    const KEEP_BELOW: usize = 256 << 10;

    /// Unmaps the guard's copy of Tether's heaps and other threads' stacks, keeping the stack it
    /// runs on. A forked child holds a private copy of every page its parent writes after the
    /// fork: without this, each guard would grow to the size of Tether's heap at the fork.
    ///
    /// # Safety
    /// Only in the guard, which from here on touches nothing but its own stack.
    unsafe fn release_host_memory() {
        let marker = 0u8;
        let here = &marker as *const u8 as usize;
        // SAFETY: open/read/close/munmap on local buffers; the ranges unmapped are the guard's
        // own, and none holds what it still uses (its stack, code, libc's data).
        unsafe {
            let fd = libc::open(
                c"/proc/self/maps".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return;
            }
            // Ranges first: unmapping while reading would shift what is left to read.
            let mut ranges = [(0usize, 0usize); 512];
            let mut count = 0;
            let mut chunk = [0u8; 4096];
            let mut line = [0u8; 512];
            let mut len = 0;
            loop {
                let n = libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len());
                if n <= 0 {
                    break;
                }
                for &byte in &chunk[..n as usize] {
                    if byte != b'\n' {
                        if len < line.len() {
                            line[len] = byte;
                            len += 1;
                        }
                        continue;
                    }
                    if let Some(range) = releasable(&line[..len])
                        && count < ranges.len()
                        && !(range.0 <= here && here < range.1)
                    {
                        ranges[count] = range;
                        count += 1;
                    }
                    len = 0;
                }
            }
            libc::close(fd);
            for &(start, end) in &ranges[..count] {
                libc::munmap(start as *mut libc::c_void, end - start);
            }
        }
    }

    /// The range of a `/proc/self/maps` line naming a private, writable, anonymous region
    /// (or the heap) of at least [`KEEP_BELOW`] bytes.
    fn releasable(line: &[u8]) -> Option<(usize, usize)> {
        let mut fields = line.split(|&b| b == b' ').filter(|field| !field.is_empty());
        let range = fields.next()?;
        let permissions = fields.next()?;
        let (_offset, _device) = (fields.next()?, fields.next()?);
        let inode = fields.next()?;
        if permissions != b"rw-p" || inode != b"0" {
            return None;
        }
        if fields.next().is_some_and(|path| path != b"[heap]") {
            return None;
        }
        let dash = range.iter().position(|&b| b == b'-')?;
        let (start, end) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
        (end.checked_sub(start)? >= KEEP_BELOW).then_some((start, end))
    }

    fn hex(digits: &[u8]) -> Option<usize> {
        digits.iter().try_fold(0usize, |value, &digit| {
            let nibble = (digit as char).to_digit(16)? as usize;
            value.checked_mul(16)?.checked_add(nibble)
        })
    }

    /// Reaps every exited child; answers the server's wait status once it is among them,
    /// having SIGKILLed what it left in its group first.
    ///
    /// # Safety
    /// Only in the guard.
    unsafe fn reap(server: pid_t) -> Option<c_int> {
        loop {
            // SAFETY: waitid and waitpid write only to locals.
            unsafe {
                // Looked at before it is reaped: the server's zombie holds the group's id while
                // the group is killed, so no other group is hit.
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
                if libc::waitid(libc::P_ALL, 0, &mut info, options) != 0 || info.si_pid() <= 0 {
                    return None;
                }
                let pid = info.si_pid();
                if pid == server {
                    libc::killpg(server, libc::SIGKILL);
                }
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
                if pid == server {
                    return Some(status);
                }
            }
        }
    }

    /// After the server: reaps what it left until nothing is, then exits as the server did.
    /// Signals other than SIGCHLD are ignored now: the server's group id may be reused, and
    /// what left the group is not the guard's to stop.
    ///
    /// # Safety
    /// Only in the guard, once the server is reaped.
    unsafe fn linger(status: c_int) -> ! {
        // SAFETY: waitpid and sigwaitinfo write only to locals.
        unsafe {
            let mut child_exits: sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut child_exits);
            libc::sigaddset(&mut child_exits, libc::SIGCHLD);
            loop {
                let mut ignored = 0;
                match libc::waitpid(-1, &mut ignored, libc::WNOHANG) {
                    // ECHILD: nothing is left.
                    -1 => exit_as(status),
                    0 => {
                        let mut info: libc::siginfo_t = std::mem::zeroed();
                        libc::sigwaitinfo(&child_exits, &mut info);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Writes `value` whole to the report pipe; a Tether that is gone is not an error here.
    ///
    /// # Safety
    /// Only in the guard.
    unsafe fn tell(report: c_int, value: c_int) {
        let bytes = value.to_ne_bytes();
        // SAFETY: write reads only `bytes`; 4 bytes to a pipe are written at once or not at all.
        unsafe {
            libc::write(report, bytes.as_ptr().cast(), bytes.len());
        }
    }

    /// Exits with the server's code, or dies of the signal that killed it, so Tether still
    /// tells "exited with N" from "killed".
    ///
    /// # Safety
    /// Only in the guard.
    unsafe fn exit_as(status: c_int) -> ! {
        // SAFETY: syscalls on local values; the guard has no handlers to skip or state to lose.
        unsafe {
            if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                // Dying of SIGSEGV/SIGABRT must not dump a core of Tether's memory.
                libc::prctl(libc::PR_SET_DUMPABLE, 0 as c_ulong);
                libc::signal(signal, libc::SIG_DFL);
                let mut set: sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, signal);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, ptr::null_mut());
                libc::kill(libc::getpid(), signal);
                libc::_exit(128 + signal); // not reached: only terminating signals kill
            }
            libc::_exit(libc::WEXITSTATUS(status))
        }
    }

    /// The server's pid as the guard reported it; `None` if the guard died before forking.
    pub fn server_pid(report: &mut io::PipeReader) -> Option<u32> {
        let mut bytes = [0; size_of::<pid_t>()];
        report.read_exact(&mut bytes).ok()?;
        u32::try_from(pid_t::from_ne_bytes(bytes))
            .ok()
            .filter(|&pid| pid > 0)
    }

    /// The server's exit code (`None`: a signal killed it) as the guard told it once it reaped
    /// the server; `None` if the guard died first (then its own exit says what is known).
    pub async fn server_exit(
        report: &mut tokio::net::unix::pipe::Receiver,
    ) -> Option<Option<i32>> {
        use tokio::io::AsyncReadExt;
        let mut bytes = [0; size_of::<c_int>()];
        report.read_exact(&mut bytes).await.ok()?;
        Some(exit_code(c_int::from_ne_bytes(bytes)))
    }

    /// [`server_exit`] once the guard has ended: what it wrote, without waiting for more.
    pub fn server_exit_told(report: &tokio::net::unix::pipe::Receiver) -> Option<Option<i32>> {
        let mut bytes = [0; size_of::<c_int>()];
        match report.try_read(&mut bytes) {
            Ok(4) => Some(exit_code(c_int::from_ne_bytes(bytes))),
            _ => None,
        }
    }

    /// The code of a wait status; `None` when a signal ended the process.
    fn exit_code(status: c_int) -> Option<i32> {
        libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
    }
}

fn spawn_fault(command: &str, error: &std::io::Error) -> Fault {
    Fault::SpawnFailed(match error.kind() {
        std::io::ErrorKind::NotFound => format!("command not found: {command}"),
        std::io::ErrorKind::PermissionDenied => format!("permission denied: {command}"),
        _ => format!("cannot start {command}: {error}"),
    })
}

fn allowed_host_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(key, _)| ENV_ALLOWLIST.contains(&key.as_str()) || key.starts_with("XDG_"))
        .collect()
}

