//! The guest check's decision, pure: what the VM and its instance show, against what the guest can offer.

use std::time::Duration;

use ferry_api::{GuestEvidence, GuestStatus};
use k8s_openapi::jiff::Timestamp;

use super::identity::{ExpectedNic, Identity, SeenInterface, compare};

/// What the migration asks of the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The guest runs qemu-guest-agent, so only its answer proves the guest up.
    pub agent_required: bool,
    /// Without an agent: how long the instance must run without a crash or restart.
    pub settle: Duration,
    /// From the check's start (or a person's restart) to giving up.
    pub timeout: Duration,
    /// The NICs whose addresses were configured by hand: the agent must show them back.
    pub network: Vec<ExpectedNic>,
    /// Whether an address not back fails the check, or is only said (a Windows guest gets its address from a
    /// first-boot script, whose order against the agent's install nobody here has watched yet).
    pub network_must_match: bool,
}

/// What the VM and its instance show now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub vm_exists: bool,
    /// The VM's `printableStatus`, for example `CrashLoopBackOff`.
    pub vm_status: Option<String>,
    /// The VMI's phase; `None` when there is no VMI.
    pub vmi_phase: Option<String>,
    /// Since when the VMI's `Ready` condition is True (the domain runs).
    pub ready_since: Option<Timestamp>,
    pub agent_connected: bool,
    /// Since when the agent answers.
    pub agent_since: Option<Timestamp>,
    pub os: Option<String>,
    pub ip_addresses: Vec<String>,
    /// The VMI's NICs, with what the agent said of each.
    pub interfaces: Vec<SeenInterface>,
    /// The VMI's conditions, as `Type=Status (Reason)`.
    pub conditions: Vec<String>,
    /// Why KubeVirt cannot create the VMI's launcher pod, in its words (it keeps trying).
    pub pod_refused: Option<String>,
    /// Why KubeVirt cannot bring the domain in line with the VMI, in its words (it keeps trying).
    pub not_synchronized: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Proven(GuestStatus),
    Waiting {
        reason: &'static str,
        message: String,
        /// When to look again: nothing here is watched, so this is how soon a change is seen.
        recheck: Duration,
    },
    Failed {
        cause: String,
    },
}

