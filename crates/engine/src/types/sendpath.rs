//! The send path setting (`--send-path`, `send_path` in the config): a
//! leaf module so that the statistics can name it without depending on the
//! whole configuration.

/// How a source hands blocks to the network (seed 002 sec. 7;
/// crate::data::inline). Chosen per session end, never negotiated: the
/// sink cannot tell the two apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SendPath {
    /// Reader -> bounded queue -> sender thread per link.
    Queued,
    /// The reader waits for credit and writes the block itself.
    Inline,
    /// Inline when readers == streams (each reader can hold a link of its
    /// own) on a short path (RTT up to [`INLINE_MAX_RTT`]), else queued.
    /// More readers than links contend for them, which is when Tyche's
    /// inline mode loses to the queue (seed 002 sec. 7, Figs. 14-15); fewer
    /// readers than links would serialize reading and sending that the
    /// queue overlaps (one reader on a disk); on a long path an inline
    /// reader's write of a whole block waits through TCP slow start and it
    /// reads nothing meanwhile. docs/NUMA.md sec. 8 has the measurements.
    #[default]
    Auto,
}

/// Longest round trip at which `auto` sends inline: a LAN or data-centre
/// path, where a cold link takes a 4 MiB block within a few milliseconds.
/// At 100 ms inline was 1.24x (480-file tree) and 1.59x (4 x 107 MB)
/// slower than queued (docs/BENCHMARKS.md, "Long RTT after the event-loop
/// fix"), each reader stalled for several slow-start round trips per block.
pub const INLINE_MAX_RTT: std::time::Duration = std::time::Duration::from_millis(1);

impl SendPath {
    /// The path a session with `readers` reader threads and `streams`
    /// data links takes, on a path whose round trip is `rtt` (None:
    /// unknown, e.g. a transport without an estimate: queued, the path
    /// that never loses much).
    pub fn resolve(
        self,
        readers: usize,
        streams: usize,
        rtt: Option<std::time::Duration>,
    ) -> SendPath {
        match self {
            SendPath::Auto if readers == streams && rtt.is_some_and(|r| r <= INLINE_MAX_RTT) => {
                SendPath::Inline
            }
            SendPath::Auto => SendPath::Queued,
            p => p,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            SendPath::Queued => "queued",
            SendPath::Inline => "inline",
            SendPath::Auto => "auto",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn auto_sends_inline_only_with_a_link_per_reader_on_a_short_path() {
        let us = |n| Some(Duration::from_micros(n));
        let a = SendPath::Auto;
        assert_eq!(a.resolve(4, 4, us(80)), SendPath::Inline);
        assert_eq!(a.resolve(4, 4, us(1_000)), SendPath::Inline);
        // A long path (the 100 ms measurement), an unknown one, or
        // unmatched counts: queued.
        assert_eq!(a.resolve(4, 4, us(1_001)), SendPath::Queued);
        assert_eq!(a.resolve(4, 4, us(100_000)), SendPath::Queued);
        assert_eq!(a.resolve(4, 4, None), SendPath::Queued);
        assert_eq!(a.resolve(4, 2, us(80)), SendPath::Queued);
        assert_eq!(a.resolve(1, 4, us(80)), SendPath::Queued);
        // An explicit choice is kept whatever the path.
        assert_eq!(SendPath::Inline.resolve(4, 2, None), SendPath::Inline);
        assert_eq!(SendPath::Queued.resolve(4, 4, us(80)), SendPath::Queued);
    }
}
