//! The memory a conversion Job used, for its report: what to set its pod's memory limit to, and what
//! `ferry bench migrate` prints; and the CPU it used, for its log.

use nix::sys::resource::{UsageWho, getrusage};

/// The process's peak resident set plus the largest of its finished children's (qemu-img): an upper bound on
/// the pod's peak, since the two need not peak together. None where the kernel does not say.
pub fn peak_rss_bytes() -> Option<u64> {
    let kib = |who| {
        getrusage(who)
            .ok()
            .map(|u| u64::try_from(u.max_rss()).unwrap_or(0))
    };
    Some((kib(UsageWho::RUSAGE_SELF)? + kib(UsageWho::RUSAGE_CHILDREN)?) * 1024)
}

/// User and system CPU seconds of the process and its finished children so far.
pub fn cpu_seconds() -> Option<f64> {
    let seconds = |who| {
        getrusage(who).ok().map(|u| {
            let (user, system) = (u.user_time(), u.system_time());
            (user.tv_sec() + system.tv_sec()) as f64
                + (user.tv_usec() + system.tv_usec()) as f64 / 1e6
        })
    };
    Some(seconds(UsageWho::RUSAGE_SELF)? + seconds(UsageWho::RUSAGE_CHILDREN)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_running_process_has_a_peak_of_at_least_the_buffer_it_touched() {
        let buffer = vec![1u8; 32 << 20];
        let peak = super::peak_rss_bytes().expect("Linux reports ru_maxrss");
        assert!(peak >= 32 << 20, "{peak}");
        assert_eq!(buffer.iter().map(|&b| b as u64).sum::<u64>(), 32 << 20);
    }
}
