//! ESXi hosts: disk slots in use and the migrations waiting for one.

use maud::html;

use super::parts::meter;
use super::{Body, shown_name};
use crate::hosts::{WAITING_FOR_HOST_SLOT, hosts};
use crate::{World, route};

pub(crate) fn page(world: &World) -> Body {
    let hosts = hosts(&world.migrations, &world.providers);
    Body {
        title: "Hosts".into(),
        status: 200,
        live: html! {
            p.intro {
                "A Provider lets at most " code { "spec.limits.maxConcurrentDisksPerHost" } " disks of its migrations
                be read from one ESXi host at once. A migration records its grant in " code { "status.hostSlot" }
                " before it powers off or reads its source, and waits with reason " code { (WAITING_FOR_HOST_SLOT) }
                " while the host's slots are taken; waiters are served in the order they were created. This page
                counts what the migrations in " (world.scope()) " record."
            }
            @if hosts.is_empty() {
                p { "No ESXi host yet: a host shows once a migration has discovered its source VM on it." }
            } @else {
                div.table-scroll {
                    table.hosts {
                        caption { "ESXi hosts by Provider" }
                        thead { tr { th scope="col" { "Host" } th scope="col" { "Provider" }
                            th scope="col" { "Disk slots in use" } th scope="col" { "Holding slots" }
                            th scope="col" { "Waiting, in order" } th scope="col" { "Other migrations" } } }
                        tbody {
                            @for h in &hosts {
                                tr {
                                    th scope="row" { (h.host) @if let Some(moref) = &h.moref { " " span.note { "(" (moref) ")" } } }
                                    td { (h.provider) }
                                    td {
                                        @match h.limit {
                                            Some(limit) => { (meter(&format!("disk slots in use on {}", h.host), h.in_use, limit,
                                                &format!("{} of {limit} in use, {} waiting", h.in_use, h.waiters.len()))) }
                                            None => { (h.in_use) " in use, " (h.waiters.len()) " waiting; the limit is not known (the Provider is not in " (world.scope()) ")" }
                                        }
                                    }
                                    td {
                                        @if h.holders.is_empty() { "none" }
                                        ul.plain { @for holder in &h.holders {
                                            li { a href=(route::migration_path(&holder.namespace, &holder.migration)) {
                                                (shown_name(world, &holder.namespace, &holder.migration)) }
                                                ": " (holder.disks) " disk(s) since " (super::parts::time(holder.granted)) }
                                        } }
                                    }
                                    td {
                                        @if h.waiters.is_empty() { "none" }
                                        ol.plain { @for waiter in &h.waiters {
                                            li { a href=(route::migration_path(&waiter.namespace, &waiter.migration)) {
                                                (shown_name(world, &waiter.namespace, &waiter.migration)) }
                                                ": " (waiter.disks) " disk(s)" }
                                        } }
                                    }
                                    td.num { (h.others) }
                                }
                            }
                        }
                    }
                }
            }
        },
    }
}
