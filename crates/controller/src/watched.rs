//! The namespaces the controller serves: every one (under a ClusterRole), or a chosen few (under Roles there, with
//! no right outside them). A watch covers one namespace or all of them, so several namespaces take one watch each,
//! merged into the single stream a reflector applies.

use std::collections::HashMap;
use std::fmt::Debug;

use futures::stream::{self, BoxStream, StreamExt};
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::core::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    All,
    /// At least one namespace, each once.
    Namespaces(Vec<String>),
}

impl Watched {
    /// Every namespace when `namespaces` is empty; else those named (duplicates dropped, order kept).
    pub fn from_names(namespaces: Vec<String>) -> Self {
        let mut chosen: Vec<String> = Vec::new();
        for ns in namespaces {
            if !ns.is_empty() && !chosen.contains(&ns) {
                chosen.push(ns);
            }
        }
        match chosen.is_empty() {
            true => Self::All,
            false => Self::Namespaces(chosen),
        }
    }

    /// The events of `K` in the served namespaces, as one watch of them all would give them.
    pub fn events<K>(
        &self,
        client: &Client,
        config: &watcher::Config,
    ) -> BoxStream<'static, watcher::Result<Event<K>>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
        K::DynamicType: Default,
    {
        self.merged(|ns| {
            let api = match ns {
                Some(ns) => Api::<K>::namespaced(client.clone(), ns),
                None => Api::<K>::all(client.clone()),
            };
            watcher::watcher(api, config.clone()).boxed()
        })
    }

    /// The metadata of a kind known only at run time (KubeVirt's and CDI's), as [`Self::events`].
    pub fn dynamic_metadata_events(
        &self,
        client: &Client,
        resource: &ApiResource,
        config: &watcher::Config,
    ) -> BoxStream<'static, watcher::Result<Event<PartialObjectMeta<DynamicObject>>>> {
        self.merged(|ns| {
            let api: Api<PartialObjectMeta<DynamicObject>> = match ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            };
            watcher::watcher(api, config.clone()).boxed()
        })
    }

    /// A kind known only at run time, whole, as [`Self::events`].
    pub fn dynamic_events(
        &self,
        client: &Client,
        resource: &ApiResource,
        config: &watcher::Config,
    ) -> BoxStream<'static, watcher::Result<Event<DynamicObject>>> {
        self.merged(|ns| {
            let api = dynamic_api(client, resource, ns);
            watcher::watcher(api, config.clone()).boxed()
        })
    }

    fn merged<K>(
        &self,
        watch: impl Fn(Option<&str>) -> BoxStream<'static, watcher::Result<Event<K>>>,
    ) -> BoxStream<'static, watcher::Result<Event<K>>>
    where
        K: Resource + Clone + Send + 'static,
    {
        match self {
            Self::All => watch(None),
            Self::Namespaces(namespaces) if namespaces.len() == 1 => watch(Some(&namespaces[0])),
            Self::Namespaces(namespaces) => {
                let tagged = namespaces
                    .iter()
                    .enumerate()
                    .map(|(i, ns)| watch(Some(ns)).map(move |event| (i, event)));
                let mut merge = Merge::new(namespaces.len());
                stream::select_all(tagged)
                    .flat_map(move |(i, event)| {
                        let out: Vec<_> = match event {
                            Ok(event) => merge.on(i, event).into_iter().map(Ok).collect(),
                            Err(e) => vec![Err(e)],
                        };
                        stream::iter(out)
                    })
                    .boxed()
            }
        }
    }
}

