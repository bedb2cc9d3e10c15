//! The status real CDI v1.65.0 gives a DataVolume at each point of its walk, as the conformance test recorded it
//! (`crates/cli/tests/cdi_conformance`): phase, progress, the importer's restarts, and the Bound, Ready and
//! Running conditions with CDI's reasons and messages (often none).

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::json;

/// One condition: status, reason, message.
#[derive(Debug, PartialEq)]
struct Condition(bool, &'static str, String);

impl Condition {
    fn unset(status: bool) -> Self {
        Condition(status, "", String::new())
    }
}

#[derive(Debug, PartialEq)]
pub(super) struct Report {
    /// None while CDI cannot even render the claim.
    phase: Option<&'static str>,
    progress: String,
    /// The importer's restarts; None keeps what the status says.
    restarts: Option<i64>,
    bound: Condition,
    ready: Condition,
    running: Condition,
}

impl Report {
    fn waiting(phase: &'static str, claim: &str) -> Self {
        Report {
            phase: Some(phase),
            progress: "N/A".into(),
            restarts: None,
            bound: Condition(false, "Pending", format!("PVC {claim} Pending")),
            ready: Condition::unset(false),
            running: Condition::unset(false),
        }
    }

    fn bound(phase: &'static str, claim: &str) -> Self {
        Report {
            bound: Condition(true, "Bound", format!("PVC {claim} Bound")),
            ..Self::waiting(phase, claim)
        }
    }

    /// `spec.storage` CDI cannot complete from the class's StorageProfile (no access modes for an unknown
    /// provisioner): no phase, and no claim.
    pub fn claim_not_valid(message: String) -> Self {
        Report {
            phase: None,
            progress: String::new(),
            restarts: None,
            bound: Condition(false, "ErrClaimNotValid", message.clone()),
            ready: Condition(false, "ErrClaimNotValid", message),
            running: Condition::unset(false),
        }
    }

    pub fn pending(claim: &str) -> Self {
        Self::waiting("Pending", claim)
    }

    /// The claim waits for a first consumer CDI does not provide (its legacy path).
    pub fn waiting_for_first_consumer(claim: &str) -> Self {
        Self::waiting("WaitForFirstConsumer", claim)
    }

    /// The claim waits for a first consumer, and CDI's populators fill it once one is scheduled.
    pub fn pending_population(claim: &str) -> Self {
        Self::waiting("PendingPopulation", claim)
    }

    /// Bound, and a pod that has not ended uses it: the importer waits.
    pub fn pvc_bound(claim: &str) -> Self {
        Self::bound("PVCBound", claim)
    }

    pub fn import_scheduled(claim: &str) -> Self {
        Self::bound("ImportScheduled", claim)
    }

    pub fn import_in_progress(claim: &str, progress: impl Into<String>) -> Self {
        Report {
            progress: progress.into(),
            ready: Condition(false, "TransferRunning", String::new()),
            running: Condition(true, "Pod is running", String::new()),
            ..Self::bound("ImportInProgress", claim)
        }
    }

    /// The importer ended in error and is restarted, as often as it takes: CDI never fails the DataVolume.
    pub fn importer_failed(claim: &str, restarts: i64, message: String) -> Self {
        Report {
            restarts: Some(restarts),
            running: Condition(false, "Error", message),
            ..Self::bound("ImportInProgress", claim)
        }
    }

    pub fn succeeded(claim: &str) -> Self {
        Report {
            progress: "100.0%".into(),
            ready: Condition::unset(true),
            running: Condition(false, "Completed", "Import Complete".into()),
            ..Self::bound("Succeeded", claim)
        }
    }

    /// Succeeded without importing: a blank Block volume, left as the storage gave it.
    pub fn left_as_is(claim: &str) -> Self {
        Report {
            running: Condition(false, "Completed", String::new()),
            ..Self::succeeded(claim)
        }
    }

    /// The lab's fault switch failed the import: a phase real CDI does not reach this way, kept for the chaos
    /// suite's `fail imports`.
    pub fn fault_injected(claim: &str) -> Self {
        let message = "the lab's fault switch failed this import".to_string();
        Report {
            ready: Condition(false, "LabFaultInjected", message.clone()),
            running: Condition(false, "LabFaultInjected", message),
            ..Self::bound("Failed", claim)
        }
    }

    /// The importer's restarts this report sets, or those `dv` has.
    pub fn restarts(&self, dv: &DynamicObject) -> i64 {
        self.restarts
            .unwrap_or_else(|| dv.data["status"]["restartCount"].as_i64().unwrap_or(0))
    }

    /// Whether `dv`'s status already says this (timestamps aside).
    pub fn is_current(&self, dv: &DynamicObject) -> bool {
        let status = &dv.data["status"];
        let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        let said =
            |c: &serde_json::Value| json!([c["type"], c["status"], c["reason"], c["message"]]);
        let fresh = self.status(dv);
        status["phase"] == fresh["phase"]
            && status["progress"] == fresh["progress"]
            && status["restartCount"] == fresh["restartCount"]
            && conditions.iter().map(said).eq(fresh["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(said))
    }

    /// The status to write on `dv`.
    pub fn status(&self, dv: &DynamicObject) -> serde_json::Value {
        let now = Timestamp::now().to_string();
        let condition = |kind: &str, c: &Condition| {
            let mut value = json!({"type": kind, "status": if c.0 { "True" } else { "False" },
                                   "lastTransitionTime": now, "lastHeartbeatTime": now});
            // CDI leaves out a reason or message it has not got.
            if !c.1.is_empty() {
                value["reason"] = json!(c.1);
            }
            if !c.2.is_empty() {
                value["message"] = json!(c.2);
            }
            value
        };
        let mut status = json!({
            "restartCount": self.restarts(dv),
            "conditions": [condition("Bound", &self.bound), condition("Ready", &self.ready),
                           condition("Running", &self.running)],
        });
        if let Some(phase) = self.phase {
            status["phase"] = json!(phase);
            status["progress"] = json!(self.progress);
            status["claimName"] = json!(dv.metadata.name);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_already_said_is_not_said_again_and_a_restart_is_news() {
        let dv: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume", "metadata": {"name": "d"}}))
            .unwrap();
        let report = Report::importer_failed("d", 1, "refused".into());
        let mut written = dv.clone();
        written.data["status"] = report.status(&dv);
        assert!(report.is_current(&written));
        assert!(!Report::importer_failed("d", 2, "refused".into()).is_current(&written));
        assert!(!Report::succeeded("d").is_current(&written));
        // The real status of a succeeded import: Ready without reason or message.
        let done = Report::succeeded("d").status(&dv);
        assert_eq!(
            done["conditions"][1],
            json!({"type": "Ready", "status": "True",
            "lastTransitionTime": done["conditions"][1]["lastTransitionTime"],
            "lastHeartbeatTime": done["conditions"][1]["lastHeartbeatTime"]})
        );
        assert!(
            Report::claim_not_valid("no".into())
                .status(&dv)
                .get("phase")
                .is_none()
        );
    }
}
