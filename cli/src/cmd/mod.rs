//! The subcommands: one module each with its flags (a clap `Args` struct
//! or subcommand enum) and what runs them, and the helpers they share.
//!
//! The `Args` structs carry `//` comments, not doc comments: clap would
//! print a struct's doc comment as its subcommand's help, and that help is
//! the doc comment on the subcommand's variant of `Command` (`main.rs`).

/// `println!` for the command's output, except that a closed stdout (the
/// reader went away: `ibal perf lookup --json | head -c 100`) ends the
/// command quietly instead of panicking, as command-line tools do.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("ibal: cannot write the output: {e}");
            std::process::exit(1);
        }
    }};
}

pub mod devinfo;
pub mod overview;
pub mod parse;
pub mod perf;
pub mod perf_scale;
pub mod pingpong;
pub mod qp_exchange;
pub mod relay;
pub mod rping;
pub mod stress;
pub mod verbosity;

/// Prints `as_json` with `--json`, otherwise `as_text` (which ends its own
/// lines).
pub fn print_report(json: bool, as_json: String, as_text: String) {
    if json {
        out!("{as_json}");
    } else {
        print!("{as_text}");
    }
}
