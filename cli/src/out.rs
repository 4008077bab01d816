//! Standard output for the one-shot commands (`invoke`, `agents`, `acl
//! check`, `token issue`, `demo`, ...).
//!
//! Rust ignores SIGPIPE, so once the reader of standard output goes away
//! (`agent-reach agents ls | head -1`) every `println!` panics. Lines written
//! through [`outln!`] end the command quietly instead, with success, as Unix
//! tools do; any other write error ends it with a message and status 1.
//! (`agent-reach dev`, which keeps running, ignores a closed stdout instead.)

use std::fmt;
use std::io::{self, Write};

/// Writes one line; see the module documentation for a closed stdout.
pub fn line(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    // Standard output is line-buffered: the newline sends the line, so a
    // closed reader shows up here and not at exit.
    if let Err(error) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if error.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("agent-reach: cannot write to standard output: {error}");
        std::process::exit(1);
    }
}

/// `println!` for one-shot commands: a closed stdout ends the command quietly.
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}
