//! `--spawn-grandchild`: a child that outlives the server, as `npx` leaves `node` running.

use std::{
    io,
    path::Path,
    process::{Command, Stdio},
};

/// The state-dir file holding the grandchild's pid.
pub const GRANDCHILD_PID: &str = "grandchild.pid";

/// Starts `sleep 3600` in this process's group and records its pid. It is never waited for or
/// killed here: only killing the process group ends it.
pub fn spawn(state_dir: &Path) -> io::Result<()> {
    let child = Command::new("sleep")
        .arg("3600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let tmp = state_dir.join(format!(".{GRANDCHILD_PID}.tmp"));
    std::fs::write(&tmp, format!("{}\n", child.id()))?;
    std::fs::rename(tmp, state_dir.join(GRANDCHILD_PID))
}
