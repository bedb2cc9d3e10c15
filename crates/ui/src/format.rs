//! Numbers and times as people read them.

use ferry_api::Phase;
use k8s_openapi::jiff::Timestamp;

/// `12 B`, `64.0 MiB`, `1.5 GiB`.
pub fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n.max(0.0);
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `12.3 MiB/s`.
pub fn rate(bytes_per_second: f64) -> String {
    format!("{}/s", bytes(bytes_per_second))
}

/// `0.4 s`, `42 s`, `3 min 12 s`, `2 h 5 min`, `3 d 4 h`.
pub fn duration(seconds: f64) -> String {
    let seconds = seconds.max(0.0);
    if seconds < 10.0 {
        return format!("{seconds:.1} s");
    }
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

/// How long ago, in whole units: `42 s ago`, `3 min ago`.
pub fn ago(then: Timestamp, now: Timestamp) -> String {
    let s = now.duration_since(then).as_secs().max(0);
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86400 => format!("{} h {} min ago", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h ago", s / 86400, s % 86400 / 3600),
    }
}

/// `14:03:05 UTC`: the API's times are UTC, and the page says so rather than guess the reader's zone.
pub fn clock(t: Timestamp) -> String {
    t.strftime("%H:%M:%S UTC").to_string()
}

/// `14:03:05.123`: checkpoints of a small VM are often less than a second apart.
pub fn clock_millis(t: Timestamp) -> String {
    t.strftime("%H:%M:%S%.3f").to_string()
}

/// The phase as the API spells it (`CreatingVM`); `Pending` before the controller wrote one.
pub fn phase(phase: Option<Phase>) -> String {
    phase
        .and_then(|p| serde_json::to_value(p).ok())
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| "Pending".into())
}

/// A whole percentage, never more than 100 nor less than 0.
pub fn percent(fraction: f64) -> u32 {
    (fraction.clamp(0.0, 1.0) * 100.0).floor() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_rates_and_durations_read_as_people_say_them() {
        assert_eq!(bytes(12.0), "12 B");
        assert_eq!(bytes(64.0 * 1048576.0), "64.0 MiB");
        assert_eq!(rate(1.5 * 1048576.0), "1.5 MiB/s");
        assert_eq!(duration(0.42), "0.4 s");
        assert_eq!(duration(42.0), "42 s");
        assert_eq!(duration(192.0), "3 min 12 s");
        assert_eq!(duration(7500.0), "2 h 5 min");
        assert_eq!(phase(Some(Phase::CreatingVm)), "CreatingVM");
        assert_eq!(phase(None), "Pending");
        assert_eq!(percent(0.999), 99);
        assert_eq!(percent(1.5), 100);
        let t: Timestamp = "2026-12-01T10:00:00.123Z".parse().unwrap();
        assert_eq!(clock(t), "10:00:00 UTC");
        assert_eq!(clock_millis(t), "10:00:00.123");
        assert_eq!(ago(t, "2026-12-01T10:03:30Z".parse().unwrap()), "3 min ago");
    }
}