fn dynamic_api(client: &Client, resource: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// Merges the events of one watch per namespace into what a reflector expects of a single watch: a listing
/// (`Init`, `InitApply`s, `InitDone`) replaces its whole store, so a namespace's relisting is answered with a
/// listing of every namespace, once all have been listed (never a partial cache marked ready). Between listings,
/// changes pass through. It keeps the last state of every object to list them again. Pure.
pub struct Merge<K> {
    namespaces: Vec<Namespace<K>>,
}

struct Namespace<K> {
    /// What the namespace holds, by name; none before its first listing completed.
    known: Option<HashMap<String, K>>,
    /// A listing under way.
    listing: Option<HashMap<String, K>>,
}

impl<K: Resource + Clone> Merge<K> {
    pub fn new(namespaces: usize) -> Self {
        let namespaces = (0..namespaces)
            .map(|_| Namespace {
                known: None,
                listing: None,
            })
            .collect();
        Self { namespaces }
    }

    /// The events for the reflector after namespace `i` said `event`.
    pub fn on(&mut self, i: usize, event: Event<K>) -> Vec<Event<K>> {
        let all_listed = self.all_listed();
        let ns = &mut self.namespaces[i];
        match event {
            Event::Init => {
                ns.listing = Some(HashMap::new());
                vec![]
            }
            Event::InitApply(object) => {
                if let Some(listing) = &mut ns.listing {
                    listing.insert(object.name_any(), object);
                }
                vec![]
            }
            Event::InitDone => {
                ns.known = Some(ns.listing.take().unwrap_or_default());
                match self.all_listed() {
                    true => self.listing(),
                    false => vec![],
                }
            }
            Event::Apply(object) => {
                if let Some(known) = &mut ns.known {
                    known.insert(object.name_any(), object.clone());
                }
                match all_listed {
                    true => vec![Event::Apply(object)],
                    false => vec![],
                }
            }
            Event::Delete(object) => {
                if let Some(known) = &mut ns.known {
                    known.remove(&object.name_any());
                }
                match all_listed {
                    true => vec![Event::Delete(object)],
                    false => vec![],
                }
            }
        }
    }

    fn all_listed(&self) -> bool {
        self.namespaces.iter().all(|ns| ns.known.is_some())
    }

    fn listing(&self) -> Vec<Event<K>> {
        let objects = self
            .namespaces
            .iter()
            .flat_map(|ns| ns.known.iter().flat_map(|known| known.values()))
            .cloned()
            .map(Event::InitApply);
        std::iter::once(Event::Init)
            .chain(objects)
            .chain(std::iter::once(Event::InitDone))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn object(ns: &str, name: &str, version: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": version}}))
        .unwrap()
    }

    /// The events as (kind, namespace/name@version).
    fn seen(events: Vec<Event<ConfigMap>>) -> Vec<String> {
        let id = |o: &ConfigMap| {
            format!(
                "{}/{}@{}",
                o.namespace().unwrap_or_default(),
                o.name_any(),
                o.resource_version().unwrap_or_default()
            )
        };
        let mut out: Vec<String> = events
            .into_iter()
            .map(|e| match e {
                Event::Init => "Init".into(),
                Event::InitDone => "InitDone".into(),
                Event::InitApply(o) => format!("InitApply {}", id(&o)),
                Event::Apply(o) => format!("Apply {}", id(&o)),
                Event::Delete(o) => format!("Delete {}", id(&o)),
            })
            .collect();
        // Objects of one listing come in no particular order.
        if out.len() > 2 && out[0] == "Init" {
            let last = out.len() - 1;
            out[1..last].sort();
        }
        out
    }

    fn list(merge: &mut Merge<ConfigMap>, i: usize, objects: &[ConfigMap]) -> Vec<String> {
        let mut events = merge.on(i, Event::Init);
        for o in objects {
            events.extend(merge.on(i, Event::InitApply(o.clone())));
        }
        events.extend(merge.on(i, Event::InitDone));
        seen(events)
    }

    #[test]
    fn nothing_is_ready_until_every_namespace_was_listed_then_all_are_listed_as_one() {
        let mut merge = Merge::new(2);
        assert!(list(&mut merge, 0, &[object("a", "x", "1")]).is_empty());
        // A change in a listed namespace waits for the first full listing, which includes it.
        assert!(seen(merge.on(0, Event::Apply(object("a", "y", "2")))).is_empty());
        assert_eq!(
            list(&mut merge, 1, &[object("b", "x", "3")]),
            [
                "Init",
                "InitApply a/x@1",
                "InitApply a/y@2",
                "InitApply b/x@3",
                "InitDone"
            ]
        );
        assert_eq!(
            seen(merge.on(1, Event::Apply(object("b", "x", "4")))),
            ["Apply b/x@4"]
        );
        assert_eq!(
            seen(merge.on(0, Event::Delete(object("a", "x", "5")))),
            ["Delete a/x@5"]
        );
    }

    #[test]
    fn a_namespace_relisted_replaces_only_its_own_objects() {
        let mut merge = Merge::new(2);
        list(
            &mut merge,
            0,
            &[object("a", "x", "1"), object("a", "gone", "1")],
        );
        list(&mut merge, 1, &[object("b", "x", "1")]);
        // Namespace a's watch restarts: what it no longer lists is gone, b's objects stay.
        assert_eq!(
            list(&mut merge, 0, &[object("a", "x", "2")]),
            ["Init", "InitApply a/x@2", "InitApply b/x@1", "InitDone"]
        );
    }

    #[test]
    fn every_namespace_is_watched_once_and_none_named_means_all() {
        assert_eq!(Watched::from_names(vec![]), Watched::All);
        assert_eq!(Watched::from_names(vec!["".into()]), Watched::All);
        assert_eq!(
            Watched::from_names(vec!["b".into(), "a".into(), "b".into()]),
            Watched::Namespaces(vec!["b".into(), "a".into()])
        );
    }
}
