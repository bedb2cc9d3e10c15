//! Pieces every page uses: progress bars, phase badges, times, the throughput chart.

use k8s_openapi::jiff::Timestamp;
use maud::{Markup, html};

use crate::format;
use crate::migrations::Tone;
use crate::plans::Chart;

/// A bar of `fraction` done, with `role=progressbar` and its values for assistive technology; `text` says the
/// same in words beside it.
pub fn progressbar(label: &str, fraction: f64, text: &str) -> Markup {
    let percent = format::percent(fraction);
    html! {
        span.progress {
            span.bar role="progressbar" aria-label=(label) aria-valuemin="0" aria-valuemax="100"
                aria-valuenow=(percent) aria-valuetext=(text) {
                (fill(f64::from(percent) / 100.0))
            }
            span.bar-text { (text) }
        }
    }
}

/// A bar of `now` out of `max` units (disk slots), values as counts.
pub fn meter(label: &str, now: i32, max: i32, text: &str) -> Markup {
    let fraction = if max > 0 {
        f64::from(now) / f64::from(max)
    } else {
        0.0
    };
    html! {
        span.progress {
            span.bar role="progressbar" aria-label=(label) aria-valuemin="0" aria-valuemax=(max)
                aria-valuenow=(now) aria-valuetext=(text) {
                (fill(fraction))
            }
            span.bar-text { (text) }
        }
    }
}

/// The bar's picture: drawn in SVG so that no inline style is needed (the page's policy allows none).
fn fill(fraction: f64) -> Markup {
    let width = format!("{:.2}", fraction.clamp(0.0, 1.0) * 100.0);
    html! {
        svg viewBox="0 0 100 10" preserveAspectRatio="none" aria-hidden="true" focusable="false" {
            rect.fill width=(width) height="10" {}
        }
    }
}

pub fn tone_class(tone: Tone) -> &'static str {
    match tone {
        Tone::Good => "badge good",
        Tone::Bad => "badge bad",
        Tone::Attention => "badge attention",
        Tone::Busy => "badge busy",
        Tone::Waiting => "badge waiting",
        Tone::Neutral => "badge neutral",
    }
}

/// The phase as a badge: its name in words, the colour only repeats it.
pub fn badge(phase: &str, tone: Tone) -> Markup {
    let mark = match tone {
        Tone::Good => "✓",
        Tone::Bad => "✗",
        Tone::Attention => "!",
        Tone::Busy => "▸",
        Tone::Waiting => "…",
        Tone::Neutral => "–",
    };
    html! { span class=(tone_class(tone)) { span aria-hidden="true" { (mark) " " } (phase) } }
}

/// The tone of a plan's phase.
pub fn plan_tone(phase: &str) -> Tone {
    match phase {
        "Succeeded" => Tone::Good,
        "Failed" => Tone::Bad,
        "Cancelled" | "Cancelling" => Tone::Neutral,
        "Pending" | "Scheduled" | "Waiting" => Tone::Waiting,
        _ => Tone::Busy,
    }
}

/// A time as a `<time>` element: the clock in UTC, the full instant in `datetime`.
pub fn time(t: Timestamp) -> Markup {
    html! { time datetime=(t.to_string()) { (format::clock(t)) } }
}

/// A time and how long ago it was.
pub fn time_ago(t: Timestamp, now: Timestamp) -> Markup {
    html! { time datetime=(t.to_string()) { (format::clock(t)) } " (" (format::ago(t, now)) ")" }
}