pub fn judge(
    check: &Check,
    observed: &Observed,
    window_start: Timestamp,
    now: Timestamp,
) -> Verdict {
    let running = observed.vmi_phase.as_deref() == Some("Running");
    let state = observed.summary();
    if running && observed.agent_connected {
        // The agent starts before the network is up: its answer is proof enough, but the guest's address and
        // what it says of its OS are worth the settle time. KubeVirt reports the agent connected before it first
        // asks it about the guest (`guestOSInfo` follows within its poll interval), and the address of a
        // masquerade interface from the domain, before the agent answers.
        let answering = observed
            .agent_since
            .map_or(u64::MAX, |since| seconds_between(since, now));
        let settled = answering >= check.settle.as_secs();
        let identity = compare(&check.network, &observed.interfaces);
        if let Identity::Lost(lost) = &identity
            && settled
            && check.network_must_match
        {
            return failed(format!(
                "the guest's network did not come up as it was on VMware: {lost}. Its configuration no longer \
                 applies to the NIC it sees (without guest adaptation Linux names a NIC after its new PCI slot; \
                 conversion.guestAdaptation VirtV2v keeps a Linux guest's interface names)"
            ));
        }
        let missing: Vec<&str> = [
            (observed.os.is_none(), "OS"),
            (observed.ip_addresses.is_empty(), "IP address"),
            (
                matches!(identity, Identity::Lost(_) | Identity::Unknown(_)),
                "addresses configured by hand",
            ),
        ]
        .into_iter()
        .filter_map(|(absent, what)| absent.then_some(what))
        .collect();
        if missing.is_empty() || settled {
            return Verdict::Proven(agent_answered(observed, &identity));
        }
        return Verdict::Waiting {
            // Both arrive as VMI changes (watched); the time only tells when the settle ends.
            recheck: until(now, observed.agent_since.unwrap_or(now) + check.settle),
            reason: if observed.ip_addresses.is_empty() {
                "WaitingForAddress"
            } else if missing.contains(&"addresses configured by hand") {
                "WaitingForNetworkIdentity"
            } else {
                "WaitingForGuestInfo"
            },
            message: format!(
                "the guest agent answered; waiting until {} for the guest's {}",
                clock(observed.agent_since.unwrap_or(now) + check.settle),
                missing.join(" and ")
            ),
        };
    }
    if !observed.vm_exists {
        return failed("the VirtualMachine was deleted before the guest proved itself".into());
    }
    match observed.vmi_phase.as_deref() {
        Some("Failed") => {
            return failed(format!(
                "the VM's instance failed: the domain crashed or could not start ({state})"
            ));
        }
        Some("Succeeded") => {
            return failed(format!("the guest powered itself off ({state})"));
        }
        _ => {}
    }
    if observed.vm_status.as_deref() == Some("CrashLoopBackOff") {
        return failed(format!(
            "the VM is in CrashLoopBackOff: its instance keeps failing ({state})"
        ));
    }
    let steady_since = observed.ready_since.filter(|_| running);
    if !check.agent_required
        && let Some(since) = steady_since
    {
        let steady = seconds_between(since, now);
        if steady >= check.settle.as_secs() {
            return Verdict::Proven(GuestStatus {
                evidence: GuestEvidence::RanSteadily,
                message: format!(
                    "ran for {steady} s without a crash or restart; no guest agent answered, so the guest's own \
                     boot was not observed"
                ),
                ..Default::default()
            });
        }
    }
    let timeout = check.timeout.as_secs();
    if let Some(refused) = &observed.pod_refused {
        // Someone may yet fix what refuses the pod (a namespace's Pod Security level, a quota): KubeVirt retries,
        // and so does the check, until its timeout.
        if seconds_between(window_start, now) > timeout {
            return failed(format!(
                "KubeVirt could not create the VM's launcher pod within {timeout} s: {refused}"
            ));
        }
        return Verdict::Waiting {
            reason: "LauncherPodRefused",
            message: format!(
                "KubeVirt cannot create the VM's launcher pod and keeps trying: {refused}"
            ),
            recheck: Duration::from_secs(30),
        };
    }
    if let Some(why) = observed.not_synchronized.as_ref().filter(|_| !running) {
        // A NIC whose pod link nothing attached, say: it may yet be fixed, and KubeVirt retries.
        if seconds_between(window_start, now) > timeout {
            return failed(format!(
                "KubeVirt could not start the VM within {timeout} s: {why}"
            ));
        }
        return Verdict::Waiting {
            reason: "VMINotSynchronized",
            message: format!("KubeVirt cannot start the VM and keeps trying: {why}"),
            recheck: Duration::from_secs(30),
        };
    }
    if seconds_between(window_start, now) > timeout {
        return failed(if check.agent_required {
            format!("the guest agent did not answer within {timeout} s ({state})")
        } else {
            format!(
                "the VM did not run steadily for {} s within {timeout} s ({state})",
                check.settle.as_secs()
            )
        });
    }
    // Messages name fixed times, not counters, so waiting writes nothing new.
    let deadline = window_start + Duration::from_secs(timeout);
    match (check.agent_required, steady_since) {
        (true, _) => Verdict::Waiting {
            recheck: until(now, deadline),
            reason: "WaitingForAgent",
            message: format!(
                "waiting for the guest agent to answer until {} ({state})",
                clock(deadline)
            ),
        },
        (false, Some(since)) => Verdict::Waiting {
            // Just after the settle time ends; an agent that answers sooner is a VMI change (watched).
            recheck: until(now, since + check.settle),
            reason: "SettlingGuest",
            message: format!(
                "running since {}; proven once it runs until {} without a crash, or its agent answers",
                clock(since),
                clock(since + check.settle)
            ),
        },
        (false, None) => Verdict::Waiting {
            recheck: until(now, deadline),
            reason: "WaitingForGuest",
            message: format!(
                "waiting for the VM to run, until {} ({state})",
                clock(deadline)
            ),
        },
    }
}

/// How long to wait before looking again: VMI changes wake the check, so the clock only has to catch `at` (a
/// settle end or the deadline), and a lost watch event at the latest after `LOOK_AGAIN`.
fn until(now: Timestamp, at: Timestamp) -> Duration {
    Duration::from_secs(seconds_between(now, at) + 1).min(LOOK_AGAIN)
}

const LOOK_AGAIN: Duration = Duration::from_secs(30);

fn failed(cause: String) -> Verdict {
    Verdict::Failed { cause }
}

