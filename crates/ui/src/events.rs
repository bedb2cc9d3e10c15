//! Events about Ferry's objects, newest first.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;

use crate::route;

#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    pub at: Option<Timestamp>,
    /// `Normal` or `Warning`.
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub count: i32,
    /// The object's page, for migrations and plans.
    pub link: Option<String>,
}

/// When it last happened, as the API records it (events.k8s.io's eventTime, or core's timestamps).
pub fn time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.first_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The events `about` selects (all when none), newest first, at most `limit`.
pub fn rows(events: &[Arc<Event>], about: Option<&str>, limit: usize) -> Vec<EventRow> {
    let mut chosen: Vec<&Event> = events
        .iter()
        .map(AsRef::as_ref)
        .filter(|e| about.is_none_or(|uid| e.involved_object.uid.as_deref() == Some(uid)))
        .collect();
    chosen.sort_by_key(|e| std::cmp::Reverse(time(e)));
    chosen.into_iter().take(limit).map(row).collect()
}

fn row(e: &Event) -> EventRow {
    let object = &e.involved_object;
    let kind = object.kind.clone().unwrap_or_default();
    let namespace = object
        .namespace
        .clone()
        .or(e.metadata.namespace.clone())
        .unwrap_or_default();
    let name = object.name.clone().unwrap_or_default();
    let link = match kind.as_str() {
        "VirtualMachineMigration" => Some(route::migration_path(&namespace, &name)),
        "MigrationPlan" => Some(route::plan_path(&namespace, &name)),
        _ => None,
    };
    EventRow {
        at: time(e),
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
        kind,
        namespace,
        name,
        count: e
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(e.count)
            .unwrap_or(1),
        link,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn event(uid: &str, kind: &str, reason: &str, message: &str, at: &str) -> Arc<Event> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("e-{reason}-{at}"), "namespace": "apps"},
                "involvedObject": {"kind": kind, "name": "web", "namespace": "apps", "uid": uid,
                                   "apiVersion": "migration.platform.example/v1alpha1"},
                "reason": reason, "message": message, "type": "Normal", "lastTimestamp": at}))
            .unwrap(),
        )
    }

    #[test]
    fn events_are_newest_first_and_link_to_their_objects() {
        let events = [
            event(
                "u1",
                "VirtualMachineMigration",
                "Validated",
                "ok",
                "2026-12-01T10:00:01Z",
            ),
            event(
                "u1",
                "VirtualMachineMigration",
                "DisksWritten",
                "ok",
                "2026-12-01T10:00:09Z",
            ),
            event(
                "u2",
                "MigrationPlan",
                "Started",
                "ok",
                "2026-12-01T10:00:05Z",
            ),
            event("u3", "Provider", "Connected", "ok", "2026-12-01T10:00:00Z"),
        ];
        let all = rows(&events, None, 10);
        let reasons: Vec<_> = all.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            ["DisksWritten", "Started", "Validated", "Connected"]
        );
        assert_eq!(all[0].link.as_deref(), Some("/migrations/apps/web"));
        assert_eq!(all[1].link.as_deref(), Some("/plans/apps/web"));
        assert_eq!(all[3].link, None);
        assert_eq!(rows(&events, Some("u1"), 10).len(), 2);
        assert_eq!(rows(&events, None, 1).len(), 1);
    }
}