fn instant(seconds: f64) -> Timestamp {
    Timestamp::from_microsecond((seconds * 1e6) as i64).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Throughput over time as an SVG line, with a title, a description that sums it up in a sentence, and the
/// numbers in a table for those who cannot see the line. `id` must be unique on the page.
pub fn throughput_chart(id: &str, subject: &str, chart: &Chart) -> Markup {
    let (points, samples) = (&chart.points, chart.samples);
    if points.len() < 2 {
        return html! {
            p.note {
                "No throughput to chart yet: progress is sampled every 2 s while this UI runs ("
                (samples) " sample(s) so far)."
            }
        };
    }
    let (w, h, left, bottom, top) = (640.0, 180.0, 78.0, 24.0, 10.0);
    let (first, last) = (points[0].0, points[points.len() - 1].0);
    let peak = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let scale_max = nice_ceiling(peak);
    let x = |t: f64| left + (t - first) / (last - first).max(1e-9) * (w - left - 4.0);
    let y = |r: f64| top + (1.0 - r / scale_max) * (h - top - bottom);
    let line: Vec<String> = points
        .iter()
        .map(|&(t, r)| format!("{:.1},{:.1}", x(t), y(r)))
        .collect();
    let area = format!(
        "{:.1},{:.1} {} {:.1},{:.1}",
        x(first),
        y(0.0),
        line.join(" "),
        x(last),
        y(0.0)
    );
    let (peak_at, _) = points
        .iter()
        .copied()
        .fold((first, -1.0), |best, p| if p.1 > best.1 { p } else { best });
    let latest = points[points.len() - 1].1;
    let average = chart
        .average
        .map(|a| format!(", {} on average", format::rate(a)))
        .unwrap_or_default();
    let title = format!("Throughput of {subject} over time");
    let summary = format!(
        "From {} to {}: peak {} at {}, latest {}{average}; each of the {} points is the rate over the {} before \
         it (a disk's bytes are recorded when it is written).",
        format::clock(instant(first)),
        format::clock(instant(last)),
        format::rate(peak),
        format::clock(instant(peak_at)),
        format::rate(latest),
        points.len(),
        format::duration(chart.window),
    );
    let (title_id, desc_id) = (format!("{id}-title"), format!("{id}-desc"));
    html! {
        figure.chart {
            svg id=(id) viewBox={"0 0 " (w) " " (h)} role="img" aria-labelledby={(title_id) " " (desc_id)} {
                title id=(title_id) { (title) }
                desc id=(desc_id) { (summary) }
                @for fraction in [0.0, 0.5, 1.0] {
                    line.grid x1=(left) x2=(w - 4.0) y1=(y(scale_max * fraction)) y2=(y(scale_max * fraction)) {}
                    text.axis x=(left - 6.0) y=(y(scale_max * fraction) + 4.0) text-anchor="end" {
                        (format::rate(scale_max * fraction))
                    }
                }
                polygon.area points=(area) {}
                polyline.line points=(line.join(" ")) {}
                text.axis x=(left) y=(h - 6.0) text-anchor="start" { (format::clock(instant(first))) }
                text.axis x=(w - 4.0) y=(h - 6.0) text-anchor="end" { (format::clock(instant(last))) }
            }
            figcaption { (summary) }
            details id={(id) "-data"} {
                summary { "Throughput data (" (points.len()) " points)" }
                table {
                    caption { (title) }
                    thead { tr { th scope="col" { "Until" } th scope="col" { "Throughput" } } }
                    tbody {
                        @for &(t, r) in points.iter() {
                            tr { td { (time(instant(t))) } td.num { (format::rate(r)) } }
                        }
                    }
                }
            }
        }
    }
}

/// The top of the chart's scale: the least power of two MiB/s at or above the peak, at least 1 MiB/s.
fn nice_ceiling(peak: f64) -> f64 {
    let mib = 1048576.0;
    let mut top = mib;
    while top < peak {
        top *= 2.0;
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progressbar_carries_its_values_for_assistive_technology() {
        let bar = progressbar("disk 0 of web", 0.426, "42% (27 MiB of 64 MiB)").into_string();
        for expected in [
            r#"role="progressbar""#,
            r#"aria-valuenow="42""#,
            r#"aria-valuemin="0""#,
            r#"aria-valuemax="100""#,
            r#"aria-label="disk 0 of web""#,
            r#"aria-valuetext="42% (27 MiB of 64 MiB)""#,
            r#"width="42.00""#,
        ] {
            assert!(bar.contains(expected), "{expected} in {bar}");
        }
        let slots = meter("disk slots on h1", 3, 4, "3 of 4").into_string();
        assert!(
            slots.contains(r#"aria-valuenow="3""#) && slots.contains(r#"aria-valuemax="4""#),
            "{slots}"
        );
    }

    #[test]
    fn the_chart_has_a_title_a_summary_and_its_data_as_a_table() {
        let mib = 1048576.0;
        let points = vec![
            (1000.0, 2.0 * mib),
            (1010.0, 6.0 * mib),
            (1020.0, 4.0 * mib),
        ];
        let data = Chart {
            points,
            window: 30.0,
            samples: 11,
            average: Some(3.0 * mib),
        };
        let chart = throughput_chart("c1", "plan apps/wave", &data).into_string();
        assert!(chart.contains(r#"role="img""#), "{chart}");
        assert!(
            chart.contains(r#"aria-labelledby="c1-title c1-desc""#),
            "{chart}"
        );
        assert!(
            chart.contains("<title id=\"c1-title\">Throughput of plan apps/wave over time</title>"),
            "{chart}"
        );
        assert!(
            chart.contains("peak 6.0 MiB/s at 00:16:50 UTC, latest 4.0 MiB/s, 3.0 MiB/s on average; each of the 3 \
                            points is the rate over the 30 s before it"),
            "{chart}"
        );
        assert_eq!(
            chart.matches("<tr>").count(),
            4,
            "a header and a row per point: {chart}"
        );
        assert!(chart.contains("8.0 MiB/s"), "the scale's top: {chart}");
        let one = Chart {
            points: data.points[..1].to_vec(),
            ..data
        };
        let empty = throughput_chart("c2", "plan x", &one).into_string();
        assert!(
            empty.contains("No throughput to chart yet") && !empty.contains("<svg"),
            "{empty}"
        );
    }
}
