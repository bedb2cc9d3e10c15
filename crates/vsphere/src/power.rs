//! Power and tasks: the only changes Ferry ever makes to a source VM. Asking for the state a VM is already in is
//! a success, and a task's moref can be followed again after a restart instead of repeating the call.

use std::time::{Duration, Instant};

use ferry_types::PowerState;

use crate::error::{Error, Result};
use crate::inventory::power_state;
use crate::props;
use crate::session::Session;
use crate::soap::{self, MoRef};

const POLL: Duration = Duration::from_millis(500);

/// Where a task stands.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskState {
    Running {
        progress: Option<i32>,
    },
    /// Done; the result, when the task returns an object (a snapshot, say).
    Succeeded {
        result: Option<MoRef>,
    },
    Failed {
        fault: String,
        message: String,
    },
}

pub async fn task_state(session: &Session, task: &MoRef) -> Result<TaskState> {
    let found = props::retrieve(session, "Task", std::slice::from_ref(task), &["info"]).await?;
    let info =
        found
            .first()
            .and_then(|o| o.prop("info"))
            .ok_or_else(|| Error::InvalidResponse {
                method: "RetrievePropertiesEx".into(),
                detail: format!("task {task} has no info"),
            })?;
    Ok(match info.text_at(&["state"]).unwrap_or_default() {
        "success" => TaskState::Succeeded {
            result: info.child("result").and_then(MoRef::from_element),
        },
        "error" => {
            let fault = info.child("error").map(soap::decode_method_fault);
            let (fault, message) = fault
                .map(|f| (f.type_, f.message))
                .unwrap_or_else(|| ("MethodFault".into(), String::new()));
            TaskState::Failed { fault, message }
        }
        _ => TaskState::Running {
            progress: info.text_at(&["progress"]).and_then(|p| p.parse().ok()),
        },
    })
}

/// Follows `task` until it ends, for at most `timeout`.
pub async fn wait_task(
    session: &Session,
    task: &MoRef,
    timeout: Duration,
) -> Result<Option<MoRef>> {
    let deadline = Instant::now() + timeout;
    loop {
        match task_state(session, task).await? {
            TaskState::Succeeded { result } => return Ok(result),
            TaskState::Failed { fault, message } => {
                return Err(Error::TaskFailed {
                    task: task.value.clone(),
                    fault,
                    message,
                });
            }
            TaskState::Running { .. } if Instant::now() > deadline => {
                return Err(Error::TaskTimeout {
                    task: task.value.clone(),
                    seconds: timeout.as_secs(),
                });
            }
            TaskState::Running { .. } => tokio::time::sleep(POLL).await,
        }
    }
}

pub async fn current_power_state(session: &Session, vm: &MoRef) -> Result<PowerState> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["runtime.powerState"],
    )
    .await?;
    found
        .first()
        .and_then(|o| o.text("runtime.powerState"))
        .and_then(power_state)
        .ok_or_else(|| Error::InvalidResponse {
            method: "RetrievePropertiesEx".into(),
            detail: format!("{vm} has no power state"),
        })
}

/// What powering a VM off looks at, in one property read: its instance UUID (to show it is still the VM meant),
/// its power state, and whether VMware Tools run in it (so that it can be asked to shut down).
#[derive(Clone, Debug, PartialEq)]
pub struct PowerView {
    pub instance_uuid: Option<String>,
    pub state: PowerState,
    pub tools_running: bool,
}

pub async fn power_view(session: &Session, vm: &MoRef) -> Result<PowerView> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &[
            "config.instanceUuid",
            "runtime.powerState",
            "guest.toolsRunningStatus",
        ],
    )
    .await
    .map_err(|e| match e.fault() {
        Some("ManagedObjectNotFound") => Error::VmNotFound {
            selector: crate::inventory::VmSelector::Moref(vm.value.clone()).to_string(),
        },
        _ => e,
    })?;
    let found = found.first();
    let state = found
        .and_then(|o| o.text("runtime.powerState"))
        .and_then(power_state)
        .ok_or_else(|| Error::InvalidResponse {
            method: "RetrievePropertiesEx".into(),
            detail: format!("{vm} has no power state"),
        })?;
    Ok(PowerView {
        instance_uuid: found
            .and_then(|o| o.text("config.instanceUuid"))
            .map(String::from),
        state,
        tools_running: found.and_then(|o| o.text("guest.toolsRunningStatus"))
            == Some("guestToolsRunning"),
    })
}

