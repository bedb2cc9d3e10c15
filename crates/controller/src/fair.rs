//! Reconcile slots shared between namespaces. A reconcile first takes a slot of its namespace, then one of the
//! whole controller, and holds both until it ends. A namespace whose reconciles all hang (a Provider pointed at an
//! endpoint that never answers) so holds at most its own share; the rest keep serving the other namespaces.
//! Waiting costs nothing but a parked future: kube-runtime's own concurrency is left unbounded, so a reconcile
//! waiting for its namespace never holds a slot another namespace could use.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Namespaces remembered before idle ones are forgotten (an idle one is re-created on its next reconcile).
const REMEMBERED_NAMESPACES: usize = 256;

pub struct Fairness {
    overall: Arc<Semaphore>,
    overall_limit: usize,
    per_namespace: usize,
    namespaces: Mutex<HashMap<String, Arc<Semaphore>>>,
    waiting: AtomicUsize,
}

/// Both slots of one reconcile, given back when it ends.
pub struct Admitted {
    _overall: OwnedSemaphorePermit,
    _namespace: OwnedSemaphorePermit,
}

impl Fairness {
    /// `overall` reconciles at once, at most `per_namespace` of them (capped at `overall`) in any one namespace.
    pub fn new(overall: usize, per_namespace: usize) -> Self {
        let overall = overall.max(1);
        Self {
            overall: Arc::new(Semaphore::new(overall)),
            overall_limit: overall,
            per_namespace: per_namespace.clamp(1, overall),
            namespaces: Mutex::default(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Waits (first come, first served) for a slot of `namespace`, then for one of the controller.
    pub async fn admit(&self, namespace: &str) -> Admitted {
        let own = self.namespace(namespace);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _counted = Decrement(&self.waiting);
        // Neither semaphore is ever closed.
        let namespace = own.acquire_owned().await.expect("open semaphore");
        let overall = self
            .overall
            .clone()
            .acquire_owned()
            .await
            .expect("open semaphore");
        Admitted {
            _overall: overall,
            _namespace: namespace,
        }
    }

    fn namespace(&self, namespace: &str) -> Arc<Semaphore> {
        let mut namespaces = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(own) = namespaces.get(namespace) {
            return own.clone();
        }
        if namespaces.len() >= REMEMBERED_NAMESPACES {
            // Only a semaphore nobody holds, waits on or is about to wait on can go.
            let idle = self.per_namespace;
            namespaces.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < idle);
        }
        let own = Arc::new(Semaphore::new(self.per_namespace));
        namespaces.insert(namespace.to_string(), own.clone());
        own
    }

    /// Reconciles running now.
    pub fn in_flight(&self) -> usize {
        self.overall_limit - self.overall.available_permits()
    }

    /// Reconciles waiting for a slot of their namespace or of the controller.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The gauges, in the text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# TYPE ferry_reconciles_in_flight gauge\nferry_reconciles_in_flight {}",
            self.in_flight()
        );
        let _ = writeln!(
            out,
            "# TYPE ferry_reconciles_waiting gauge\nferry_reconciles_waiting {}",
            self.waiting()
        );
        let _ = writeln!(
            out,
            "# TYPE ferry_reconcile_slots gauge\nferry_reconcile_slots{{scope=\"overall\"}} {}\n\
             ferry_reconcile_slots{{scope=\"namespace\"}} {}",
            self.overall_limit, self.per_namespace
        );
        out
    }
}

struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn admitted_soon(fair: &Fairness, namespace: &str) -> Option<Admitted> {
        tokio::time::timeout(Duration::from_millis(50), fair.admit(namespace))
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_namespace_that_holds_its_share_leaves_the_rest_to_the_others() {
        let fair = Fairness::new(4, 2);
        let mut hung = Vec::new();
        for _ in 0..2 {
            hung.push(
                admitted_soon(&fair, "hostile")
                    .await
                    .expect("within its share"),
            );
        }
        // Its third waits, and does not take one of the two slots left.
        assert!(admitted_soon(&fair, "hostile").await.is_none());
        let a = admitted_soon(&fair, "other")
            .await
            .expect("the other namespace's first");
        let b = admitted_soon(&fair, "third")
            .await
            .expect("a third namespace");
        assert_eq!(fair.in_flight(), 4);
        // The controller is full: even a new namespace waits now.
        assert!(admitted_soon(&fair, "fourth").await.is_none());
        drop(a);
        assert!(admitted_soon(&fair, "fourth").await.is_some());
        drop((b, hung));
        assert_eq!(fair.in_flight(), 0);
        assert_eq!(fair.waiting(), 0, "the timed-out waits are not counted");
    }

    #[tokio::test]
    async fn a_share_larger_than_the_controller_is_the_controller() {
        let fair = Fairness::new(2, 10);
        let _a = admitted_soon(&fair, "ns").await.unwrap();
        let _b = admitted_soon(&fair, "ns").await.unwrap();
        assert!(admitted_soon(&fair, "ns").await.is_none());
        assert!(
            fair.render()
                .contains("ferry_reconcile_slots{scope=\"namespace\"} 2")
        );
    }

    #[tokio::test]
    async fn idle_namespaces_are_forgotten_in_bulk_and_held_ones_kept() {
        let fair = Fairness::new(REMEMBERED_NAMESPACES + 8, 1);
        let held = fair.admit("held").await;
        for n in 0..REMEMBERED_NAMESPACES {
            drop(fair.admit(&format!("ns-{n}")).await);
        }
        let remembered = fair.namespaces.lock().unwrap().len();
        assert!(remembered < REMEMBERED_NAMESPACES, "{remembered}");
        // "held" was kept: its one slot is still taken.
        assert!(admitted_soon(&fair, "held").await.is_none());
        drop(held);
        assert!(admitted_soon(&fair, "held").await.is_some());
    }
}
