//! The warm part of `ferry describe`: when rounds run and the cutover comes, each round's copy, and what the
//! downtime will be spent on.

use ferry_api::{ChangeTrackingChange, CutoverCheck, WarmRound, WarmSpec, WarmStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{age, bytes, table};

pub fn render(out: &mut String, spec: &WarmSpec, warm: Option<&WarmStatus>, now: Timestamp) {
    let default = WarmStatus::default();
    let warm = warm.unwrap_or(&default);
    out.push_str("\nWarm:\n");
    let cutover = match (spec.cutover, &spec.cutover_at) {
        (true, _) => "asked for (spec.warm.cutover)".to_string(),
        (false, Some(at)) if at.0 <= now => format!("due since {}", at.0),
        (false, Some(at)) => format!("at {} (in {})", at.0, age(now, at.0)),
        (false, None) => "when spec.warm.cutover is set".into(),
    };
    out.push_str(&format!(
        "  every {}s until the cutover, {cutover}\n",
        spec.precopy_interval_seconds
    ));
    out.push_str(match spec.cutover_check {
        CutoverCheck::Source => {
            "  the cutover proves each volume against the whole powered-off source (one more read of every disk)\n"
        }
        CutoverCheck::ChangedAreas => {
            "  the cutover proves only the changed areas it copies (cutoverCheck ChangedAreas; the source is not read \
             whole again)\n"
        }
    });
    if let Some(why) = &warm.refused {
        out.push_str(&format!(
            "  warm mode refused: {why}; the cutover copies the source whole after power-off\n"
        ));
    }
    match warm.change_tracking_enabled {
        Some(ChangeTrackingChange::Restored) => {
            out.push_str("  Changed Block Tracking: turned on by Ferry, and off again\n")
        }
        Some(_) => out.push_str(
            "  Changed Block Tracking: turned on by Ferry (turned off again when the migration ends)\n",
        ),
        None => {}
    }
    if let Some(snapshot) = &warm.snapshot {
        out.push_str(&format!(
            "  round {} in flight: snapshot {}{}\n",
            snapshot.round,
            snapshot.name,
            if snapshot.removing {
                " copied, being removed"
            } else {
                ""
            }
        ));
    } else if let (Some(at), None) = (&warm.next_round_at, &warm.final_copy)
        && at.0 > now
        && !spec.cutover_due(&Time(now))
    {
        out.push_str(&format!("  next round in {}\n", age(now, at.0)));
    }
    if !warm.rounds.is_empty() {
        let mut rows = vec![head()];
        let shown = warm.rounds.len();
        if (warm.rounds_done as usize) > shown {
            out.push_str(&format!(
                "  {} rounds done; the latest {shown}:\n",
                warm.rounds_done
            ));
        }
        rows.extend(warm.rounds.iter().map(|r| row(&r.round.to_string(), r)));
        if let Some(last) = &warm.final_copy {
            rows.push(row("cutover", last));
        }
        out.push_str(&table(&rows));
    }
    for reason in warm
        .rounds
        .iter()
        .chain(&warm.final_copy)
        .flat_map(|r| &r.reasons)
    {
        out.push_str(&format!("  copied whole again: {reason}\n"));
    }
    match (&warm.final_copy, warm.rounds.last()) {
        (Some(last), _) => out.push_str(&format!(
            "  downtime copy: {} in {}\n",
            bytes(last.bytes_read as f64),
            seconds(last)
        )),
        (None, Some(latest)) => out.push_str(&format!(
            "  a cutover now copies what changed since round {} ended; the latest round read {} in {}\n",
            latest.round,
            bytes(latest.bytes_read as f64),
            seconds(latest)
        )),
        (None, None) => {}
    }
}

fn head() -> Vec<String> {
    ["  ROUND", "TOOK", "READ", "AREAS", "WHOLE DISKS"]
        .map(String::from)
        .to_vec()
}

fn row(name: &str, round: &WarmRound) -> Vec<String> {
    vec![
        format!("  {name}"),
        seconds(round),
        bytes(round.bytes_read as f64),
        round.areas.to_string(),
        round.full_disks.to_string(),
    ]
}

fn seconds(round: &WarmRound) -> String {
    round
        .seconds()
        .map_or_else(|| "-".into(), |s| format!("{s:.1}s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + s).unwrap())
    }

    fn round(n: i32, read: i64, whole: i32) -> WarmRound {
        WarmRound {
            round: n,
            started: Some(at(n as i64 * 100)),
            finished: Some(at(n as i64 * 100 + 4)),
            areas: if whole > 0 { 0 } else { 12 },
            bytes_read: read,
            full_disks: whole,
            ..Default::default()
        }
    }

    #[test]
    fn rounds_the_next_one_and_what_a_cutover_would_copy_are_shown() {
        let spec = WarmSpec {
            precopy_interval_seconds: 600,
            ..Default::default()
        };
        let warm = WarmStatus {
            rounds_done: 2,
            rounds: vec![round(1, 16 << 20, 2), round(2, 1 << 20, 0)],
            next_round_at: Some(at(800)),
            change_tracking_enabled: Some(ChangeTrackingChange::Enabled),
            ..Default::default()
        };
        let mut out = String::new();
        render(&mut out, &spec, Some(&warm), at(500).0);
        assert!(
            out.contains("every 600s until the cutover, when spec.warm.cutover is set"),
            "{out}"
        );
        assert!(out.contains("next round in 5m0s"), "{out}");
        assert!(
            out.contains("turned on by Ferry (turned off again"),
            "{out}"
        );
        assert!(out.contains("16.0 MiB"), "{out}");
        assert!(
            out.contains("a cutover now copies what changed since round 2"),
            "{out}"
        );
        assert!(out.contains("4.0s"), "{out}");

        let done = WarmStatus {
            final_copy: Some(round(3, 2 << 20, 0)),
            ..warm
        };
        let mut out = String::new();
        let cut = WarmSpec {
            cutover: true,
            ..spec
        };
        render(&mut out, &cut, Some(&done), at(900).0);
        assert!(out.contains("asked for"), "{out}");
        assert!(
            out.contains("against the whole powered-off source"),
            "{out}"
        );
        assert!(out.contains("  cutover"), "{out}");
        assert!(out.contains("downtime copy: 2.0 MiB in 4.0s"), "{out}");
        assert!(!out.contains("next round"), "{out}");
    }
}
