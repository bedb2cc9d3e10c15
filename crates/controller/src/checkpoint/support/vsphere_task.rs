//! A vSphere task whose moref is on record, looked at once a pass: a restarted controller follows it instead of
//! asking vSphere again.

use std::time::Duration;

use ferry_vsphere::power::{self, TaskState};
use ferry_vsphere::{MoRef, Session};

use crate::checkpoint::step::Next;
use crate::error::Result;

const POLL: Duration = Duration::from_secs(2);
/// How long a task run to its end within one pass may take (a snapshot's removal, a change-tracking switch).
pub const TASK_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the recorded task stands. Once it ended, either way, its record goes.
pub enum Followed {
    /// The pass waits with this, and looks again.
    Running(Next),
    /// Done, with the object it made (a snapshot, say).
    Succeeded(Option<MoRef>),
    /// Its fault, as [`ferry_vsphere::Error::TaskFailed`]: the pass fails with it unless the caller expects it.
    Failed(ferry_vsphere::Error),
}

/// Looks at task `task`; while it runs, waits with `reason` and `running(percent done)`.
pub async fn follow(
    session: &Session,
    task: &str,
    reason: &'static str,
    running: impl FnOnce(i32) -> String,
) -> Result<Followed> {
    Ok(
        match power::task_state(session, &MoRef::new("Task", task)).await? {
            TaskState::Running { progress } => {
                Followed::Running(Next::wait(reason, running(progress.unwrap_or(0)), POLL))
            }
            TaskState::Succeeded { result } => Followed::Succeeded(result),
            TaskState::Failed { fault, message } => {
                Followed::Failed(ferry_vsphere::Error::TaskFailed {
                    task: task.to_string(),
                    fault,
                    message,
                })
            }
        },
    )
}
