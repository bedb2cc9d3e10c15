//! The checkpoints, in the order of [`CHECKPOINTS`]. A migration with `spec.staging` takes the staged rows, one
//! without it the direct rows, and one with `guestAdaptation: VirtV2v` the adapting row too ([`Route`], [`Runs`]);
//! the rest are the same for all. Each file reads as desired (what must be true to leave it),
//! observed (what is read fresh on every reconcile), action (the one idempotent step it may take) and recorded
//! (what it writes into the status working copy). The reconciler turns the returned [`Next`] into the phase move,
//! conditions, Events and the single status write.

pub(crate) mod adapt;
mod allocate;
mod convert;
mod direct_convert;
mod direct_import;
pub(crate) mod discover;
mod guest;
mod import;
mod precopy;
mod prepare;
mod start;
mod validate;
mod vm;
mod warm_cutover;

mod step;
/// What the checkpoints share (Jobs, DataVolumes, the source, lent credentials, cleanup); none is a checkpoint,
/// and no checkpoint uses another's code.
pub(crate) mod support;
pub(crate) use support::{jobs, source};

use std::time::Duration;

use ferry_api::{ConditionType, Phase};
use futures::future::BoxFuture;
pub use route::{Route, Runs};
pub use step::{Next, Step};
pub use support::cleanup::cleanup;

use crate::error::Result;
use crate::status::PhaseCondition;

/// One checkpoint: the phase a migration is in while it runs, the condition that turns True when it is left, and
/// its step. Adding a checkpoint is a file and a row of [`CHECKPOINTS`].
pub struct Checkpoint {
    pub phase: Phase,
    /// The migrations that run it.
    pub runs: Runs,
    pub condition: Option<ConditionType>,
    /// It reads the source's disks: the host slot granted before Preparing is freed when it is left.
    pub reads_source: bool,
    run: for<'a, 'b> fn(&'a mut Step<'b>) -> BoxFuture<'a, Result<Next>>,
}

/// The itinerary: every migration runs the rows of its route in this order, and is `Succeeded` after the last.
/// A phase that two routes share keeps one meaning: its condition is the same on both.
pub const CHECKPOINTS: [Checkpoint; 13] = [
    Checkpoint {
        phase: Phase::Discovering,
        runs: Runs::Always,
        condition: Some(ConditionType::SourceDiscovered),
        reads_source: false,
        run: |step| Box::pin(discover::run(step)),
    },
    Checkpoint {
        phase: Phase::Validating,
        runs: Runs::Always,
        condition: Some(ConditionType::Validated),
        reads_source: false,
        run: |step| Box::pin(validate::run(step)),
    },
    Checkpoint {
        phase: Phase::Allocating,
        runs: Runs::Direct,
        condition: None,
        reads_source: false,
        run: |step| Box::pin(allocate::run(step)),
    },
    Checkpoint {
        phase: Phase::Precopying,
        runs: Runs::Warm,
        condition: None,
        // Each round holds its slot only while it reads, and frees it itself.
        reads_source: false,
        run: |step| Box::pin(precopy::run(step)),
    },
    Checkpoint {
        phase: Phase::Preparing,
        runs: Runs::Always,
        condition: None,
        reads_source: false,
        run: |step| Box::pin(prepare::run(step)),
    },
    Checkpoint {
        phase: Phase::Converting,
        runs: Runs::Staged,
        condition: Some(ConditionType::DiskConverted),
        reads_source: true,
        run: |step| Box::pin(convert::run(step)),
    },
    Checkpoint {
        phase: Phase::Importing,
        runs: Runs::Staged,
        condition: Some(ConditionType::DiskImported),
        reads_source: false,
        run: |step| Box::pin(import::run(step)),
    },
    Checkpoint {
        phase: Phase::Converting,
        runs: Runs::Direct,
        condition: Some(ConditionType::DiskConverted),
        reads_source: true,
        run: |step| Box::pin(direct_convert::run(step)),
    },
    Checkpoint {
        phase: Phase::Importing,
        runs: Runs::Direct,
        condition: Some(ConditionType::DiskImported),
        reads_source: false,
        run: |step| Box::pin(direct_import::run(step)),
    },
    Checkpoint {
        phase: Phase::Adapting,
        runs: Runs::Adapted,
        condition: Some(ConditionType::GuestAdapted),
        reads_source: true,
        run: |step| Box::pin(adapt::run(step)),
    },
    Checkpoint {
        phase: Phase::CreatingVm,
        runs: Runs::Always,
        condition: Some(ConditionType::VmCreated),
        reads_source: false,
        run: |step| Box::pin(vm::run(step)),
    },
    Checkpoint {
        phase: Phase::Starting,
        runs: Runs::Always,
        condition: Some(ConditionType::VmStarted),
        reads_source: false,
        run: |step| Box::pin(start::run(step)),
    },
    Checkpoint {
        phase: Phase::ValidatingGuest,
        runs: Runs::Always,
        condition: Some(ConditionType::GuestReady),
        reads_source: false,
        run: |step| Box::pin(guest::run(step)),
    },
];

