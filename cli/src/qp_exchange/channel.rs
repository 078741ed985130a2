//! The TCP side channel of the ibv ping-pong tools: connect or accept
//! within a bound, their address messages ([`crate::oob`]), our extension
//! line (a plain ibv tool closes instead), and line reads for the end and
//! bulk lines.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::config::{QpxConfig, Role};
use crate::oob::{self, Dest, Ext};

/// The tools' exchange on the side channel, as `cfg.role`'s end: the
/// server reads the client's address, then sends its own, reads `done`
/// and offers our extension; the client sends its address, reads the
/// server's, sends `done` and answers an extension with ours. `ready`
/// moves our QP to RTR and RTS once the peer's address is known, where the
/// tools do (the server before it answers, the client after `done`).
/// Returns the socket (ibal peers exchange end lines on it), the peer's
/// address, its extension (None: a plain ibv tool) and whether we are the
/// server.
pub(super) fn handshake(
    cfg: &QpxConfig,
    me: &Dest,
    my_ext: &Ext,
    mut ready: impl FnMut(&Dest) -> Result<(), String>,
) -> Result<(TcpStream, Dest, Option<Ext>, bool), String> {
    match &cfg.role {
        Role::Listen(addr) => {
            let listener =
                TcpListener::bind(addr).map_err(|err| format!("cannot listen on {addr}: {err}"))?;
            eprintln!(
                "qp-exchange: listening on {}",
                listener.local_addr().map_err(|err| err.to_string())?
            );
            let mut s = accept(&listener, cfg.timeout)?;
            drop(listener);
            s.set_read_timeout(Some(cfg.timeout))
                .map_err(|err| err.to_string())?;
            let peer = read_msg(&mut s)?;
            ready(&peer)?;
            s.write_all(&oob::encode(me))
                .map_err(|err| io_err("sending our address message", err))?;
            let mut done = [0u8; 5];
            s.read_exact(&mut done)
                .map_err(|err| io_err("reading the client's final \"done\"", err))?;
            if &done != oob::DONE {
                return Err(format!(
                    "bad message from the peer: expected \"done\\0\", got {done:?}"
                ));
            }
            // Offer the extension; a plain ibv client has closed by now.
            let ext = if cfg.plain {
                None
            } else {
                match s.write_all(my_ext.encode().as_bytes()) {
                    Ok(()) => read_ext(&mut s)?,
                    Err(_) => None,
                }
            };
            Ok((s, peer, ext, true))
        }
        Role::Connect(host, port) => {
            let mut s = connect(host, *port, cfg.timeout)?;
            s.set_read_timeout(Some(cfg.timeout))
                .map_err(|err| err.to_string())?;
            s.write_all(&oob::encode(me))
                .map_err(|err| io_err("sending our address message", err))?;
            let peer = read_msg(&mut s)?;
            s.write_all(oob::DONE)
                .map_err(|err| io_err("sending \"done\"", err))?;
            let ext = if cfg.plain { None } else { read_ext(&mut s)? };
            if ext.is_some() {
                s.write_all(my_ext.encode().as_bytes())
                    .map_err(|err| io_err("sending our extension line", err))?;
            }
            ready(&peer)?;
            Ok((s, peer, ext, false))
        }
    }
}

/// An I/O error in words: a time-out or the peer's close said plainly.
pub(super) fn io_err(what: &str, e: std::io::Error) -> String {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => format!("timed out {what}"),
        ErrorKind::UnexpectedEof => format!("{what}: the peer closed the connection"),
        _ => format!("{what}: {e}"),
    }
}

/// Connect to the side channel, bounded by `timeout`.
fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}:{port}: {e}"))?
        .collect();
    let mut last = format!("no address for {host}:{port}");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => {
                last = io_err(
                    &format!("connecting to {a} (the peer's TCP side channel)"),
                    e,
                )
            }
        }
    }
    Err(format!("the peer is unreachable: {last}"))
}

/// Accept one client, bounded by `timeout`.
fn accept(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listen socket: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| format!("accepted socket: {e}"))?;
                return Ok(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "timed out after {:.1} s waiting for a client on {}",
                        timeout.as_secs_f64(),
                        listener
                            .local_addr()
                            .map(|a| a.to_string())
                            .unwrap_or_default()
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

/// Read the extension line, or learn the peer is a plain ibv tool (EOF or
/// a reset before any byte). At most 256 bytes.
fn read_ext(s: &mut TcpStream) -> Result<Option<Ext>, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => return Err("the peer closed the connection inside its extension line".into()),
            Ok(_) => {
                if byte[0] == b'\n' {
                    break;
                }
                line.push(byte[0]);
                if line.len() > 256 {
                    return Err("the peer's extension line is longer than 256 bytes".into());
                }
            }
            Err(e)
                if line.is_empty()
                    && matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                    ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(io_err("reading the peer's extension line", e)),
        }
    }
    let text = String::from_utf8(line).map_err(|_| "the peer's extension line is not text")?;
    Ext::decode(&text).map(Some).map_err(|e| e.to_string())
}

/// The peer's address message (exactly [`oob::MSG_LEN`] bytes).
fn read_msg(s: &mut TcpStream) -> Result<Dest, String> {
    let mut msg = [0u8; oob::MSG_LEN];
    let mut got = 0;
    while got < msg.len() {
        match s.read(&mut msg[got..]) {
            Ok(0) => {
                return Err(format!(
                    "the peer closed the side channel after {got} of the {} bytes of its address message",
                    oob::MSG_LEN
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("reading the peer's address message", e)),
        }
    }
    oob::decode(&msg).map_err(|e| format!("bad message from the peer: {e}"))
}

/// Whether the peer has closed the side channel (EOF or a reset waiting
/// to be read), without consuming anything.
pub(super) fn side_channel_closed(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    let _ = s.set_nonblocking(false);
    match r {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
        ),
    }
}

/// Read one `\n`-terminated line of at most 512 bytes (the socket's read
/// timeout bounds each read).
pub(super) fn read_line(s: &mut TcpStream, what: &str) -> Result<String, String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => {
                return Err(format!(
                    "{what}: the peer closed the side channel{}",
                    if line.is_empty() {
                        " (its process ended or gave up)"
                    } else {
                        " mid-line"
                    }
                ))
            }
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => {
                line.push(b[0]);
                if line.len() > 512 {
                    return Err(format!("{what}: the peer's line is longer than 512 bytes"));
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => return Err(io_err(what, err)),
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}
