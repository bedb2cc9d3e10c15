//! A migration's disk slot on its source host, as a checkpoint's next move: the grant is written before anything
//! acts on it.

use ferry_api::Provider;

use crate::checkpoint::step::{Next, Step};
use crate::slots::{self, Grant};

/// None when the migration holds its slot; otherwise the grant to record first, or the wait for one.
pub async fn acquire(step: &mut Step<'_>, provider: &Provider) -> Option<Next> {
    match slots::acquire(&step.ctx.slots, step.vmm, step.status, provider).await {
        Grant::Held => None,
        Grant::Granted(slot, message) => {
            step.status.host_slot = Some(slot);
            Some(Next::persist("HostSlotGranted", message))
        }
        Grant::Wait(message) => Some(Next::wait(slots::WAITING, message, slots::RECHECK)),
    }
}
