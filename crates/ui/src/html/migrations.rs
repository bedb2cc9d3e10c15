//! The migrations: a table with phase, checkpoint, per-disk progress and the reason each waits or failed; and
//! one migration's page with its checkpoint timeline, disks, conditions and Events.

use maud::{Markup, html};

use super::parts::{badge, progressbar, time, time_ago};
use super::{Body, shown_name};
use crate::migrations::{MigrationView, TimelineRow, Tone, WhyKind, conditions, timeline};
use crate::{World, format, route};

pub(crate) fn list(world: &World) -> Body {
    let mut views: Vec<MigrationView> = world
        .migrations
        .iter()
        .map(|m| MigrationView::of(m))
        .collect();
    views.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let rows: Vec<(String, Option<MigrationView>, String)> = views
        .into_iter()
        .map(|v| (v.vm.clone(), Some(v), String::new()))
        .collect();
    Body {
        title: "Migrations".into(),
        status: 200,
        live: html! {
            @if rows.is_empty() {
                p { "No migrations in " (world.scope()) "." }
            } @else {
                (migration_rows(world, &rows, &format!("Migrations in {}", world.scope())))
            }
        },
    }
}

/// A table of migrations: each row a VM, its migration (none yet: `phase` says why), phase, checkpoint,
/// progress per disk, and why it waits or failed.
pub(crate) fn migration_rows(
    world: &World,
    rows: &[(String, Option<MigrationView>, String)],
    caption: &str,
) -> Markup {
    html! {
        div.table-scroll {
            table.migrations {
                caption { (caption) }
                thead {
                    tr {
                        th scope="col" { "Migration" }
                        th scope="col" { "Source VM" }
                        th scope="col" { "Phase" }
                        th scope="col" { "Checkpoint" }
                        th scope="col" { "Progress" }
                        th scope="col" { "Reason" }
                    }
                }
                tbody {
                    @for (vm, view, phase) in rows {
                        @match view {
                            Some(m) => { (row(world, m)) }
                            None => {
                                tr {
                                    td { "none yet" }
                                    td { (vm) }
                                    td { (badge(phase, Tone::Waiting)) }
                                    td { "–" }
                                    td { "–" }
                                    td { "waits for a place among the plan's migrations running at once" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn row(world: &World, m: &MigrationView) -> Markup {
    let name = shown_name(world, &m.namespace, &m.name);
    html! {
        tr {
            th scope="row" { a href=(route::migration_path(&m.namespace, &m.name)) { (name) } }
            td { (m.vm) }
            td { (badge(&m.phase, m.tone)) }
            td { (m.checkpoint) }
            td { (progress(m, &name)) }
            td { (why(m)) }
        }
    }
}

/// The whole migration's bar, then one per disk.
fn progress(m: &MigrationView, name: &str) -> Markup {
    let overall = if m.bytes_total > 0 {
        format!(
            "{}% ({} of {})",
            format::percent(m.fraction()),
            format::bytes(m.bytes_done),
            format::bytes(m.bytes_total as f64)
        )
    } else {
        "0%: its disks are not known yet".to_string()
    };
    html! {
        (progressbar(&format!("progress of {name}"), m.fraction(), &overall))
        @if !m.disks.is_empty() {
            ul.disks {
                @for d in &m.disks {
                    li { (progressbar(&format!("disk {} of {name}", d.index), d.fraction,
                        &format!("disk {}: {}%, {}", d.index, format::percent(d.fraction), d.state))) }
                }
            }
        }
    }
}

fn why(m: &MigrationView) -> Markup {
    html! {
        @if let Some(why) = &m.why {
            @if why.kind != WhyKind::Now { span.why-kind { (why.kind.label()) ": " } }
            strong.reason { (why.reason) }
            @if !why.message.is_empty() { " " span.message { (why.message) } }
        }
    }
}

pub(crate) fn one(world: &World, namespace: &str, name: &str) -> Body {
    let title = format!("Migration {}", shown_name(world, namespace, name));
    let Some(vmm) = world.migration(namespace, name) else {
        return Body {
            title,
            status: 404,
            live: html! { p { "No migration " (name) " in namespace " (namespace) " (it may have been deleted). See "
            a href="/migrations" { "all migrations" } "." } },
        };
    };
    let m = MigrationView::of(vmm);
    let status = vmm.status.clone().unwrap_or_default();
    let steps = timeline(&status, world.now);
    let conditions = conditions(&status);
    let events = crate::events::rows(&world.events, vmm.metadata.uid.as_deref(), 30);
    let shown = shown_name(world, namespace, name);
    html_body(
        title,
        html! {
            dl.facts {
                dt { "Phase" } dd { (badge(&m.phase, m.tone)) }
                dt { "Checkpoint" } dd { (m.checkpoint) }
                dt { "Source VM" } dd { (m.vm) @if let Some(host) = &m.host { " on ESXi host " (host) } }
                dt { "Target VM" }
                dd {
                    @match (&m.target_vm, m.target_created) {
                        (Some(vm), true) => { (vm) }
                        (Some(vm), false) => { (vm) " (not created)" }
                        (None, _) => "not named yet",
                    }
                }
                @if let Some(plan) = &m.plan {
                    dt { "Plan" } dd { a href=(route::plan_path(namespace, plan)) { (plan) } }
                }
                @if let Some(t) = m.created { dt { "Created" } dd { (time_ago(t, world.now)) } }
                @if let Some(t) = m.started { dt { "Started" } dd { (time_ago(t, world.now)) } }
                @if let Some(t) = m.completed { dt { "Ended" } dd { (time_ago(t, world.now)) } }
            }
            @if let Some(why) = &m.why {
                section.why aria-labelledby="why" {
                    h2 #why { (match why.kind {
                        WhyKind::Failed => "Why it failed",
                        WhyKind::Stopped => "Why it waits for a person",
                        WhyKind::Cancelled => "Why it stopped",
                        WhyKind::Now => "What it is doing",
                    }) }
                    dl.facts {
                        dt { "Reason" } dd { strong.reason { (why.reason) } }
                        dt { "Message" } dd { (why.message) }
                        @if let Some(checkpoint) = &why.checkpoint { dt { "In checkpoint" } dd { (checkpoint) } }
                        @if let Some(class) = &why.class { dt { "Error class" } dd { (class) } }
                        @if let Some(at) = why.at { dt { "At" } dd { (time_ago(at, world.now)) } }
                        @if let Some(next) = m.next_attempt { dt { "Next attempt" } dd { (time(next)) } }
                    }
                }
            }
            section aria-labelledby="progress" {
                h2 #progress { "Progress" }
                (progress(&m, &shown))
                @if !m.disks.is_empty() {
                    div.table-scroll {
                        table {
                            caption { "Disks" }
                            thead { tr { th scope="col" { "Disk" } th scope="col" { "Source file" }
                                th scope="col" { "Size" } th scope="col" { "State" } } }
                            tbody {
                                @for d in &m.disks {
                                    tr { th scope="row" { (d.index) } td { code { (d.source_file) } }
                                        td.num { (format::bytes(d.capacity as f64)) } td { (d.state) } }
                                }
                            }
                        }
                    }
                }
            }
            section aria-labelledby="timeline" {
                h2 #timeline { "Timeline" }
                (timeline_table(&steps, status.completion_time.as_ref().map(|t| t.0)))
            }
            section aria-labelledby="conditions" {
                h2 #conditions { "Conditions" }
                @if conditions.is_empty() {
                    p { "None recorded yet." }
                } @else {
                    div.table-scroll {
                        table {
                            caption { "Conditions, as the controller last set them" }
                            thead { tr { th scope="col" { "Type" } th scope="col" { "Status" } th scope="col" { "Reason" }
                                th scope="col" { "Message" } th scope="col" { "Since" } } }
                            tbody {
                                @for c in &conditions {
                                    tr { th scope="row" { (c.type_) } td { (c.status) } td { (c.reason) }
                                        td { (c.message) } td { (time(c.since)) } }
                                }
                            }
                        }
                    }
                }
            }
            section aria-labelledby="migration-events" {
                h2 #migration-events { "Events" }
                (super::events::table(world, &events, "Events of this migration, newest first"))
            }
        },
    )
}

fn html_body(title: String, live: Markup) -> Body {
    Body {
        title,
        status: 200,
        live,
    }
}

/// The checkpoints in the order entered: when, how long after the start, and how long each took, with a bar of
/// its share of the whole (the numbers beside it say the same).
fn timeline_table(steps: &[TimelineRow], ended: Option<k8s_openapi::jiff::Timestamp>) -> Markup {
    let whole: f64 = steps.iter().map(|s| s.took).sum::<f64>().max(1e-6);
    html! {
        @if steps.is_empty() {
            p { "No checkpoint entered yet." }
        } @else {
            div.table-scroll {
                table.timeline {
                    caption { "Checkpoints in the order entered, from the times recorded in the status" }
                    thead { tr { th scope="col" { "Checkpoint" } th scope="col" { "Entered" }
                        th scope="col" { "After start" } th scope="col" { "Took" } th scope="col" { "Share" } } }
                    tbody {
                        @for step in steps {
                            tr class=[step.current.then_some("current")] {
                                th scope="row" { (step.phase) @if step.current { " " span.note { "(now)" } } }
                                td { time datetime=(step.entered.to_string()) { (format::clock_millis(step.entered)) } }
                                td.num { "+" (format::duration(step.after_start)) }
                                td.num { (format::duration(step.took)) @if step.current { " so far" } }
                                td {
                                    svg.share viewBox="0 0 100 10" preserveAspectRatio="none" aria-hidden="true" focusable="false" {
                                        rect.fill width=(format!("{:.2}", step.took / whole * 100.0)) height="10" {}
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if let Some(end) = ended {
                p { "Ended at " (time(end)) "." }
            }
        }
    }
}