mod route {
    use ferry_api::{GuestAdaptation, VirtualMachineMigration};

    /// The rows of the itinerary a migration takes: its path, and whether its guest is adapted.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Route {
        /// `spec.staging`: the disks go through an object store, and CDI imports them; else blank
        /// DataVolumes, written by the conversion Job.
        pub staged: bool,
        /// `conversion.guestAdaptation: VirtV2v`.
        pub adapted: bool,
        /// `spec.warm`: precopy rounds while the source runs, before it is powered off (direct only).
        pub warm: bool,
    }

    /// Which migrations run a row.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Runs {
        Always,
        Staged,
        Direct,
        Adapted,
        Warm,
    }

    impl Route {
        pub const DIRECT: Route = Route {
            staged: false,
            adapted: false,
            warm: false,
        };
        pub const STAGED: Route = Route {
            staged: true,
            adapted: false,
            warm: false,
        };
        pub const WARM: Route = Route {
            staged: false,
            adapted: false,
            warm: true,
        };

        pub fn of(vmm: &VirtualMachineMigration) -> Self {
            Route {
                staged: crate::staging::staged(vmm),
                adapted: vmm.spec.conversion.guest_adaptation == GuestAdaptation::VirtV2v,
                warm: vmm.spec.warm.is_some() && !crate::staging::staged(vmm),
            }
        }

        pub fn adapted(self) -> Self {
            Route {
                adapted: true,
                ..self
            }
        }
    }

    impl Runs {
        /// Whether a row that runs so is run by a migration of `route`.
        pub fn on(self, route: Route) -> bool {
            match self {
                Runs::Always => true,
                Runs::Staged => route.staged,
                Runs::Direct => !route.staged,
                Runs::Adapted => route.adapted,
                Runs::Warm => route.warm,
            }
        }
    }
}

fn rows(route: Route) -> impl Iterator<Item = &'static Checkpoint> {
    CHECKPOINTS.iter().filter(move |c| c.runs.on(route))
}

/// The phases a migration of `route` runs, in order (without `Succeeded`).
pub fn itinerary(route: Route) -> Vec<Phase> {
    rows(route).map(|c| c.phase).collect()
}

/// The checkpoint a migration of `route` in `phase` runs; none for phases that are not checkpoints.
pub fn find(route: Route, phase: Phase) -> Option<&'static Checkpoint> {
    rows(route).find(|c| c.phase == phase)
}

/// The phase that follows checkpoint `phase` on `route`: its next row, or `Succeeded` after the last.
pub fn after(route: Route, phase: Phase) -> Phase {
    let mut rows = rows(route).skip_while(|c| c.phase != phase);
    rows.next();
    rows.next().map_or(Phase::Succeeded, |c| c.phase)
}

/// The phases of either route in order, then `Succeeded`: the only way a phase may move forward.
pub fn phases() -> impl Iterator<Item = Phase> {
    let mut seen = Vec::new();
    CHECKPOINTS
        .iter()
        .map(|c| c.phase)
        .filter(move |p| {
            let new = !seen.contains(p);
            seen.push(*p);
            new
        })
        .chain([Phase::Succeeded])
}

/// Whether leaving checkpoint `phase` frees the source host's disk slot.
pub fn frees_host_slot(phase: Phase) -> bool {
    CHECKPOINTS
        .iter()
        .any(|c| c.phase == phase && c.reads_source)
}

