//! Conditions as the Kubernetes API conventions define them: `lastTransitionTime` moves only when `status` does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The desired state of one condition. `now` is passed in so that the computation stays pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate<'a> {
    pub type_: &'a str,
    pub status: bool,
    pub reason: &'a str,
    pub message: String,
    pub observed_generation: Option<i64>,
}

impl ConditionUpdate<'_> {
    fn status_str(&self) -> &'static str {
        if self.status { "True" } else { "False" }
    }
}

/// Sets `update` in `conditions`, keeping the order of the others. Returns true when anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    update: ConditionUpdate<'_>,
    now: &Time,
) -> bool {
    let status = update.status_str();
    match conditions.iter_mut().find(|c| c.type_ == update.type_) {
        Some(existing) => {
            let transition = existing.status != status;
            let next = Condition {
                type_: existing.type_.clone(),
                status: status.to_string(),
                reason: update.reason.to_string(),
                message: update.message,
                observed_generation: update.observed_generation,
                last_transition_time: if transition {
                    now.clone()
                } else {
                    existing.last_transition_time.clone()
                },
            };
            let changed = *existing != next;
            *existing = next;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: update.type_.to_string(),
                status: status.to_string(),
                reason: update.reason.to_string(),
                message: update.message,
                observed_generation: update.observed_generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of `type_` is present with status "True".
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn ready(status: bool, reason: &str, generation: i64) -> ConditionUpdate<'_> {
        ConditionUpdate {
            type_: "Ready",
            status,
            reason,
            message: format!("{reason} message"),
            observed_generation: Some(generation),
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut conditions = vec![];
        assert!(set_condition(
            &mut conditions,
            ready(false, "Pending", 1),
            &at(10)
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));

        // Same status, new reason and generation: recorded, but the transition time stays.
        assert!(set_condition(
            &mut conditions,
            ready(false, "StillPending", 2),
            &at(20)
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].reason, "StillPending");
        assert_eq!(conditions[0].observed_generation, Some(2));

        assert!(set_condition(
            &mut conditions,
            ready(true, "Available", 2),
            &at(30)
        ));
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert!(is_true(&conditions, "Ready"));
    }

    #[test]
    fn setting_the_same_condition_again_changes_nothing() {
        let mut conditions = vec![];
        set_condition(&mut conditions, ready(true, "Available", 3), &at(10));
        let before = conditions.clone();
        assert!(!set_condition(
            &mut conditions,
            ready(true, "Available", 3),
            &at(99)
        ));
        assert_eq!(conditions, before);
    }

    #[test]
    fn other_conditions_keep_their_place() {
        let mut conditions = vec![];
        set_condition(
            &mut conditions,
            ConditionUpdate {
                type_: "A",
                ..ready(true, "X", 1)
            },
            &at(1),
        );
        set_condition(
            &mut conditions,
            ConditionUpdate {
                type_: "B",
                ..ready(true, "X", 1)
            },
            &at(1),
        );
        set_condition(
            &mut conditions,
            ConditionUpdate {
                type_: "A",
                ..ready(false, "Y", 1)
            },
            &at(2),
        );
        let types: Vec<_> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["A", "B"]);
        assert!(find(&conditions, "C").is_none());
    }
}
