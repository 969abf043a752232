//! Kubernetes-style conditions (`type`, `status`, `reason`, `message`), kept
//! as our own small type so the CRD schema stays under our control.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Progressing`, `Degraded` (networks); node states add their own.
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    /// One CamelCase word a machine can match on.
    pub reason: String,
    /// What a person needs to know, naming the objects involved.
    #[serde(default)]
    pub message: String,
    /// RFC 3339; kept from the previous condition when the status did not change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    pub fn new(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            type_: type_.to_string(),
            status: if status {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: reason.to_string(),
            message: message.into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Stamps `now` as the transition time on each new condition whose status
/// differs from the previous one of its type, and carries the old time over
/// otherwise (so `kubectl describe` shows when a state began, not when it
/// was last re-asserted).
pub fn stamp_transitions(previous: &[Condition], next: &mut [Condition], now: &str) {
    for c in next.iter_mut() {
        match find(previous, &c.type_) {
            Some(p) if p.status == c.status && p.last_transition_time.is_some() => {
                c.last_transition_time.clone_from(&p.last_transition_time);
            }
            _ => c.last_transition_time = Some(now.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_kept_while_status_holds_and_reset_on_change() {
        let mut prev = vec![Condition::new("Ready", true, "Configured", "")];
        prev[0].last_transition_time = Some("t0".into());
        let mut same = vec![Condition::new("Ready", true, "Configured", "x")];
        stamp_transitions(&prev, &mut same, "t1");
        assert_eq!(same[0].last_transition_time.as_deref(), Some("t0"));
        let mut flipped = vec![Condition::new("Ready", false, "Conflict", "")];
        stamp_transitions(&prev, &mut flipped, "t2");
        assert_eq!(flipped[0].last_transition_time.as_deref(), Some("t2"));
        let mut fresh = vec![Condition::new("Degraded", false, "None", "")];
        stamp_transitions(&prev, &mut fresh, "t3");
        assert_eq!(fresh[0].last_transition_time.as_deref(), Some("t3"));
    }
}
