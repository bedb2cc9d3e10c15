//! How long downloads wait and how they ride out a flaky endpoint: pure decisions, no I/O.
//!
//! A disk stream through vCenter can last hours, so it has no total deadline; it is cut only when no byte came
//! for [`TransferPolicy::idle_timeout`]. A dropped connection, an idle stream, a 5xx (vCenter's "Out of HTTP
//! sessions" is a 503) or a vpxd restart is retried after the [`Backoff`] steps, which together span minutes
//! (a few seconds of quick retries did not outlast a real hiccup). Progress starts the schedule over.

use std::time::Duration;

/// The knobs of a session's downloads. Tests shorten them; the defaults are for a real vCenter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferPolicy {
    /// No byte for this long and the connection counts as dropped (then resumed). It also bounds the wait for
    /// any answer to begin, SOAP included (SOAP calls keep their total deadline, `ConnectConfig::timeout`).
    pub idle_timeout: Duration,
    /// Waits between consecutive attempts that made no progress.
    pub backoff: Backoff,
}

impl Default for TransferPolicy {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(60),
            backoff: Backoff::default(),
        }
    }
}

/// Deterministic exponential backoff: `first`, doubled each time, never more than `max`, for `attempts`
/// attempts. No jitter: one datapath Job per disk pair does not make a thundering herd, and a fixed schedule
/// can be reasoned about (and tested).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub attempts: u32,
}

impl Default for Backoff {
    /// 1, 2, 4, 8, 16, 30, 30, 30 s: about two minutes in all, longer than a vpxd restart's usual outage.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(30),
            attempts: 8,
        }
    }
}

impl Backoff {
    /// The wait before retry number `failure` (1 for the first failure), or None once the attempts are spent.
    pub fn delay(&self, failure: u32) -> Option<Duration> {
        if failure == 0 || failure > self.attempts {
            return None;
        }
        let factor = 1u32.checked_shl(failure - 1).unwrap_or(u32::MAX);
        Some(self.first.saturating_mul(factor).min(self.max))
    }

    /// Every wait of the schedule added up: how long a download keeps trying without progress.
    pub fn total(&self) -> Duration {
        (1..=self.attempts).filter_map(|n| self.delay(n)).sum()
    }
}

/// Drops the part of `chunk` that lies before the bytes wanted, when a server ignored `Range` and sent the file
/// from its start. `skip` is how many bytes are still to drop; it is reduced by what this chunk used up.
pub fn skip_prefix(chunk: &[u8], skip: &mut u64) -> std::ops::Range<usize> {
    let dropped = usize::try_from(*skip)
        .unwrap_or(usize::MAX)
        .min(chunk.len());
    *skip -= dropped as u64;
    dropped..chunk.len()
}

/// `Content-Range: bytes START-END/TOTAL` (TOTAL may be `*`): the first byte sent and the file's length.
pub fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (start, _end) = span.split_once('-')?;
    let start = start.trim().parse().ok()?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((start, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_doubles_to_a_cap_and_spans_more_than_a_minute() {
        let backoff = Backoff::default();
        let steps: Vec<u64> = (1..=backoff.attempts)
            .map(|n| backoff.delay(n).unwrap().as_secs())
            .collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert!(backoff.total() >= Duration::from_secs(60), "{backoff:?}");
        assert_eq!(backoff.delay(0), None);
        assert_eq!(backoff.delay(backoff.attempts + 1), None);
    }

    #[test]
    fn a_long_schedule_saturates_instead_of_overflowing() {
        let backoff = Backoff {
            first: Duration::from_millis(10),
            max: Duration::from_millis(50),
            attempts: 200,
        };
        assert_eq!(backoff.delay(3), Some(Duration::from_millis(40)));
        assert_eq!(backoff.delay(4), Some(Duration::from_millis(50)));
        assert_eq!(backoff.delay(64), Some(Duration::from_millis(50)));
        assert_eq!(backoff.delay(200), Some(Duration::from_millis(50)));
        assert_eq!(
            backoff.total(),
            Duration::from_millis(10 + 20 + 40 + 197 * 50)
        );
    }

    #[test]
    fn skipping_a_prefix_spans_chunks() {
        // The server ignored `Range: bytes=10-`: drop 10 bytes over chunks of 4, then keep everything.
        let mut skip = 10;
        let chunk = [0u8; 4];
        assert_eq!(skip_prefix(&chunk, &mut skip), 4..4);
        assert_eq!(skip_prefix(&chunk, &mut skip), 4..4);
        assert_eq!(skip, 2);
        assert_eq!(skip_prefix(&chunk, &mut skip), 2..4);
        assert_eq!(skip, 0);
        assert_eq!(skip_prefix(&chunk, &mut skip), 0..4);
        assert_eq!(skip_prefix(&[], &mut skip), 0..0);
    }

    #[test]
    fn content_ranges() {
        assert_eq!(
            parse_content_range("bytes 100-199/1000"),
            Some((100, Some(1000)))
        );
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("bytes */1000"), None);
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }
}