/// The condition checkpoint `phase` makes true when it is left (the same on every route).
pub fn condition_of(phase: Phase) -> Option<ConditionType> {
    CHECKPOINTS
        .iter()
        .find(|c| c.phase == phase)
        .and_then(|c| c.condition)
}

/// `phase` with the condition its checkpoint turns True when left.
pub fn with_condition(phase: Phase) -> PhaseCondition {
    PhaseCondition {
        phase,
        condition: condition_of(phase),
    }
}

/// Runs checkpoint `phase`'s step; a phase that is no checkpoint has nothing to do.
pub async fn run(phase: Phase, step: &mut Step<'_>) -> Result<Next> {
    match find(Route::of(step.vmm), phase) {
        Some(checkpoint) => (checkpoint.run)(step).await,
        None => Ok(Next::wait(
            "NothingToDo",
            format!("{phase:?} has no checkpoint"),
            Duration::from_secs(300),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_runs_its_rows_once_in_the_order_of_all_phases() {
        let all: Vec<Phase> = phases().collect();
        let routes = [Route::STAGED, Route::DIRECT, Route::WARM];
        for route in routes.into_iter().chain(routes.map(Route::adapted)) {
            let mut phase = CHECKPOINTS[0].phase;
            let mut walked = vec![phase];
            while phase != Phase::Succeeded {
                phase = after(route, phase);
                walked.push(phase);
            }
            let mut expected = itinerary(route);
            expected.push(Phase::Succeeded);
            assert_eq!(walked, expected, "{route:?}");
            let ranks: Vec<_> = walked
                .iter()
                .map(|p| all.iter().position(|a| a == p).unwrap())
                .collect();
            assert!(
                ranks.windows(2).all(|w| w[0] < w[1]),
                "{route:?}: {ranks:?}"
            );
        }
        assert_eq!(after(Route::DIRECT, Phase::Validating), Phase::Allocating);
        assert_eq!(after(Route::DIRECT, Phase::Allocating), Phase::Preparing);
        assert_eq!(after(Route::WARM, Phase::Allocating), Phase::Precopying);
        assert_eq!(after(Route::WARM, Phase::Precopying), Phase::Preparing);
        assert_eq!(after(Route::STAGED, Phase::Validating), Phase::Preparing);
        assert!(find(Route::STAGED, Phase::Allocating).is_none());
        assert_eq!(after(Route::DIRECT, Phase::Importing), Phase::CreatingVm);
        for route in routes.map(Route::adapted) {
            assert_eq!(after(route, Phase::Importing), Phase::Adapting);
            assert_eq!(after(route, Phase::Adapting), Phase::CreatingVm);
        }
        assert!(find(Route::STAGED, Phase::Adapting).is_none());
        assert_eq!(condition_of(Phase::Allocating), None);
        for phase in [Phase::Converting, Phase::Importing] {
            let conditions: Vec<_> = CHECKPOINTS
                .iter()
                .filter(|c| c.phase == phase)
                .map(|c| c.condition)
                .collect();
            assert_eq!(conditions.len(), 2);
            assert_eq!(conditions[0], conditions[1], "{phase:?} keeps one meaning");
        }
    }

    #[test]
    fn the_itinerary_runs_every_checkpoint_once_and_ends_in_succeeded() {
        let order: Vec<Phase> = phases().collect();
        assert_eq!(
            order,
            [
                Phase::Discovering,
                Phase::Validating,
                Phase::Allocating,
                Phase::Precopying,
                Phase::Preparing,
                Phase::Converting,
                Phase::Importing,
                Phase::Adapting,
                Phase::CreatingVm,
                Phase::Starting,
                Phase::ValidatingGuest,
                Phase::Succeeded,
            ]
        );
        assert_eq!(after(Route::STAGED, Phase::Preparing), Phase::Converting);
        assert_eq!(
            after(Route::DIRECT, Phase::ValidatingGuest),
            Phase::Succeeded
        );
        assert_eq!(condition_of(Phase::Preparing), None);
        assert_eq!(
            condition_of(Phase::Importing),
            Some(ConditionType::DiskImported)
        );
        assert!(find(Route::DIRECT, Phase::Cancelling).is_none());
    }
}
