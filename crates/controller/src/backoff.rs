//! How long to wait before trying again: one doubling formula, with or without jitter.

use std::time::Duration;

/// 1 s for the first attempt, doubled for each after it, at most `cap`.
pub fn doubling(attempt: u32, cap: Duration) -> Duration {
    let millis = 1000u64 << (attempt.clamp(1, 20) - 1);
    Duration::from_millis(millis.min(cap.as_millis() as u64))
}

/// [`doubling`] with ±25% jitter, so that many migrations failing together do not retry together. The jitter is
/// derived from `seed` and the attempt, so it is stable across restarts.
pub fn jittered(attempt: u32, seed: &str, cap: Duration) -> Duration {
    let capped = doubling(attempt, cap).as_millis() as u64;
    let hash = ferry_api::names::fnv1a(format!("{seed}/{attempt}").as_bytes());
    let spread = capped / 2;
    let jitter = if spread == 0 { 0 } else { hash % spread };
    Duration::from_millis(capped - capped / 4 + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered_stably() {
        let cap = Duration::from_secs(300);
        let waits: Vec<_> = (1..=12).map(|a| jittered(a, "ns/m", cap)).collect();
        assert!(waits[0] >= Duration::from_millis(750) && waits[0] <= Duration::from_millis(1250));
        assert!(waits[3] > waits[1]);
        assert!(waits.iter().all(|w| *w <= cap + cap / 4));
        assert_eq!(jittered(5, "ns/m", cap), jittered(5, "ns/m", cap));
        assert_ne!(jittered(5, "ns/m", cap), jittered(5, "ns/other", cap));
    }

    #[test]
    fn failed_reconciles_back_off_from_one_second_to_a_minute() {
        let cap = Duration::from_secs(60);
        let waits: Vec<u64> = (1..=9).map(|n| doubling(n, cap).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
