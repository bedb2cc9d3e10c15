//! Observed state, computed purely: what the Greeting's status should say about its Deployment.

use ferry_kube::conditions::{ConditionUpdate, set_condition};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::crd::{Greeting, GreetingStatus};

pub const READY: &str = "Ready";

/// Why the Greeting is (not) ready, from the Deployment as observed.
fn readiness(
    greeting: &Greeting,
    deployment: Option<&Deployment>,
) -> (bool, &'static str, String, i32) {
    let name = greeting.metadata.name.as_deref().unwrap_or_default();
    let Some(deployment) = deployment else {
        return (
            false,
            "DeploymentMissing",
            format!("Deployment {name} does not exist yet"),
            0,
        );
    };
    let status = deployment.status.clone().unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    let wanted = greeting.spec.replicas;
    let generation = deployment.metadata.generation.unwrap_or(0);
    if status.observed_generation.unwrap_or(0) < generation {
        let message = format!(
            "the Deployment controller has not yet observed generation {generation} of Deployment {name}"
        );
        return (false, "DeploymentNotObserved", message, ready);
    }
    if ready < wanted {
        let message = format!("{ready} of {wanted} replicas ready; pods are not running yet");
        return (false, "ReplicasNotReady", message, ready);
    }
    (
        true,
        "DeploymentAvailable",
        format!("{ready} of {wanted} replicas ready"),
        ready,
    )
}

/// The status to record. Equal to the current one when nothing changed, so the caller can skip the write.
pub fn desired_status(
    greeting: &Greeting,
    deployment: Option<&Deployment>,
    now: &Time,
) -> GreetingStatus {
    let mut status = greeting.status.clone().unwrap_or_default();
    let (ready, reason, message, ready_replicas) = readiness(greeting, deployment);
    let generation = greeting.metadata.generation;
    set_condition(
        &mut status.conditions,
        ConditionUpdate {
            type_: READY,
            status: ready,
            reason,
            message,
            observed_generation: generation,
        },
        now,
    );
    status.observed_generation = generation;
    status.ready_replicas = ready_replicas;
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::GreetingSpec;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_000).unwrap())
    }

    fn hello(replicas: i32) -> Greeting {
        let mut g = Greeting::new(
            "hello",
            GreetingSpec {
                message: "hi".into(),
                replicas,
            },
        );
        g.metadata.generation = Some(3);
        g
    }

    fn deployment(generation: i64, observed: Option<i64>, ready: Option<i32>) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.generation = Some(generation);
        d.status = Some(DeploymentStatus {
            observed_generation: observed,
            ready_replicas: ready,
            ..Default::default()
        });
        d
    }

    fn ready_reason(status: &GreetingStatus) -> (&str, &str) {
        let c = &status.conditions[0];
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn each_unready_cause_has_its_own_reason() {
        let g = hello(2);
        assert_eq!(
            ready_reason(&desired_status(&g, None, &now())),
            ("False", "DeploymentMissing")
        );
        let unobserved = deployment(1, None, None);
        assert_eq!(
            ready_reason(&desired_status(&g, Some(&unobserved), &now())),
            ("False", "DeploymentNotObserved")
        );
        let starting = deployment(1, Some(1), Some(1));
        assert_eq!(
            ready_reason(&desired_status(&g, Some(&starting), &now())),
            ("False", "ReplicasNotReady")
        );
    }

    #[test]
    fn all_replicas_ready_is_ready_with_the_generation_observed() {
        let status = desired_status(&hello(2), Some(&deployment(1, Some(1), Some(2))), &now());
        assert_eq!(ready_reason(&status), ("True", "DeploymentAvailable"));
        assert_eq!(
            (status.ready_replicas, status.observed_generation),
            (2, Some(3))
        );
        assert_eq!(status.conditions[0].observed_generation, Some(3));
    }

    #[test]
    fn recomputing_a_recorded_status_changes_nothing() {
        let mut g = hello(2);
        let d = deployment(1, Some(1), Some(2));
        g.status = Some(desired_status(&g, Some(&d), &now()));
        let later = Time(Timestamp::from_second(2_000).unwrap());
        assert_eq!(Some(desired_status(&g, Some(&d), &later)), g.status);
    }
}
