//! This process's own stdin and stdout, for `tether serve` on stdio.
//!
//! tokio's `stdin()`/`stdout()` hand every read and write to its blocking thread pool: a task
//! spawned and a thread woken per line each way. An agent starts Tether with pipes (Python's
//! `subprocess`) or a socket pair (libuv, so Node): both can be polled by the reactor like any
//! socket, with no thread in between. Anything else (a file, a terminal) keeps tokio's way.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

pub type Input = Pin<Box<dyn AsyncRead + Send>>;
pub type Output = Pin<Box<dyn AsyncWrite + Send>>;

/// This process's stdin and stdout as async streams, polled by the reactor where they allow it.
pub fn streams() -> (Input, Output) {
    let input = polled(io::stdin().as_fd().try_clone_to_owned(), |fd| {
        Ok(match kind(&fd)? {
            Kind::Pipe => Some(Box::pin(pipe::Receiver::from_owned_fd(fd)?) as Input),
            Kind::Socket => Some(Box::pin(socket(fd)?) as Input),
            Kind::Other => None,
        })
    })
    .unwrap_or_else(|| Box::pin(tokio::io::stdin()));
    let output = polled(io::stdout().as_fd().try_clone_to_owned(), |fd| {
        Ok(match kind(&fd)? {
            Kind::Pipe => Some(Box::pin(pipe::Sender::from_owned_fd(fd)?) as Output),
            Kind::Socket => Some(Box::pin(socket(fd)?) as Output),
            Kind::Other => None,
        })
    })
    .unwrap_or_else(|| Box::pin(tokio::io::stdout()));
    (input, output)
}

enum Kind {
    Pipe,
    Socket,
    Other,
}

fn kind(fd: &OwnedFd) -> io::Result<Kind> {
    let file_type = File::from(fd.try_clone()?).metadata()?.file_type();
    Ok(if file_type.is_fifo() {
        Kind::Pipe
    } else if file_type.is_socket() {
        Kind::Socket
    } else {
        Kind::Other
    })
}

/// The stream `open` makes of `fd`, or none (then tokio's blocking stdio serves): a stream
/// that cannot be polled is no reason to refuse to serve.
fn polled<T>(
    fd: io::Result<OwnedFd>,
    open: impl FnOnce(OwnedFd) -> io::Result<Option<T>>,
) -> Option<T> {
    match fd.and_then(open) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::debug!(%error, "stdio not polled by the reactor; using tokio's blocking stdio");
            None
        }
    }
}

fn socket(fd: OwnedFd) -> io::Result<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    /// A pipe and a socket pair both become reactor-polled streams that carry lines.
    #[tokio::test]
    async fn pipes_and_sockets_carry_lines_without_the_blocking_pool() {
        let (read, write) = std::io::pipe().unwrap();
        let read: OwnedFd = read.into();
        let write: OwnedFd = write.into();
        assert!(matches!(kind(&read).unwrap(), Kind::Pipe));
        let mut sender = pipe::Sender::from_owned_fd(write).unwrap();
        let mut receiver = BufReader::new(pipe::Receiver::from_owned_fd(read).unwrap());
        sender.write_all(b"{\"a\":1}\n").await.unwrap();
        let mut line = String::new();
        receiver.read_line(&mut line).await.unwrap();
        assert_eq!(line, "{\"a\":1}\n");

        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let ours: OwnedFd = ours.into();
        assert!(matches!(kind(&ours).unwrap(), Kind::Socket));
        let mut ours = socket(ours).unwrap();
        let mut theirs = socket(theirs.into()).unwrap();
        ours.write_all(b"x\n").await.unwrap();
        let mut line = String::new();
        BufReader::new(&mut theirs).read_line(&mut line).await.unwrap();
        assert_eq!(line, "x\n");
    }

    #[test]
    fn a_regular_file_is_left_to_tokio() {
        let file = tempfile::tempfile().unwrap();
        assert!(matches!(kind(&file.into()).unwrap(), Kind::Other));
    }
}
