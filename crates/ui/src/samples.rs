//! Throughput over time, from progress sampled while the UI runs. The API records how far each disk is, not how
//! fast it went: the rate is the change in bytes done between samples.

use std::collections::VecDeque;

/// At one sample every 2 s, an hour of history; older samples are dropped.
const KEEP: usize = 1800;

/// One plan's progress over time: (seconds since the UNIX epoch, bytes done), oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    points: VecDeque<(f64, f64)>,
}

impl Samples {
    /// Records `done` bytes at `at`; a sample not later than the last one is ignored.
    pub fn record(&mut self, at: f64, done: f64) {
        if self.points.back().is_some_and(|&(last, _)| at <= last) {
            return;
        }
        self.points.push_back((at, done.max(0.0)));
        if self.points.len() > KEEP {
            self.points.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Seconds between the first sample and the last.
    pub fn span(&self) -> f64 {
        match (self.points.front(), self.points.back()) {
            (Some(first), Some(last)) => last.0 - first.0,
            _ => 0.0,
        }
    }

    /// Bytes per second over the last `window` seconds (or since the first sample, when that is sooner); none
    /// before two samples a second apart. Progress that went back (a disk written again) counts as none.
    pub fn recent_rate(&self, window: f64) -> Option<f64> {
        let &(end, last) = self.points.back()?;
        let &(start, first) = self
            .points
            .iter()
            .rev()
            .find(|(at, _)| *at <= end - window)
            .or(self.points.front())?;
        let seconds = end - start;
        (seconds >= 1.0).then(|| ((last - first) / seconds).max(0.0))
    }

    /// Throughput over time: at each of up to `points` evenly spaced times, the average rate over the `window`
    /// seconds before it (or since the first sample), as (that time, bytes per second).
    pub fn series(&self, points: usize, window: f64) -> Vec<(f64, f64)> {
        let span = self.span();
        let points = points.min(self.points.len().saturating_sub(1));
        if span <= 0.0 || points == 0 {
            return Vec::new();
        }
        let start = self.points[0].0;
        let step = span / points as f64;
        (1..=points)
            .map(|i| {
                let to = start + step * i as f64;
                let from = (to - window.max(step)).max(start);
                let rate = (self.done_at(to) - self.done_at(from)) / (to - from);
                (to, rate.max(0.0))
            })
            .collect()
    }

    /// Bytes done at `at`, read off the line between the samples around it.
    fn done_at(&self, at: f64) -> f64 {
        let after = self.points.iter().position(|&(t, _)| t >= at);
        match after {
            None => self.points.back().map_or(0.0, |p| p.1),
            Some(0) => self.points[0].1,
            Some(i) => {
                let ((t0, d0), (t1, d1)) = (self.points[i - 1], self.points[i]);
                d0 + (d1 - d0) * (at - t0) / (t1 - t0)
            }
        }
    }
}

/// Seconds left for `remaining` bytes at `rate`; none without a rate.
pub fn eta_seconds(remaining: f64, rate: Option<f64>) -> Option<f64> {
    rate.filter(|r| *r > 0.0).map(|r| remaining.max(0.0) / r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    fn steady(seconds: u32, per_second: f64) -> Samples {
        let mut s = Samples::default();
        for t in 0..=seconds {
            s.record(1000.0 + f64::from(t), f64::from(t) * per_second);
        }
        s
    }

    #[test]
    fn the_rate_is_the_change_in_bytes_over_the_window() {
        let s = steady(100, 2.0 * MIB);
        assert_eq!(s.recent_rate(30.0), Some(2.0 * MIB));
        // A window longer than the samples: since the first one.
        assert_eq!(s.recent_rate(1000.0), Some(2.0 * MIB));
        let mut stalled = s.clone();
        for t in 101..=200 {
            stalled.record(1000.0 + f64::from(t), 200.0 * MIB);
        }
        assert_eq!(stalled.recent_rate(60.0), Some(0.0), "no progress lately");
        assert!(stalled.recent_rate(150.0).unwrap() > 0.0);
    }

    #[test]
    fn no_rate_before_two_samples_a_second_apart_and_time_only_moves_forward() {
        let mut s = Samples::default();
        assert_eq!(s.recent_rate(60.0), None);
        s.record(10.0, 0.0);
        assert_eq!(s.recent_rate(60.0), None);
        s.record(10.5, 5.0);
        assert_eq!(s.recent_rate(60.0), None, "half a second says little");
        s.record(9.0, 100.0);
        assert_eq!(s.len(), 2, "an earlier sample is ignored");
        s.record(12.0, 20.0);
        assert_eq!(s.recent_rate(60.0), Some(10.0));
    }

    #[test]
    fn progress_that_goes_back_is_no_negative_rate() {
        let mut s = Samples::default();
        s.record(0.0, 100.0);
        s.record(10.0, 50.0);
        assert_eq!(s.recent_rate(60.0), Some(0.0));
        assert!(s.series(4, 10.0).iter().all(|(_, r)| *r == 0.0));
    }

    #[test]
    fn the_series_averages_the_window_before_each_point_so_a_step_spreads_over_it() {
        let s = steady(60, MIB);
        let series = s.series(6, 10.0);
        assert_eq!(series.len(), 6);
        assert!(
            series.iter().all(|(_, r)| (r - MIB).abs() < 1.0),
            "{series:?}"
        );
        assert_eq!(series.last().unwrap().0, 1060.0);
        // A disk recorded at once: its bytes spread over the window after the step.
        let mut step = Samples::default();
        for t in 0..=40 {
            step.record(f64::from(t), if t < 5 { 0.0 } else { 50.0 * MIB });
        }
        let series = step.series(40, 10.0);
        let busy: Vec<_> = series.iter().filter(|(_, r)| *r > 0.0).collect();
        assert_eq!(busy.len(), 10, "{series:?}");
        // A full window holds the step: 50 MiB over 10 s.
        assert!(
            series[9..14].iter().all(|(_, r)| *r == 5.0 * MIB),
            "{series:?}"
        );
        // Before the window is full, the rate since the first sample.
        assert_eq!(series[4].1, 50.0 * MIB / 5.0);
        assert!(Samples::default().series(10, 10.0).is_empty());
        assert_eq!(
            steady(3, MIB).series(60, 10.0).len(),
            3,
            "no more points than samples"
        );
    }

    #[test]
    fn old_samples_are_dropped() {
        let s = steady(KEEP as u32 + 10, 1.0);
        assert_eq!(s.len(), KEEP);
    }

    #[test]
    fn the_eta_is_what_is_left_at_the_rate() {
        assert_eq!(eta_seconds(100.0 * MIB, Some(2.0 * MIB)), Some(50.0));
        assert_eq!(eta_seconds(100.0, Some(0.0)), None);
        assert_eq!(eta_seconds(100.0, None), None);
        assert_eq!(eta_seconds(-5.0, Some(1.0)), Some(0.0));
    }
}
