//! The dashboard's HTML, rendered on the server with maud (which escapes every value it is given). Each page is
//! complete without JavaScript; its changing part (`#live`) is also rendered alone, for the live stream.

mod events;
mod hosts;
mod layout;
mod migrations;
pub mod parts;
mod plans;

use maud::Markup;

use crate::{Route, World};

/// A page as served: its HTTP status and HTML.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub status: u16,
    pub html: String,
}

/// What a page is made of: its title (the page's one `h1`) and its changing part.
pub(crate) struct Body {
    pub title: String,
    /// 404 when the object the page is about is not there (any more).
    pub status: u16,
    pub live: Markup,
}

/// The whole page at `route`; `None` renders the page for a path that names nothing.
pub fn page(route: Option<&Route>, world: &World) -> Rendered {
    let body = match route {
        Some(route) => body(route, world),
        None => Body {
            title: "Not found".into(),
            status: 404,
            live: maud::html! {
                p { "No page here. The views are " a href="/plans" { "Plans" } ", " a href="/migrations" { "Migrations" }
                    ", " a href="/hosts" { "Hosts" } " and " a href="/events" { "Events" } "." }
            },
        },
    };
    Rendered {
        status: body.status,
        html: layout::page(route, world, &body).into_string(),
    }
}

/// The changing part of the page at `route`, as the live stream sends it.
pub fn fragment(route: &Route, world: &World) -> String {
    layout::live(world, &body(route, world)).into_string()
}

fn body(route: &Route, world: &World) -> Body {
    match route {
        Route::Plans => plans::list(world),
        Route::Plan { namespace, name } => plans::one(world, namespace, name),
        Route::Migrations => migrations::list(world),
        Route::Migration { namespace, name } => migrations::one(world, namespace, name),
        Route::Hosts => hosts::page(world),
        Route::Events => events::page(world),
    }
}

/// `name`, or `namespace/name` when many namespaces are shown.
pub(crate) fn shown_name(world: &World, namespace: &str, name: &str) -> String {
    if world.many_namespaces() {
        format!("{namespace}/{name}")
    } else {
        name.to_string()
    }
}