fn agent_answered(observed: &Observed, identity: &Identity) -> GuestStatus {
    let os = observed.os.as_deref().unwrap_or("an unnamed OS");
    let ips = if observed.ip_addresses.is_empty() {
        "no IP address".to_string()
    } else {
        observed.ip_addresses.join(", ")
    };
    let network = match identity {
        Identity::NotAsked => String::new(),
        Identity::Kept { said, .. } => said.clone(),
        Identity::Unknown(said) => format!("network identity not compared: {said}"),
        Identity::Lost(said) => format!("network identity lost: {said}"),
    };
    let message = match network.as_str() {
        "" => format!("guest agent answered: {os}, {ips}"),
        network => format!("guest agent answered: {os}, {ips}; {network}"),
    };
    GuestStatus {
        evidence: GuestEvidence::AgentAnswered,
        message,
        os: observed.os.clone(),
        ip_addresses: observed.ip_addresses.clone(),
        network,
    }
}

fn seconds_between(from: Timestamp, to: Timestamp) -> u64 {
    from.duration_until(to).as_secs().max(0) as u64
}

/// `14:02:11 UTC`.
fn clock(t: Timestamp) -> String {
    t.strftime("%H:%M:%S UTC").to_string()
}

impl Observed {
    /// For example `VMI Running; Ready=True, AgentConnected=False`.
    pub fn summary(&self) -> String {
        match &self.vmi_phase {
            None => "no VMI".into(),
            Some(phase) if self.conditions.is_empty() => format!("VMI {phase}"),
            Some(phase) => format!("VMI {phase}; {}", self.conditions.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::foreign::VmiStatus;

    const START: i64 = 1_700_000_000;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(START + seconds).unwrap()
    }

    fn check(agent_required: bool) -> Check {
        Check {
            agent_required,
            settle: Duration::from_secs(60),
            timeout: Duration::from_secs(900),
            network: vec![],
            network_must_match: true,
        }
    }

    fn running_since(seconds: i64) -> Observed {
        Observed {
            vm_exists: true,
            vm_status: Some("Running".into()),
            vmi_phase: Some("Running".into()),
            ready_since: Some(at(seconds)),
            conditions: vec!["Ready=True".into()],
            ..Default::default()
        }
    }

    fn evidence(verdict: &Verdict) -> Option<GuestEvidence> {
        match verdict {
            Verdict::Proven(guest) => Some(guest.evidence),
            _ => None,
        }
    }

    #[test]
    fn without_an_agent_a_steady_run_is_enough_and_says_what_was_not_seen() {
        let observed = running_since(10);
        let waiting = judge(&check(false), &observed, at(0), at(30));
        assert!(matches!(
            waiting,
            Verdict::Waiting {
                reason: "SettlingGuest",
                ..
            }
        ));
        let proven = judge(&check(false), &observed, at(0), at(71));
        assert_eq!(evidence(&proven), Some(GuestEvidence::RanSteadily));
        let Verdict::Proven(guest) = proven else {
            unreachable!()
        };
        assert!(guest.message.contains("ran for 61 s"), "{}", guest.message);
        assert!(guest.message.contains("not observed"));
    }

    #[test]
    fn an_address_configured_by_hand_must_come_back_on_its_nic_within_the_settle_time() {
        let mut check = check(true);
        check.network = vec![ExpectedNic {
            mac: "00:50:56:aa:bb:cc".into(),
            addresses: vec!["192.168.50.10/24".into()],
            name: Some("ens192".into()),
        }];
        let mut observed = running_since(10);
        observed.agent_connected = true;
        observed.agent_since = Some(at(11));
        observed.os = Some("Debian GNU/Linux 12 (bookworm)".into());
        observed.ip_addresses = vec!["fe80::1".into()];
        observed.interfaces = vec![SeenInterface {
            mac: "00:50:56:aa:bb:cc".into(),
            name: Some("enp1s0".into()),
            addresses: vec!["fe80::1".into()],
        }];
        assert!(matches!(
            judge(&check, &observed, at(0), at(30)),
            Verdict::Waiting {
                reason: "WaitingForNetworkIdentity",
                ..
            }
        ));
        let Verdict::Failed { cause } = judge(&check, &observed, at(0), at(71)) else {
            panic!("the address never came back");
        };
        assert!(
            cause.starts_with(
                "the guest's network did not come up as it was on VMware: NIC 00:50:56:aa:bb:cc is enp1s0 in \
                 the guest where it was ens192 and lacks 192.168.50.10/24"
            ),
            "{cause}"
        );
        observed.interfaces[0].name = Some("ens192".into());
        observed.interfaces[0].addresses = vec!["192.168.50.10".into()];
        observed.ip_addresses = vec!["192.168.50.10".into()];
        let Verdict::Proven(guest) = judge(&check, &observed, at(0), at(30)) else {
            panic!("the identity is back");
        };
        assert_eq!(
            guest.network,
            "network identity kept: NIC 00:50:56:aa:bb:cc is ens192 in the guest, with 192.168.50.10/24"
        );
        assert!(guest.message.ends_with(&guest.network), "{}", guest.message);
        // Where it is only said (Windows), a lost address is proven all the same, and said.
        check.network_must_match = false;
        observed.interfaces[0].addresses = vec!["169.254.3.4".into()];
        let Verdict::Proven(guest) = judge(&check, &observed, at(0), at(71)) else {
            panic!("said, not failed");
        };
        assert!(
            guest
                .network
                .starts_with("network identity lost: NIC 00:50:56:aa:bb:cc is ens192"),
            "{}",
            guest.network
        );
    }

    #[test]
    fn an_answering_agent_proves_more_and_sooner() {
        let mut observed = running_since(10);
        observed.agent_connected = true;
        observed.agent_since = Some(at(11));
        observed.os = Some("Debian GNU/Linux 12 (bookworm)".into());
        assert!(
            matches!(
                judge(&check(false), &observed, at(0), at(12)),
                Verdict::Waiting {
                    reason: "WaitingForAddress",
                    ..
                }
            ),
            "an agent without an address yet is given the settle time to get one"
        );
        let Verdict::Proven(late) = judge(&check(true), &observed, at(0), at(71)) else {
            panic!("no address after the settle time: proven all the same");
        };
        assert_eq!(
            late.message,
            "guest agent answered: Debian GNU/Linux 12 (bookworm), no IP address"
        );
        observed.ip_addresses = vec!["10.0.2.2".into()];
        for required in [true, false] {
            let Verdict::Proven(guest) = judge(&check(required), &observed, at(0), at(12)) else {
                panic!("the agent's answer proves the guest");
            };
            assert_eq!(guest.evidence, GuestEvidence::AgentAnswered);
            assert_eq!(
                guest.message,
                "guest agent answered: Debian GNU/Linux 12 (bookworm), 10.0.2.2"
            );
        }
    }

    #[test]
    fn an_agent_that_has_not_said_what_os_runs_is_given_the_settle_time() {
        let mut observed = running_since(10);
        observed.agent_connected = true;
        observed.agent_since = Some(at(11));
        observed.ip_addresses = vec!["10.88.0.19".into()];
        let Verdict::Waiting {
            reason, message, ..
        } = judge(&check(true), &observed, at(0), at(12))
        else {
            panic!("waiting for the OS");
        };
        assert_eq!(reason, "WaitingForGuestInfo");
        assert!(message.ends_with("for the guest's OS"), "{message}");
        observed.ip_addresses.clear();
        let Verdict::Waiting { message, .. } = judge(&check(true), &observed, at(0), at(12)) else {
            panic!("waiting for both");
        };
        assert!(
            message.ends_with("for the guest's OS and IP address"),
            "{message}"
        );
        let Verdict::Proven(late) = judge(&check(true), &observed, at(0), at(71)) else {
            panic!("after the settle time the answer proves the guest all the same");
        };
        assert_eq!(
            late.message,
            "guest agent answered: an unnamed OS, no IP address"
        );
    }

    #[test]
    fn a_refused_launcher_pod_is_waited_for_with_kubevirts_words_then_the_check_fails() {
        let observed = Observed {
            vm_exists: true,
            vmi_phase: Some("Pending".into()),
            pod_refused: Some(
                "pods \"virt-launcher-web-x\" is forbidden: violates PodSecurity".into(),
            ),
            ..Default::default()
        };
        let Verdict::Waiting {
            reason, message, ..
        } = judge(&check(false), &observed, at(0), at(100))
        else {
            panic!("KubeVirt retries: so does the check");
        };
        assert_eq!(reason, "LauncherPodRefused");
        assert!(message.ends_with("violates PodSecurity"), "{message}");
        let Verdict::Failed { cause } = judge(&check(false), &observed, at(0), at(901)) else {
            panic!("bounded by the check's timeout");
        };
        assert_eq!(
            cause,
            "KubeVirt could not create the VM's launcher pod within 900 s: pods \"virt-launcher-web-x\" is \
             forbidden: violates PodSecurity"
        );
    }

    #[test]
    fn a_vm_kubevirt_cannot_set_up_is_waited_for_with_its_words_then_the_check_fails() {
        // As real KubeVirt v1.9.0 shows a NIC on a Multus network without its NetworkAttachmentDefinition.
        let status: VmiStatus = serde_json::from_value(serde_json::json!({
            "phase": "Scheduled",
            "conditions": [{"type": "Synchronized", "status": "False",
                "reason": "Synchronizing with the Domain failed.",
                "message": "failed to configure vmi network: setup failed, err: pod link (pod0e6b58809dd) is missing"}],
        }))
        .unwrap();
        let observed = Observed {
            vm_exists: true,
            vmi_phase: Some("Scheduled".into()),
            not_synchronized: status.not_synchronized(),
            pod_refused: status.pod_refused().map(String::from),
            ..Default::default()
        };
        let Verdict::Waiting {
            reason, message, ..
        } = judge(&check(false), &observed, at(0), at(100))
        else {
            panic!("KubeVirt retries: so does the check");
        };
        assert_eq!(reason, "VMINotSynchronized");
        assert_eq!(
            message,
            "KubeVirt cannot start the VM and keeps trying: Synchronizing with the Domain failed: failed to \
             configure vmi network: setup failed, err: pod link (pod0e6b58809dd) is missing"
        );
        let Verdict::Failed { cause } = judge(&check(false), &observed, at(0), at(901)) else {
            panic!("bounded by the check's timeout");
        };
        assert!(
            cause.starts_with("KubeVirt could not start the VM within 900 s: Synchronizing"),
            "{cause}"
        );
    }

    #[test]
    fn a_required_agent_is_waited_for_then_the_check_fails() {
        let observed = running_since(10);
        let waiting = judge(&check(true), &observed, at(0), at(600));
        assert!(matches!(
            waiting,
            Verdict::Waiting {
                reason: "WaitingForAgent",
                ..
            }
        ));
        let Verdict::Failed { cause } = judge(&check(true), &observed, at(0), at(901)) else {
            panic!("a silent agent fails the check after the timeout");
        };
        assert!(cause.contains("did not answer within 900 s"), "{cause}");
        assert!(cause.contains("VMI Running; Ready=True"), "{cause}");
    }

    #[test]
    fn waiting_messages_do_not_change_while_nothing_does() {
        let observed = running_since(10);
        for required in [true, false] {
            let message = |now| match judge(&check(required), &observed, at(0), at(now)) {
                Verdict::Waiting { message, .. } => message,
                other => panic!("{other:?}"),
            };
            assert_eq!(message(20), message(40));
        }
    }

    #[test]
    fn crashes_restarts_and_shutdowns_fail_at_once() {
        let mut crashed = running_since(10);
        crashed.vmi_phase = Some("Failed".into());
        let mut off = running_since(10);
        off.vmi_phase = Some("Succeeded".into());
        let mut looping = running_since(10);
        looping.vmi_phase = Some("Scheduling".into());
        looping.vm_status = Some("CrashLoopBackOff".into());
        let gone = Observed::default();
        for (observed, words) in [
            (crashed, "instance failed"),
            (off, "powered itself off"),
            (looping, "CrashLoopBackOff"),
            (gone, "deleted"),
        ] {
            let Verdict::Failed { cause } = judge(&check(false), &observed, at(0), at(20)) else {
                panic!("{words}: expected a failure");
            };
            assert!(cause.contains(words), "{cause}");
        }
    }

    #[test]
    fn a_restarted_instance_settles_from_its_own_start() {
        // The instance came back at 500 s: 550 s is only 50 s of steady running.
        let observed = running_since(500);
        assert!(matches!(
            judge(&check(false), &observed, at(0), at(550)),
            Verdict::Waiting { .. }
        ));
        assert_eq!(
            evidence(&judge(&check(false), &observed, at(0), at(561))),
            Some(GuestEvidence::RanSteadily)
        );
    }

    #[test]
    fn a_vm_that_never_runs_fails_after_the_timeout() {
        let mut pending = running_since(0);
        pending.vmi_phase = Some("Scheduling".into());
        pending.ready_since = None;
        assert!(matches!(
            judge(&check(false), &pending, at(0), at(100)),
            Verdict::Waiting {
                reason: "WaitingForGuest",
                ..
            }
        ));
        let Verdict::Failed { cause } = judge(&check(false), &pending, at(0), at(901)) else {
            panic!("expected a failure");
        };
        assert!(
            cause.contains("did not run steadily for 60 s within 900 s"),
            "{cause}"
        );
    }
}
