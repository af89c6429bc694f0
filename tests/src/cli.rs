//! The command line of the harness binaries (`cost`, `session_load`, `soak`): one reader of
//! their arguments, so each binary states only its own options.

use std::str::FromStr;

/// The arguments after the program name, with the binary's name and usage line for errors.
pub struct Args {
    name: &'static str,
    usage: &'static str,
    rest: std::iter::Skip<std::env::Args>,
}

impl Args {
    /// The process's arguments; `name` prefixes error messages and `usage` follows them.
    pub fn new(name: &'static str, usage: &'static str) -> Args {
        Args {
            name,
            usage,
            rest: std::env::args().skip(1),
        }
    }

    /// The usage line given to [`Args::new`].
    pub fn usage(&self) -> &'static str {
        self.usage
    }

    /// The value after option `what`: a number of at least 1. Exits as [`Args::fail`] does
    /// when it is missing, not a number or 0.
    pub fn number<T: FromStr + PartialOrd + From<u8>>(&mut self, what: &str) -> T {
        self.rest
            .next()
            .and_then(|n| n.parse().ok())
            .filter(|n| *n >= T::from(1))
            .unwrap_or_else(|| self.fail(&format!("{what} needs a positive number")))
    }

    /// Prints `<name>: <msg>` and the usage line to stderr; exits with status 2.
    pub fn fail(&self, msg: &str) -> ! {
        eprintln!("{}: {msg}\n{}", self.name, self.usage);
        std::process::exit(2);
    }
}

impl Iterator for Args {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        self.rest.next()
    }
}
