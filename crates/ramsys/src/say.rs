//! Human output with control characters escaped (issue 34,
//! ramsys_proto::text): `say!` for stderr, `tell!` for stdout, and the
//! log's writer. A file name, user name, member address or message from a
//! peer cannot forge a line or drive the terminal.

use std::io::{self, Write};

use ramsys_proto::text::escape;

/// `eprintln!` with the line's control characters escaped.
macro_rules! say {
    ($($t:tt)*) => {
        eprintln!("{}", ramsys_proto::text::escape(&format!($($t)*)))
    };
}

/// `println!` with the line's control characters escaped.
macro_rules! tell {
    ($($t:tt)*) => {
        println!("{}", ramsys_proto::text::escape(&format!($($t)*)))
    };
}

/// The log's stderr: every event arrives whole (tracing-subscriber formats
/// it, then writes it in one call) and leaves as one line, its own
/// control characters escaped. With colours on, the formatter's escape
/// sequences stay (tracing-subscriber already escapes ESC inside field
/// values).
pub struct LogWriter {
    pub ansi: bool,
}

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, nl) = match text.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (&*text, ""),
        };
        let line = if self.ansi {
            body.split('\x1b')
                .map(escape)
                .collect::<Vec<_>>()
                .join("\x1b")
        } else {
            escape(body).into_owned()
        };
        let mut e = io::stderr().lock();
        e.write_all(line.as_bytes())?;
        e.write_all(nl.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
