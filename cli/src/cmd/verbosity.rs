//! `-v` and `RUST_LOG`: which of the library's `tracing` events the
//! command prints on stderr (`docs/tracing.md`).
//!
//! | flags | printed |
//! |---|---|
//! | none, no `RUST_LOG` | nothing (no subscriber is installed at all) |
//! | `-v` | `info` and above: REJs, timeouts, QPs pushed to ERR, NAKs that end a connection |
//! | `-vv` | `debug`: also every CM state change and MAD, retransmissions, RNR waits, drops |
//! | `-vvv` | `trace`: everything |
//!
//! `RUST_LOG` (tracing-subscriber's `EnvFilter` syntax, e.g.
//! `RUST_LOG=ibal::cm=debug,ibal::roce::drop=debug`) adds its directives
//! on top of the level `-v` sets; with `RUST_LOG` alone, only what it names
//! is printed.

use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// The level `-v` given `count` times selects (`OFF` for none).
pub fn level(count: u8) -> LevelFilter {
    match count {
        0 => LevelFilter::OFF,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The filter for `-v` x `count` and the value of `RUST_LOG` (`None`:
/// unset); `None` when nothing is to be printed.
pub fn filter(count: u8, rust_log: Option<&str>) -> Option<EnvFilter> {
    let rust_log = rust_log.map(str::trim).filter(|s| !s.is_empty());
    if count == 0 && rust_log.is_none() {
        return None;
    }
    let builder = EnvFilter::builder().with_default_directive(level(count).into());
    Some(builder.parse_lossy(rust_log.unwrap_or("")))
}

/// Installs the subscriber that prints events on stderr, if `-v` or
/// `RUST_LOG` asks for any.
pub fn install(count: u8) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let Some(filter) = filter(count, rust_log.as_deref()) else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_v_opens_one_more_level() {
        assert_eq!(level(0), LevelFilter::OFF);
        assert_eq!(level(1), LevelFilter::INFO);
        assert_eq!(level(2), LevelFilter::DEBUG);
        assert_eq!(level(3), LevelFilter::TRACE);
        assert_eq!(level(9), LevelFilter::TRACE);
    }

    #[test]
    fn nothing_is_installed_without_v_or_rust_log() {
        assert!(filter(0, None).is_none());
        assert!(filter(0, Some("  ")).is_none());
        assert!(filter(1, None).is_some());
        let f = filter(0, Some("ibal::cm=debug")).unwrap();
        assert_eq!(f.max_level_hint(), Some(LevelFilter::DEBUG));
        let f = filter(1, Some("ibal::roce::drop=trace")).unwrap();
        assert_eq!(f.max_level_hint(), Some(LevelFilter::TRACE));
        assert_eq!(
            filter(2, None).unwrap().max_level_hint(),
            Some(LevelFilter::DEBUG)
        );
    }
}
