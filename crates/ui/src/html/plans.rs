//! The plans: each with its totals, bytes copied, throughput chart and ETA; and one plan's page with its
//! migrations and Events.

use maud::{Markup, html};

use super::parts::{badge, plan_tone, progressbar, throughput_chart};
use super::{Body, dom_id, migrations::migration_rows, shown_name};
use crate::migrations::MigrationView;
use crate::plans::{PlanView, RATE_WINDOW_SECONDS};
use crate::{World, format, route};

fn views(world: &World) -> Vec<PlanView> {
    let mut plans: Vec<PlanView> = world
        .plans
        .iter()
        .map(|p| {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            PlanView::of(p, &world.migrations, world.samples.get(uid))
        })
        .collect();
    plans.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    plans
}

pub(crate) fn list(world: &World) -> Body {
    let plans = views(world);
    Body {
        title: "Plans".into(),
        status: 200,
        live: html! {
            @if plans.is_empty() {
                p { "No plans in " (world.scope()) ". Migrations made without a plan are on the "
                    a href="/migrations" { "Migrations" } " page." }
            }
            @for plan in &plans {
                @let id = dom_id("plan", &plan.namespace, &plan.name);
                article.card aria-labelledby=(id) {
                    h2 id=(id) {
                        a href=(route::plan_path(&plan.namespace, &plan.name)) {
                            "Plan " (shown_name(world, &plan.namespace, &plan.name))
                        }
                        " " (badge(&plan.phase, plan_tone(&plan.phase)))
                    }
                    (totals(plan))
                    (progress(plan))
                    (throughput_chart(&dom_id("chart", &plan.namespace, &plan.name), &format!("plan {}", plan.name),
                        &plan.chart))
                }
            }
        },
    }
}

pub(crate) fn one(world: &World, namespace: &str, name: &str) -> Body {
    let title = format!("Plan {}", shown_name(world, namespace, name));
    let Some(found) = world.plan(namespace, name) else {
        return Body {
            title,
            status: 404,
            live: html! { p { "No plan " (name) " in namespace " (namespace) " (it may have been deleted). See "
            a href="/plans" { "all plans" } "." } },
        };
    };
    let plan = PlanView::of(
        found,
        &world.migrations,
        world
            .samples
            .get(found.metadata.uid.as_deref().unwrap_or_default()),
    );
    let message = found.status.as_ref().and_then(|s| s.message.clone());
    let events = crate::events::rows(&world.events, found.metadata.uid.as_deref(), 20);
    let rows: Vec<(String, Option<MigrationView>, String)> = plan
        .vms
        .iter()
        .map(|vm| {
            let watched = vm
                .migration
                .as_deref()
                .and_then(|m| world.migration(namespace, m))
                .map(MigrationView::of);
            (vm.vm.clone(), watched, vm.phase.clone())
        })
        .collect();
    Body {
        title,
        status: 200,
        live: html! {
            dl.facts {
                dt { "Phase" } dd { (badge(&plan.phase, plan_tone(&plan.phase))) }
                @if let Some(message) = &message { dt { "Summary" } dd { (message) } }
                dt { "Provider" } dd { (plan.provider) }
                dt { "At once" } dd { "at most " (plan.max_in_flight) " migrations" }
            }
            section aria-labelledby="totals" {
                h2 #totals { "Totals" }
                (totals(&plan))
                @if !plan.by_phase.is_empty() {
                    h3 { "VMs by phase" }
                    ul.phases { @for (phase, n) in &plan.by_phase { li { (phase) ": " strong { (n) } } } }
                }
            }
            section aria-labelledby="progress" {
                h2 #progress { "Progress" }
                (progress(&plan))
            }
            section aria-labelledby="throughput" {
                h2 #throughput { "Throughput" }
                (throughput_chart("chart-plan", &format!("plan {}", plan.name), &plan.chart))
            }
            section aria-labelledby="vms" {
                h2 #vms { "Migrations" }
                (migration_rows(world, &rows, &format!("The VMs of plan {}, in the plan's order", plan.name)))
            }
            section aria-labelledby="plan-events" {
                h2 #plan-events { "Events" }
                (super::events::table(world, &events, "Events of this plan, newest first"))
            }
        },
    }
}

fn totals(plan: &PlanView) -> Markup {
    let t = &plan.totals;
    html! {
        dl.totals {
            div { dt { "VMs" } dd { (t.vms) } }
            div { dt { "Succeeded" } dd { (t.succeeded) } }
            div { dt { "Failed" } dd { (t.failed) } }
            div { dt { "Running" } dd { (t.running) } }
            div { dt { "Waiting" } dd { (t.waiting) } }
            @if t.cancelled > 0 { div { dt { "Cancelled" } dd { (t.cancelled) } } }
        }
    }
}

fn progress(plan: &PlanView) -> Markup {
    let copied = format!(
        "{}% ({} of {})",
        format::percent(plan.fraction()),
        format::bytes(plan.bytes_done),
        format::bytes(plan.bytes_total as f64)
    );
    html! {
        dl.facts {
            dt { "Copied" }
            dd {
                (progressbar(&format!("bytes copied by plan {}", plan.name), plan.fraction(), &copied))
                @if plan.not_sized > 0 { " " span.note { "and " (plan.not_sized) " VM(s) whose disks are not known yet" } }
            }
            dt { "Throughput" }
            dd {
                @match plan.rate {
                    Some(rate) => { (format::rate(rate)) " over the last " (format::duration(RATE_WINDOW_SECONDS.min(plan.sampled_seconds.max(1.0)))) }
                    None => "not measured yet",
                }
            }
            dt { "Time left" } dd { (plan.eta_text()) }
        }
    }
}
