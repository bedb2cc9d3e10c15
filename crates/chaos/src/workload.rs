//! The workloads: what a run asks of Ferry, and what the person in it does along the way.

use anyhow::{Context, Result};
use ferry_api::Phase;
use ferry_controller::surface::CHECKPOINTS;

/// What `all` runs: the workloads on the demo VMs, seconds per trial.
pub const WORKLOADS: [&str; 8] = [
    "happy-1", "happy-3", "staged-3", "cancel", "delete", "bad-spec", "plan", "warm",
];
/// Asked for by name only: minutes per trial.
pub const REAL_GUEST_WORKLOADS: [&str; 1] = ["linux"];

/// What the person does once the migration holds before a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Cancel,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub vm: &'static str,
    /// Cancel or delete when held before this checkpoint.
    pub act: Option<(Act, String)>,
    /// Starts with a Secret name that does not exist, then corrects it once Ferry asks for a person.
    pub bad_spec: bool,
    /// Through the lab's staging store (`spec.staging`) instead of straight into the volumes.
    pub staged: bool,
    /// A `MigrationPlan` of these VMs instead of one migration, under a per-host limit of [`PLAN_HOST_LIMIT`].
    pub plan: Option<&'static [&'static str]>,
    /// Warm (`spec.warm`, Ferry allowed to turn Changed Block Tracking on, the cutover asked for from the start):
    /// one precopy round from a snapshot, then the cutover's copy of what changed.
    pub warm: bool,
}

/// The plan workload's VMs: both on host DC0_H0, so the one that comes second waits for a host slot.
pub const PLAN_VMS: [&str; 2] = ["DC0_H0_VM0", "DC0_H0_VM1"];

/// The Provider's `maxConcurrentDisksPerHost` in the plan workload.
pub const PLAN_HOST_LIMIT: i32 = 1;

/// The Secret name a bad spec names first.
pub const MISSPELLED_SECRET: &str = "staging-credentails";

impl Workload {
    /// `happy-1`, `happy-3`, `staged-3` (happy-3 through staging), `warm` (happy-1, warm), `cancel[@Checkpoint]` (default Importing), `delete[@Checkpoint]` (default
    /// CreatingVM), `bad-spec`, or `linux` (the Debian BIOS VM, whose guest agent must answer: a 1 GiB disk and a
    /// real boot per trial, so minutes each), or `plan` (a MigrationPlan of [`PLAN_VMS`], one disk at a time per host).
    pub fn parse(name: &str) -> Result<Self> {
        let (base, at) = match name.split_once('@') {
            Some((base, at)) => (base, Some(at)),
            None => (name, None),
        };
        let held = |default: &str| -> Result<String> {
            let phase = at.unwrap_or(default);
            let parsed: Phase = serde_json::from_value(serde_json::json!(phase))
                .with_context(|| format!("{phase} is not a checkpoint"))?;
            anyhow::ensure!(
                CHECKPOINTS.iter().any(|c| c.phase == parsed),
                "{phase}: a migration can hold before Discovering .. ValidatingGuest"
            );
            Ok(phase.to_string())
        };
        let workload = |vm, act, bad_spec| Workload {
            name: name.to_string(),
            vm,
            act,
            bad_spec,
            staged: false,
            plan: None,
            warm: false,
        };
        Ok(match base {
            "happy-1" if at.is_none() => workload("DC0_H0_VM0", None, false),
            "happy-3" if at.is_none() => workload("DC0_H0_VM1", None, false),
            "staged-3" if at.is_none() => workload("DC0_H0_VM1", None, false).staged(),
            "linux" if at.is_none() => {
                workload(ferry_lab::vsphere::linux_vms::LINUX_BIOS_VM, None, false)
            }
            "bad-spec" if at.is_none() => workload("DC0_C0_RP0_VM0", None, false).with_bad_spec(),
            "warm" if at.is_none() => Workload {
                warm: true,
                ..workload("DC0_H0_VM0", None, false)
            },
            "plan" if at.is_none() => Workload {
                plan: Some(&PLAN_VMS),
                ..workload(PLAN_VMS[0], None, false)
            },
            "cancel" => workload(
                "DC0_C0_RP0_VM0",
                Some((Act::Cancel, held("Importing")?)),
                false,
            ),
            "delete" => workload(
                "DC0_C0_RP0_VM1",
                Some((Act::Delete, held("CreatingVM")?)),
                false,
            ),
            _ => anyhow::bail!(
                "unknown workload {name}: one of {WORKLOADS:?} or {REAL_GUEST_WORKLOADS:?} (cancel and delete take @Checkpoint), or all"
            ),
        })
    }

    fn staged(mut self) -> Self {
        self.staged = true;
        self
    }

    /// The misspelled Secret is the staging store's, so the bad spec is a staged migration's.
    fn with_bad_spec(mut self) -> Self {
        self.bad_spec = true;
        self.staged = true;
        self
    }

    /// The source VMs the run migrates.
    pub fn vms(&self) -> Vec<&'static str> {
        self.plan.map_or_else(|| vec![self.vm], <[_]>::to_vec)
    }

    /// A namespace-safe form of the name.
    pub fn slug(&self) -> String {
        self.name
            .to_ascii_lowercase()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_with_their_checkpoint() {
        let cancel = Workload::parse("cancel").unwrap();
        assert_eq!(cancel.act, Some((Act::Cancel, "Importing".into())));
        let early = Workload::parse("delete@Converting").unwrap();
        assert_eq!(early.act, Some((Act::Delete, "Converting".into())));
        assert_eq!(early.slug(), "deleteconverting");
        assert!(Workload::parse("bad-spec").unwrap().bad_spec);
        assert!(Workload::parse("cancel@Discovering").is_ok());
        assert!(
            Workload::parse("cancel@Succeeded").is_err(),
            "a finished migration holds nowhere"
        );
        assert!(Workload::parse("cancel@Sometime").is_err());
        assert!(Workload::parse("happy-1@Importing").is_err());
        assert!(Workload::parse("happy-2").is_err());
        assert_eq!(Workload::parse("linux").unwrap().vm, "ferry-linux-bios");
        assert_eq!(Workload::parse("plan").unwrap().plan, Some(&PLAN_VMS[..]));
        assert!(Workload::parse("plan@Converting").is_err());
        assert!(Workload::parse("warm").unwrap().warm);
    }
}
