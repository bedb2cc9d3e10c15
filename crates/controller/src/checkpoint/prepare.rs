//! Preparing. Desired: the source powered off per `powerOff.mode`. Observed: its power state and the power task
//! in flight. Action: first the source VM to itself ([`super::support::one_per_vm`]), a disk slot on the source's host
//! ([`crate::slots`]) and the VM shown to be the one discovered ([`super::support::source::checked_power_view`]), then record the original power
//! state (each a status write of its own), then ask the guest to shut down or power off, keeping the task's moref in status so a restarted controller follows it instead of
//! repeating it. Recorded: the power state before and after.

use std::time::Duration;

use ferry_api::{PowerOffMode, PowerState, PowerStatus, Reason};
use ferry_vsphere::power;

use super::step::{Next, Step};
use super::support::vsphere_task::{self, Followed};
use crate::error::{Failure, Result};

const POLL: Duration = Duration::from_secs(2);

/// What to do about power, from what was observed. Pure.
#[derive(Debug, PartialEq)]
pub enum PowerStep {
    RecordOriginal(PowerState),
    Done,
    FollowTask(String),
    RequestShutdown,
    WaitForShutdown,
    PowerOff,
    RefuseRunning,
}

pub fn decide(
    mode: PowerOffMode,
    recorded: &PowerStatus,
    observed: PowerState,
    tools_running: bool,
    shutdown_overdue: bool,
) -> PowerStep {
    if recorded.original.is_none() {
        return PowerStep::RecordOriginal(observed);
    }
    if observed == PowerState::PoweredOff {
        return PowerStep::Done;
    }
    if let Some(task) = &recorded.task {
        return PowerStep::FollowTask(task.clone());
    }
    match mode {
        PowerOffMode::RequireOff => PowerStep::RefuseRunning,
        PowerOffMode::Force => PowerStep::PowerOff,
        PowerOffMode::Graceful => match (&recorded.shutdown_requested, shutdown_overdue) {
            (Some(_), false) => PowerStep::WaitForShutdown,
            (Some(_), true) => PowerStep::PowerOff,
            // Without VMware Tools (or when suspended) the guest cannot be asked.
            (None, _) if observed != PowerState::PoweredOn || !tools_running => PowerStep::PowerOff,
            (None, _) => PowerStep::RequestShutdown,
        },
    }
}

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let provider = super::support::source::provider(step.ctx, step.vmm).await?;
    if let Some(wait) = super::support::one_per_vm::wait_for_another(
        step,
        &super::support::source::recorded(step.status)?,
    ) {
        return Ok(wait);
    }
    if let Some(next) = super::support::host_slot::acquire(step, &provider).await {
        return Ok(next);
    }
    let session = super::support::source::session_for(step.ctx, &provider).await?;
    let (vm, view) = super::support::source::checked_power_view(&session, step.status).await?;
    let observed = view.state;
    let spec = &step.vmm.spec.source.power_off;
    let mut recorded = step.status.power.clone().unwrap_or_default();
    let overdue = recorded.shutdown_requested.as_ref().is_some_and(|t| {
        step.now.0.duration_since(t.0).as_secs() >= i64::from(spec.timeout_seconds)
    });
    let tools = observed == PowerState::PoweredOn
        && recorded.original.is_some()
        && spec.mode == PowerOffMode::Graceful
        && recorded.shutdown_requested.is_none()
        && view.tools_running;
    recorded.current = Some(observed);
    let next = match decide(spec.mode, &recorded, observed, tools, overdue) {
        PowerStep::RecordOriginal(state) => {
            recorded.original = Some(state);
            Next::persist("PowerStateRecorded", format!("the source was {state:?}"))
        }
        PowerStep::Done => {
            recorded.task = None;
            Next::advance("SourcePoweredOff", "the source is powered off")
        }
        PowerStep::FollowTask(task) => {
            let running = |progress| format!("power-off task {task} running ({progress}%)");
            match vsphere_task::follow(&session, &task, "PoweringOff", running).await? {
                Followed::Running(wait) => wait,
                // The task's success is the evidence: the source is off now.
                Followed::Succeeded(_) => {
                    recorded.task = None;
                    recorded.current = Some(PowerState::PoweredOff);
                    Next::advance(
                        "SourcePoweredOff",
                        format!("power-off task {task} finished: the source is powered off"),
                    )
                }
                Followed::Failed(ferry_vsphere::Error::TaskFailed { fault, message, .. })
                    if fault == "InvalidPowerState" =>
                {
                    recorded.task = None;
                    Next::persist("PoweringOff", message)
                }
                Followed::Failed(error) => {
                    recorded.task = None;
                    step.status.power = Some(recorded);
                    return Err(Failure::from(error));
                }
            }
        }
        PowerStep::RequestShutdown => {
            power::request_guest_shutdown(&session, &vm).await?;
            recorded.shutdown_requested = Some(step.now.clone());
            Next::wait(
                "GuestShuttingDown",
                format!(
                    "asked the guest to shut down; powering off after {}s",
                    spec.timeout_seconds
                ),
                POLL,
            )
        }
        PowerStep::WaitForShutdown => Next::wait(
            "GuestShuttingDown",
            "waiting for the guest to shut down",
            POLL,
        ),
        PowerStep::PowerOff => {
            recorded.task = power::start_power_off(&session, &vm)
                .await?
                .map(|t| t.value);
            Next::wait(
                "PoweringOff",
                "powering the source off",
                Duration::from_millis(500),
            )
        }
        PowerStep::RefuseRunning => {
            return Err(Failure::fixable(
                Reason::SourcePoweredOn,
                "powerOff.mode is RequireOff and the source VM is running; shut it down, and the migration resumes",
            ));
        }
    };
    step.status.power = Some(recorded);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn recorded(original: Option<PowerState>) -> PowerStatus {
        PowerStatus {
            original,
            ..Default::default()
        }
    }

    #[test]
    fn the_original_state_is_recorded_before_anything_changes() {
        for mode in [
            PowerOffMode::Graceful,
            PowerOffMode::Force,
            PowerOffMode::RequireOff,
        ] {
            assert_eq!(
                decide(mode, &recorded(None), PowerState::PoweredOn, true, false),
                PowerStep::RecordOriginal(PowerState::PoweredOn)
            );
        }
    }

    #[test]
    fn each_mode_powers_off_its_way() {
        let on = Some(PowerState::PoweredOn);
        assert_eq!(
            decide(
                PowerOffMode::Force,
                &recorded(on),
                PowerState::PoweredOn,
                true,
                false
            ),
            PowerStep::PowerOff
        );
        assert_eq!(
            decide(
                PowerOffMode::RequireOff,
                &recorded(on),
                PowerState::PoweredOn,
                true,
                false
            ),
            PowerStep::RefuseRunning
        );
        assert_eq!(
            decide(
                PowerOffMode::Graceful,
                &recorded(on),
                PowerState::PoweredOn,
                true,
                false
            ),
            PowerStep::RequestShutdown
        );
        assert_eq!(
            decide(
                PowerOffMode::Graceful,
                &recorded(on),
                PowerState::PoweredOn,
                false,
                false
            ),
            PowerStep::PowerOff
        );
        let mut asked = recorded(on);
        asked.shutdown_requested = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(
            decide(
                PowerOffMode::Graceful,
                &asked,
                PowerState::PoweredOn,
                false,
                false
            ),
            PowerStep::WaitForShutdown
        );
        assert_eq!(
            decide(
                PowerOffMode::Graceful,
                &asked,
                PowerState::PoweredOn,
                false,
                true
            ),
            PowerStep::PowerOff
        );
        assert_eq!(
            decide(
                PowerOffMode::Force,
                &recorded(on),
                PowerState::PoweredOff,
                true,
                false
            ),
            PowerStep::Done
        );
    }

    #[test]
    fn a_recorded_task_is_followed_not_repeated() {
        let mut with_task = recorded(Some(PowerState::PoweredOn));
        with_task.task = Some("task-7".into());
        assert_eq!(
            decide(
                PowerOffMode::Force,
                &with_task,
                PowerState::PoweredOn,
                true,
                false
            ),
            PowerStep::FollowTask("task-7".into())
        );
    }
}
