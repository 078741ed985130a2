//! `ibal perf scale-listener`: the listening end of a two-process `perf
//! scale` run, in its own process, answering the commands of
//! [`super::peer`] on stdin/stdout.

use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};

use ibal::roce::{gid_of, RoceProvider};

use super::config::{LISTEN_PORT, QUEUE_DEPTH};
use super::end::{roce_device, End, Net};
use super::passive::Passive;
use super::peer::{local_report, report_line};
use crate::BenchResult;

/// Runs the listening end on `bind` (its RoCEv2 port on an ephemeral UDP
/// port) for a peer at `peer`, until `close` or the end of `input`.
pub fn run_listener(
    bind: IpAddr,
    peer: SocketAddr,
    connections: u32,
    input: impl BufRead,
    mut output: impl Write,
) -> BenchResult<()> {
    let provider = RoceProvider::new(vec![roce_device(1, bind, connections)]);
    provider.add_peer(gid_of(peer.ip()), peer);
    let end = End::open(Net::Udp(&provider), 1, 256)?;
    let passive = Passive::listen(end, Some(SocketAddr::new(bind, LISTEN_PORT)))?;
    let local = provider.address_of(&gid_of(bind));
    let mut say = |line: String| -> BenchResult<()> {
        writeln!(output, "{line}")
            .and_then(|()| output.flush())
            .map_err(|e| format!("writing to the parent: {e}"))
    };
    say(format!("listening addr={local}"))?;
    let mut posted = false;
    for line in input.lines() {
        let line = line.map_err(|e| format!("reading a command: {e}"))?;
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("echo"), Some(n)) => {
                let answer = n
                    .parse::<u32>()
                    .map_err(|e| format!("echo {n}: {e}"))
                    .and_then(|iters| {
                        let echo = passive.echo()?;
                        if !posted {
                            echo.post_receives(QUEUE_DEPTH)?;
                            posted = true;
                        }
                        Ok((echo, iters))
                    });
                match answer {
                    Ok((echo, iters)) => {
                        say("ready".into())?;
                        match echo.run(iters) {
                            Ok(()) => say("echoed".into())?,
                            Err(e) => say(format!("error {e}"))?,
                        }
                    }
                    Err(e) => say(format!("error {e}"))?,
                }
            }
            (Some("report"), None) => say(report_line(&local_report(&passive, true)))?,
            (Some("close"), None) => {
                let (took, stats) = passive.end.close()?;
                say(format!(
                    "closed took_ns={} left_live={}",
                    took.as_nanos(),
                    stats.total_live()
                ))?;
                drop(provider);
                return Ok(());
            }
            _ => say(format!("error unknown command {line:?}"))?,
        }
    }
    // The parent went away: close quietly.
    let _ = passive.end.close();
    Ok(())
}
