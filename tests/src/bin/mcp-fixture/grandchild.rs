//! `--spawn-grandchild`: a child that outlives the server, as `npx` leaves `node` running;
//! `--spawn-daemon`: one that has also left the server's process group, as a `tmux` server does.

use std::{
    io,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, Stdio},
};

/// The state-dir file holding the grandchild's pid.
pub const GRANDCHILD_PID: &str = "grandchild.pid";
/// The state-dir file holding the daemon's pid.
pub const DAEMON_PID: &str = "daemon.pid";

/// Where the child lives.
#[derive(Clone, Copy)]
pub enum Leaves {
    /// In this process's group: killing the group ends it.
    InGroup,
    /// In a session (and group) of its own: only a signal to it ends it.
    OwnSession,
}

/// Starts `sleep 3600` and records its pid. It is never waited for or killed here.
pub fn spawn(state_dir: &Path, leaves: Leaves) -> io::Result<()> {
    let mut command = Command::new("sleep");
    command
        .arg("3600")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let file = match leaves {
        Leaves::InGroup => GRANDCHILD_PID,
        Leaves::OwnSession => {
            // SAFETY: setsid is async-signal-safe and touches no memory.
            unsafe {
                command.pre_exec(|| match libc::setsid() {
                    -1 => Err(io::Error::last_os_error()),
                    _ => Ok(()),
                });
            }
            DAEMON_PID
        }
    };
    let child = command.spawn()?;
    let tmp = state_dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, format!("{}\n", child.id()))?;
    std::fs::rename(tmp, state_dir.join(file))
}