/// True when VMware Tools run in the guest, so that it can be asked to shut down.
pub async fn tools_running(session: &Session, vm: &MoRef) -> Result<bool> {
    props::vm_property_is(session, vm, "guest.toolsRunningStatus", "guestToolsRunning").await
}

/// Starts `PowerOffVM_Task`; returns the task to record and follow, or None when the VM is already off.
pub async fn start_power_off(session: &Session, vm: &MoRef) -> Result<Option<MoRef>> {
    if current_power_state(session, vm).await? == PowerState::PoweredOff {
        return Ok(None);
    }
    start_task(session, "PowerOffVM_Task", vm, "")
        .await
        .map(Some)
}

/// Starts `PowerOnVM_Task`; None when the VM is already on.
pub async fn start_power_on(session: &Session, vm: &MoRef) -> Result<Option<MoRef>> {
    if current_power_state(session, vm).await? == PowerState::PoweredOn {
        return Ok(None);
    }
    start_task(session, "PowerOnVM_Task", vm, "")
        .await
        .map(Some)
}

/// Follows a power task, treating "already in that state" (`InvalidPowerState`) as success.
pub async fn finish_power_task(session: &Session, task: &MoRef, timeout: Duration) -> Result<()> {
    match wait_task(session, task, timeout).await {
        Ok(_) => Ok(()),
        Err(e) if e.fault() == Some("InvalidPowerState") => Ok(()),
        Err(e) => Err(e),
    }
}

pub async fn power_off(session: &Session, vm: &MoRef, timeout: Duration) -> Result<()> {
    match start_power_off(session, vm).await? {
        Some(task) => finish_power_task(session, &task, timeout).await,
        None => Ok(()),
    }
}

pub async fn power_on(session: &Session, vm: &MoRef, timeout: Duration) -> Result<()> {
    match start_power_on(session, vm).await? {
        Some(task) => finish_power_task(session, &task, timeout).await,
        None => Ok(()),
    }
}

/// Asks the guest to shut down and returns at once (a level-triggered caller watches the power state itself).
/// False when the VM was already off.
pub async fn request_guest_shutdown(session: &Session, vm: &MoRef) -> Result<bool> {
    match session.call("ShutdownGuest", vm, "").await {
        Ok(_) => Ok(true),
        Err(e) if e.fault() == Some("InvalidPowerState") => Ok(false),
        Err(e) => Err(e),
    }
}

/// How a guest shutdown ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    AlreadyOff,
    /// The guest shut itself down.
    Graceful,
    /// No VMware Tools, or the guest took longer than the timeout: powered off.
    Forced,
}

/// Asks the guest to shut down, waits up to `timeout`, then powers off.
pub async fn shutdown_guest(session: &Session, vm: &MoRef, timeout: Duration) -> Result<Shutdown> {
    if current_power_state(session, vm).await? == PowerState::PoweredOff {
        return Ok(Shutdown::AlreadyOff);
    }
    if tools_running(session, vm).await? {
        match session.call("ShutdownGuest", vm, "").await {
            Ok(_) => {
                let deadline = Instant::now() + timeout;
                while Instant::now() < deadline {
                    if current_power_state(session, vm).await? == PowerState::PoweredOff {
                        return Ok(Shutdown::Graceful);
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
            Err(e) if e.fault() == Some("InvalidPowerState") => return Ok(Shutdown::AlreadyOff),
            Err(e) => tracing::warn!(vm = %vm, "guest shutdown refused, powering off: {e}"),
        }
    }
    power_off(session, vm, Duration::from_secs(300)).await?;
    Ok(Shutdown::Forced)
}

pub(crate) async fn start_task(
    session: &Session,
    method: &str,
    this: &MoRef,
    args: &str,
) -> Result<MoRef> {
    let response = session.call(method, this, args).await?;
    response
        .child("returnval")
        .and_then(MoRef::from_element)
        .ok_or_else(|| Error::InvalidResponse {
            method: method.into(),
            detail: "no task in the answer".into(),
        })
}
