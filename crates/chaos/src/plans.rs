//! The perturbations, and the trials each makes of a workload's fault-free run. Pure.

use ferry_controller::chaos::{Fault, FaultPlan};
use serde::{Deserialize, Serialize};

/// Where a perturbation strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strikes {
    /// At each Kubernetes write of the controller, with this fault.
    Write(Fault),
    /// At each vSphere call of the controller, with this fault.
    VsphereCall(Fault),
    /// The pod of each Job the workload runs, SIGKILLed midway.
    JobPod,
    /// The importer of each DataVolume, killed midway (CDI starts it again).
    Importer,
}

pub struct Perturbation {
    pub name: &'static str,
    pub strikes: Strikes,
}

pub const PERTURBATIONS: [Perturbation; 12] = [
    p("P1 crash-after-write", Strikes::Write(Fault::CrashAfter)),
    p("P2 crash-before-write", Strikes::Write(Fault::CrashBefore)),
    p("P3 fail-write-500", Strikes::Write(Fault::ServerError)),
    p("P4 fail-write-409", Strikes::Write(Fault::Conflict)),
    p(
        "P5 fail-write-already-exists",
        Strikes::Write(Fault::AlreadyExists),
    ),
    p("P6 fail-write-timeout", Strikes::Write(Fault::Timeout)),
    p("P7 pause-after-write", Strikes::Write(Fault::PauseAfter)),
    p(
        "P8 stale-reads-after-write",
        Strikes::Write(Fault::StaleReads),
    ),
    p(
        "P9 fail-vsphere-call",
        Strikes::VsphereCall(Fault::VsphereUnreachable),
    ),
    p("P10 kill-job-pod", Strikes::JobPod),
    p("P11 kill-importer", Strikes::Importer),
    p(
        "P12 vsphere-permanent-error",
        Strikes::VsphereCall(Fault::VsphereNotFound),
    ),
];

const fn p(name: &'static str, strikes: Strikes) -> Perturbation {
    Perturbation { name, strikes }
}

/// A fault the lab's stand-ins inject (the `lab-faults` ConfigMap): `key` once, on the object `selector` picks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabFault {
    pub key: String,
    pub selector: String,
}

/// One perturbed run of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trial {
    pub perturbation: String,
    /// What it hits, for the report: `write 7`, `vsphere call 3`, `pod of m-convert-1`.
    pub target: String,
    #[serde(default)]
    pub plan: Option<FaultPlan>,
    #[serde(default)]
    pub lab_fault: Option<LabFault>,
}

impl Trial {
    /// What the run must end like, compared with the fault-free one.
    pub fn expect(&self) -> Expect {
        match (&self.plan, &self.lab_fault) {
            (_, Some(f)) if f.key == "kill-pods" => Expect::OneJobRetried,
            (Some(plan), _) if plan.fault == Fault::VsphereNotFound => Expect::SameOrFailedClean,
            _ => Expect::Same,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The same end, objects, creates and deletes as the fault-free run.
    Same,
    /// The same, but one more Job created and deleted, and one retry spent: a killed pod is a failed Job.
    OneJobRetried,
    /// The same, or Failed with a specific permanent reason and everything cleaned up.
    SameOrFailedClean,
}

/// What the fault-free run showed, to aim the trials at.
pub struct Targets {
    pub writes: usize,
    pub vsphere_calls: usize,
    pub jobs: Vec<String>,
    pub data_volumes: Vec<String>,
}

/// Every trial of the wanted perturbations (`P3`, a name, or `all`).
pub fn trials(wanted: &[String], targets: &Targets) -> Vec<Trial> {
    let wanted = |name: &str| {
        wanted.iter().any(|w| {
            w == "all" || name.split(' ').next() == Some(w.as_str()) || name.ends_with(w.as_str())
        })
    };
    let mut all = vec![];
    for perturbation in PERTURBATIONS.iter().filter(|p| wanted(p.name)) {
        let trial = |target: String, plan: Option<FaultPlan>, lab_fault: Option<LabFault>| Trial {
            perturbation: perturbation.name.into(),
            target,
            plan,
            lab_fault,
        };
        match perturbation.strikes {
            Strikes::Write(fault) => all.extend(
                (1..=targets.writes as u32)
                    .map(|at| trial(format!("write {at}"), Some(FaultPlan { fault, at }), None)),
            ),
            Strikes::VsphereCall(fault) => {
                all.extend((1..=targets.vsphere_calls as u32).map(|at| {
                    trial(
                        format!("vsphere call {at}"),
                        Some(FaultPlan { fault, at }),
                        None,
                    )
                }))
            }
            Strikes::JobPod => all.extend(targets.jobs.iter().map(|job| {
                let fault = LabFault {
                    key: "kill-pods".into(),
                    selector: format!("job-name={job}"),
                };
                trial(format!("pod of {job}"), None, Some(fault))
            })),
            Strikes::Importer => all.extend(targets.data_volumes.iter().map(|dv| {
                let fault = LabFault {
                    key: "kill-imports".into(),
                    selector: format!("name={dv}"),
                };
                trial(format!("importer of {dv}"), None, Some(fault))
            })),
        }
    }
    all
}

/// `n` trials drawn with `seed` (a fixed LCG, so a seed names the same sample everywhere).
pub fn sample(mut all: Vec<Trial>, n: usize, mut seed: u64) -> Vec<Trial> {
    let mut picked = vec![];
    while picked.len() < n && !all.is_empty() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        picked.push(all.remove((seed >> 33) as usize % all.len()));
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_perturbation_aims_at_its_own_targets() {
        let targets = Targets {
            writes: 3,
            vsphere_calls: 2,
            jobs: vec!["m-convert-1".into(), "m-verify-0-1".into()],
            data_volumes: vec!["m-disk-0".into()],
        };
        let all = trials(&["all".into()], &targets);
        assert_eq!(all.len(), 8 * 3 + 2 * 2 + 2 + 1);
        let p1 = trials(&["P1".into()], &targets);
        assert_eq!(p1.len(), 3);
        assert_eq!(
            p1[2].plan,
            Some(FaultPlan {
                fault: Fault::CrashAfter,
                at: 3
            })
        );
        let kills = trials(&["kill-job-pod".into()], &targets);
        assert_eq!(kills[1].target, "pod of m-verify-0-1");
        assert_eq!(kills[1].expect(), Expect::OneJobRetried);
        assert_eq!(
            trials(&["P12".into()], &targets)[0].expect(),
            Expect::SameOrFailedClean
        );
        assert!(
            trials(&["P1".into()], &targets)
                .iter()
                .all(|t| t.expect() == Expect::Same)
        );
        let picked = sample(all.clone(), 5, 7);
        assert_eq!(picked, sample(all, 5, 7));
        assert_eq!(picked.len(), 5);
    }
}