/// An id for `namespace/name` that is unique on a page and valid in HTML and CSS selectors.
pub(crate) fn dom_id(prefix: &str, namespace: &str, name: &str) -> String {
    let clean = |s: &str| s.replace('.', "_");
    format!("{prefix}-{}-{}", clean(namespace), clean(name))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::events::tests::event;
    use crate::migrations::tests::vmm;
    use crate::plans::tests::plan;
    use crate::samples::Samples;

    const HOSTILE: &str = r#"<script>alert("x")</script> & 'quotes'"#;

    fn world() -> World {
        let now = "2026-12-01T10:05:00Z".parse().unwrap();
        let mut world = World::empty(Some("apps".into()), now);
        world.plans = vec![Arc::new(plan(
            json!({"phase": "Running", "total": 2, "message": HOSTILE,
            "vms": [{"vm": HOSTILE, "migration": "wave-a", "created": true},
                    {"vm": "b", "migration": "wave-b"}]}),
        ))];
        let mut failed = vmm(
            "wave-a",
            json!({
            "phase": "Failed", "reason": "EncryptedDisk", "message": HOSTILE,
            "source": {"name": HOSTILE, "moref": "vm-1", "host": "esx<1>", "cpus": 1, "coresPerSocket": 1,
                       "memoryMib": 512},
            "disks": [{"index": 0, "sourceFile": HOSTILE, "capacityBytes": 1048576, "sha256": "ab"}],
            "conditions": [{"type": "Validated", "status": "False", "reason": "EncryptedDisk", "message": HOSTILE,
                            "lastTransitionTime": "2026-12-01T10:00:01Z"}],
            "checkpoints": [{"phase": "Discovering", "entered": "2026-12-01T10:00:00.000000Z"},
                            {"phase": "Validating", "entered": "2026-12-01T10:00:00.500000Z"},
                            {"phase": "Failed", "entered": "2026-12-01T10:00:01.000000Z"}],
            "hostSlot": {"host": "esx<1>", "disks": 1, "granted": "2026-12-01T10:00:01.000000Z"},
            "retry": {"attempts": 1, "lastError": {"class": "Permanent", "reason": "EncryptedDisk",
                "message": HOSTILE, "phase": "Validating", "time": "2026-12-01T10:00:01Z"}}}),
        );
        failed.metadata.uid = Some("uid-a".into());
        world.migrations = vec![Arc::new(failed)];
        world.events = vec![event(
            "uid-a",
            "VirtualMachineMigration",
            "EncryptedDisk",
            HOSTILE,
            "2026-12-01T10:00:01Z",
        )];
        let mut samples = Samples::default();
        for t in 0..10 {
            samples.record(
                1_800_000_000.0 + f64::from(t) * 2.0,
                f64::from(t) * 1048576.0,
            );
        }
        world.samples.insert("plan-uid".into(), samples);
        world.problems = vec![format!("watching Events: {HOSTILE}")];
        world
    }

    fn pages() -> Vec<Route> {
        vec![
            Route::Plans,
            Route::Plan {
                namespace: "apps".into(),
                name: "wave".into(),
            },
            Route::Migrations,
            Route::Migration {
                namespace: "apps".into(),
                name: "wave-a".into(),
            },
            Route::Hosts,
            Route::Events,
        ]
    }

    #[test]
    fn names_and_messages_are_escaped_on_every_page() {
        let world = world();
        for route in pages() {
            let page = page(Some(&route), &world);
            assert_eq!(page.status, 200, "{route:?}");
            assert!(
                !page.html.contains("<script>alert"),
                "{route:?}: {}",
                page.html
            );
            assert!(
                page.html
                    .contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp;"),
                "{route:?}: {}",
                page.html
            );
            let fragment = fragment(&route, &world);
            assert!(!fragment.contains("<script>alert"), "{route:?}");
        }
    }

    #[test]
    fn every_page_has_one_h1_navigation_and_progressbars_with_values() {
        let world = world();
        for route in pages() {
            let html = page(Some(&route), &world).html;
            assert_eq!(html.matches("<h1").count(), 1, "{route:?}");
            assert!(html.contains(r#"<html lang="en">"#));
            assert!(html.contains(r#"aria-current="page""#), "{route:?}");
            assert!(
                html.contains(&format!(r#"data-stream="/live{}""#, route.path())),
                "{route:?}"
            );
            for (i, tag) in html
                .split("<")
                .enumerate()
                .filter(|(_, t)| t.contains(r#"role="progressbar""#))
            {
                assert!(
                    tag.contains("aria-valuenow=") && tag.contains("aria-valuetext="),
                    "{route:?} tag {i}: {tag}"
                );
            }
        }
        let plan = page(Some(&pages()[1]), &world).html;
        assert!(
            plan.contains(r#"role="img""#) && plan.contains("<desc id=\"chart-plan-desc\">"),
            "{plan}"
        );
    }

    #[test]
    fn the_failed_migrations_page_shows_its_reason_and_timeline() {
        let html = page(Some(&pages()[3]), &world()).html;
        assert!(html.contains("Why it failed"), "{html}");
        assert!(html.contains("EncryptedDisk"), "{html}");
        let timeline = &html[html.find("Checkpoints in the order entered").unwrap()..];
        let discovering = timeline.find(">Discovering").unwrap();
        let validating = timeline.find(">Validating").unwrap();
        let failed = timeline.find(">Failed").unwrap();
        assert!(
            discovering < validating && validating < failed,
            "{timeline}"
        );
    }

    #[test]
    fn a_missing_object_or_path_is_a_404_that_says_so() {
        let world = world();
        let gone = page(
            Some(&Route::Migration {
                namespace: "apps".into(),
                name: "gone".into(),
            }),
            &world,
        );
        assert_eq!(gone.status, 404);
        assert!(gone.html.contains("No migration gone in namespace apps"));
        let nowhere = page(None, &world);
        assert_eq!(nowhere.status, 404);
        assert_eq!(nowhere.html.matches("<h1").count(), 1);
    }
}
