//! The page around every view: skip link, navigation, the one `h1`, and the live region.

use maud::{DOCTYPE, Markup, html};

use super::Body;
use crate::{Route, World, format};

const NAV: [(Route, &str); 4] = [
    (Route::Plans, "Plans"),
    (Route::Migrations, "Migrations"),
    (Route::Hosts, "Hosts"),
    (Route::Events, "Events"),
];

pub(crate) fn page(route: Option<&Route>, world: &World, body: &Body) -> Markup {
    let section = route.map(Route::section);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (body.title) " · Ferry" }
                link rel="stylesheet" href="/assets/ui.css";
                script src="/assets/live.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    p.brand { a href="/plans" { "Ferry" } }
                    nav aria-label="Views" {
                        ul {
                            @for (target, label) in &NAV {
                                @let current = section.as_ref() == Some(target);
                                li { a href=(target.path()) aria-current=[current.then_some("page")] { (label) } }
                            }
                        }
                    }
                    p.scope { (world.scope()) " · read-only, with your kubeconfig" }
                }
                main #main tabindex="-1" {
                    h1 { (body.title) }
                    @if let Some(route) = route {
                        p.live-bar {
                            span #live-state { "Shows the cluster as of loading; reload to update." }
                            " "
                            button #live-toggle type="button" hidden aria-pressed="false" { "Pause live updates" }
                        }
                        div #live data-stream=(route.live_path()) { (live(world, body)) }
                    } @else {
                        (live(world, body))
                    }
                }
            }
        }
    }
}

/// The changing part: troubles watching, the view, and the time it shows.
pub(crate) fn live(world: &World, body: &Body) -> Markup {
    html! {
        @if !world.problems.is_empty() {
            section.problems aria-labelledby="problems-title" {
                h2 #problems-title { "Not everything could be read" }
                ul { @for problem in &world.problems { li { (problem) } } }
            }
        }
        (body.live)
        p.as-of { "As of " time datetime=(world.now.to_string()) { (format::clock(world.now)) } "." }
    }
}
