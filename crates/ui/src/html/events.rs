//! Recent Events about Ferry's objects.

use maud::{Markup, html};

use super::Body;
use super::parts::time_ago;
use crate::World;
use crate::events::{EventRow, rows};

/// The Events page shows at most this many.
const SHOWN: usize = 200;

pub(crate) fn page(world: &World) -> Body {
    let events = rows(&world.events, None, SHOWN);
    Body {
        title: "Events".into(),
        status: 200,
        live: html! {
            p.intro { "Events about migrations, plans and Providers in " (world.scope()) ", newest first (at most "
                (SHOWN) "; the API server keeps Events for about an hour)." }
            (table(world, &events, "Events, newest first"))
        },
    }
}

pub(crate) fn table(world: &World, events: &[EventRow], caption: &str) -> Markup {
    html! {
        @if events.is_empty() {
            p { "No Events." }
        } @else {
            div.table-scroll {
                table.events {
                    caption { (caption) }
                    thead { tr { th scope="col" { "When" } th scope="col" { "Type" } th scope="col" { "Object" }
                        th scope="col" { "Reason" } th scope="col" { "Message" } th scope="col" { "Count" } } }
                    tbody {
                        @for e in events {
                            tr class=[(e.type_ == "Warning").then_some("warning")] {
                                td { @if let Some(at) = e.at { (time_ago(at, world.now)) } }
                                td { (e.type_) }
                                td {
                                    (e.kind) " "
                                    @let shown = super::shown_name(world, &e.namespace, &e.name);
                                    @match &e.link { Some(link) => { a href=(link) { (shown) } } None => { (shown) } }
                                }
                                td { (e.reason) }
                                td { (e.message) }
                                td.num { (e.count) }
                            }
                        }
                    }
                }
            }
        }
    }
}
