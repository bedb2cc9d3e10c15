//! `ferry ui` as a person sees it, in headless Chromium (Debian's `chromium`): a plan of three VMs, two on one
//! ESXi host whose Provider reads one disk at a time there, and one that Validating refuses (its disk is VM
//! Encryption ciphertext). The pages are read while the plan runs and after it ended: the plan's totals, each
//! migration's phase and progress, the host's slot in use and its waiter, the refused migration's reason, the
//! timeline; and the DOM's accessibility basics. With `FERRY_UI_SCREENSHOTS` set, the main views are saved
//! there as PNG.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_api::{MigrationPlan, PlanPhase};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use support::*;

const HOST: &str = "DC0_C0_H2";
const REFUSED: &str = "ferry-encrypted-vm";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_plans_totals_progress_reasons_and_timeline_in_a_browser() {
    let browser = Browser::new();
    // Datastore reads at 16 MiB/s: long enough to see a VM copy while another waits for the host's slot.
    let realism = ferry_lab::vsphere::vcsim::VcsimRealism {
        folder_throttle: Some(16 << 20),
        ..ferry_lab::vsphere::vcsim::VcsimRealism::production_like()
    };
    ferry_testkit::TestLab::shared_with_standins_and(ferry(), realism).await;
    let (client, ns) = setup("ui").await;
    let ns = ns.name().to_string();
    let lab = lab().await;
    // One disk read at a time per host: the second VM on the host waits for the first.
    Api::<ferry_api::Provider>::namespaced(client.clone(), &ns)
        .patch(
            ferry_lab::vsphere::demo::PROVIDER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"limits": {"maxConcurrentDisksPerHost": 1}}})),
        )
        .await
        .unwrap();
    let seeded = [
        ("ferry-ui-a", &[128u64, 64][..]),
        ("ferry-ui-b", &[192][..]),
    ];
    for (vm, sizes) in seeded {
        seed_vm_on(&lab.dir().join(vm), vm, sizes, HOST).await;
    }
    let ui = Dashboard::start(&ns, &lab.state().kubeconfig);
    let networks: Vec<_> = ferry_lab::vsphere::demo::SOURCE_NETWORKS
        .iter()
        .map(|n| json!({"source": n, "pod": {}}))
        .collect();
    let plan = json!({"apiVersion": ferry_api::API_VERSION, "kind": "MigrationPlan",
        "metadata": {"name": "wave", "namespace": ns},
        "spec": {"providerRef": {"name": ferry_lab::vsphere::demo::PROVIDER}, "maxInFlight": 3,
            "vms": [{"name": "ferry-ui-a"}, {"name": "ferry-ui-b"}, {"name": REFUSED}],
            "guestCheck": {"settleSeconds": ferry_lab::vsphere::demo::LAB_SETTLE_SECONDS},
            "target": {"networks": networks}}});
    ferry_lab::vsphere::demo::apply(&client, &ns, plan)
        .await
        .unwrap();
    let started = Instant::now();

    // While it runs: one VM holds the host's slot and the other waits, and the hosts view says so.
    let api = migrations(&client, &ns);
    let plans = Api::<MigrationPlan>::namespaced(client.clone(), &ns);
    let mut seen_waiting = false;
    let mut seen_running = false;
    while !(seen_waiting && seen_running) {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the plan never showed a VM waiting for the host's slot (waiting seen: {seen_waiting}, running page \
             seen: {seen_running})"
        );
        let all = api.list(&ListParams::default()).await.unwrap().items;
        let waiter = all.iter().find(|m| {
            m.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("WaitingForHostSlot")
        });
        if !seen_waiting && let Some(waiter) = waiter {
            let name = waiter.metadata.name.clone().unwrap();
            let dom = browser.dom(&ui.url("/hosts"));
            let page = Page::new(&dom);
            page.assert_accessible("hosts");
            // The host's row: its one slot in use, and the waiter in line (unless the holder has just finished).
            if page.text().contains("1 of 1 in use, 1 waiting") {
                let waiting = page.cell_after(HOST, 4);
                assert!(waiting.contains(&name), "{name} waits on {HOST}: {waiting}");
                browser.screenshot(&ui.url("/hosts"), "hosts-running");
                seen_waiting = true;
            }
        }
        let running = plans
            .get("wave")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase);
        assert!(
            !running.is_some_and(|p| p != PlanPhase::Running),
            "the plan ended before it was seen running with a VM waiting for the host's slot (waiting seen: \
             {seen_waiting}, running page seen: {seen_running})"
        );
        if !seen_running && running == Some(PlanPhase::Running) && all.len() == 3 {
            let dom = browser.dom(&ui.url(&format!("/plans/{ns}/wave")));
            let page = Page::new(&dom);
            page.assert_accessible("plan while running");
            let text = page.text();
            assert!(text.contains("Plan wave"), "{text}");
            assert!(text.contains("VMs 3"), "the totals count three VMs: {text}");
            // Each migration's row: its phase and a progress bar with its value.
            for vm in ["ferry-ui-a", "ferry-ui-b", REFUSED] {
                let row = page.row_with(vm);
                assert!(
                    row.contains(r#"role="progressbar""#) && row.contains("aria-valuenow="),
                    "{vm}: {row}"
                );
                assert!(
                    PHASES.iter().any(|p| row.contains(p)),
                    "{vm} has a phase: {row}"
                );
            }
            browser.screenshot(&ui.url(&format!("/plans/{ns}/wave")), "plan-running");
            seen_running = true;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The live stream sends the plan page's changing part.
    let stream = ui.get_raw(&format!("/live/plans/{ns}/wave"), "127.0.0.1", 4096);
    assert!(
        stream.contains("text/event-stream") && stream.contains("event: fragment"),
        "{stream}"
    );

    // After: two succeeded and one refused with its reason.
    let deadline = Instant::now() + Duration::from_secs(900);
    let ended = loop {
        let plan = plans.get("wave").await.unwrap();
        if plan
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p != PlanPhase::Running)
        {
            break plan;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            serde_json::to_string_pretty(&plan.status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let status = ended.status.unwrap();
    assert_eq!(status.phase, Some(PlanPhase::Failed), "{status:?}");
    println!("plan ended after {:?}", started.elapsed());
    // A sample or two after the end, so the chart has the whole run.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let all = api.list(&ListParams::default()).await.unwrap().items;
    let name_of = |vm: &str| {
        status
            .vms
            .iter()
            .find(|v| v.vm == vm)
            .map(|v| v.migration.clone())
            .unwrap()
    };

    let plan_url = ui.url(&format!("/plans/{ns}/wave"));
    let dom = browser.dom(&plan_url);
    let page = Page::new(&dom);
    page.assert_accessible("plan");
    let text = page.text();
    for expected in [
        "Plan wave",
        "Failed",
        "VMs 3",
        "Succeeded 2",
        "Failed 1",
        "Running 0",
        "Waiting 0",
        "Time left none: the plan ended",
    ] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    // Bytes copied of the total: every disk of the two VMs (128 + 64 + 192 MiB), of all three VMs' disks (the
    // refused one's were discovered, and never copied).
    let total: i64 = all
        .iter()
        .filter_map(|m| m.status.as_ref())
        .map(|s| s.bytes_done().1)
        .sum();
    let copied = format!(
        "{}% (384.0 MiB of {})",
        ferry_ui::format::percent(384.0 * 1048576.0 / total as f64),
        ferry_ui::format::bytes(total as f64)
    );
    assert!(
        text.contains(&format!("Copied {copied}")),
        "{copied} in {text}"
    );
    assert!(page.chart_summary().contains("peak"), "{dom}");
    for (vm, _) in seeded {
        let row = page.row_with(&name_of(vm));
        assert!(row.contains("Succeeded"), "{vm}: {row}");
        assert!(row.contains(r#"aria-valuenow="100""#), "{vm}: {row}");
    }
    let refused_row = page.row_with(&name_of(REFUSED));
    assert!(
        refused_row.contains("Failed") && refused_row.contains("EncryptedDisk"),
        "{refused_row}"
    );
    browser.screenshot(&plan_url, "plan");

    // The refused migration's page: why, and its timeline up to Validating.
    let refused = all
        .iter()
        .find(|m| m.metadata.name.as_deref() == Some(name_of(REFUSED).as_str()))
        .unwrap();
    let error = refused
        .status
        .as_ref()
        .and_then(|s| s.retry.as_ref())
        .and_then(|r| r.last_error.clone())
        .unwrap();
    let url = ui.url(&format!("/migrations/{ns}/{}", name_of(REFUSED)));
    let dom = browser.dom(&url);
    let page = Page::new(&dom);
    page.assert_accessible("refused migration");
    let text = page.text();
    assert!(text.contains("Why it failed"), "{text}");
    assert!(
        text.contains(&format!("Reason {}", error.reason)) && text.contains(&error.message),
        "{error:?} in {text}"
    );
    assert!(text.contains("In checkpoint Validating"), "{text}");
    // The checkpoints it entered, as recorded: refused in Validating, before Preparing touched the source.
    let recorded = checkpoints(refused);
    assert_eq!(recorded.last().map(String::as_str), Some("Validating"));
    assert_eq!(page.timeline(), recorded, "{dom}");
    assert!(text.contains("Ended at"), "{text}");
    browser.screenshot(&url, "migration-failed");

    // A migration that succeeded: every checkpoint in order, each disk done.
    let done = all
        .iter()
        .find(|m| m.metadata.name.as_deref() == Some(name_of("ferry-ui-a").as_str()))
        .unwrap();
    let recorded = checkpoints(done);
    let url = ui.url(&format!("/migrations/{ns}/{}", name_of("ferry-ui-a")));
    let dom = browser.dom(&url);
    let page = Page::new(&dom);
    page.assert_accessible("succeeded migration");
    assert_eq!(page.timeline(), recorded, "{dom}");
    assert_eq!(recorded.last().map(String::as_str), Some("Succeeded"));
    assert_eq!(
        dom.matches(r#"aria-valuenow="100""#).count(),
        3,
        "the migration's bar and one per disk, each at 100%: {dom}"
    );
    assert!(
        page.text().contains("imported, sha256 verified")
            || page.text().contains("written and imported")
    );
    browser.screenshot(&url, "migration");

    // The other views.
    for (path, shot, expected) in [
        ("/plans", "plans", "Plan wave"),
        ("/migrations", "migrations", "EncryptedDisk"),
        ("/hosts", "hosts", HOST),
        ("/events", "events", "VirtualMachineMigration"),
    ] {
        let dom = browser.dom(&ui.url(path));
        let page = Page::new(&dom);
        page.assert_accessible(path);
        assert!(
            page.text().contains(expected),
            "{expected} on {path}: {}",
            page.text()
        );
        browser.screenshot(&ui.url(path), shot);
    }
    let hosts = Page::new(&browser.dom(&ui.url("/hosts"))).text();
    assert!(
        hosts.contains("0 of 1 in use, 0 waiting"),
        "every slot released: {hosts}"
    );

    // Read-only, and only for requests addressed to this machine.
    let rebound = ui.get_raw("/plans", "evil.example", 512);
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    let missing = ui.get_raw("/migrations/nowhere/nothing", "localhost", 512);
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    drop(ui);
}

/// Every phase's name, as the pages show them.
const PHASES: [&str; 17] = [
    "Pending",
    "Waiting",
    "Discovering",
    "Validating",
    "Allocating",
    "Precopying",
    "Preparing",
    "Converting",
    "Importing",
    "Adapting",
    "CreatingVM",
    "Starting",
    "ValidatingGuest",
    "Cancelling",
    "Succeeded",
    "Failed",
    "ManualInterventionRequired",
];

/// The checkpoints `m` entered, in order, by name.
fn checkpoints(m: &ferry_api::VirtualMachineMigration) -> Vec<String> {
    let status = m.status.as_ref().unwrap();
    status
        .checkpoints
        .iter()
        .map(|c| ferry_ui::format::phase(Some(c.phase)))
        .collect()
}

/// `ferry ui` as a subprocess on a free loopback port, killed on drop.
struct Dashboard {
    child: Child,
    base: String,
}

impl Dashboard {
    fn start(ns: &str, kubeconfig: &Path) -> Self {
        let mut child = Command::new(ferry())
            .args(["ui", "--listen", "127.0.0.1:0", "-n", ns, "--kubeconfig"])
            .arg(kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting ferry ui");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        // `ferry ui: serving http://127.0.0.1:PORT/ for namespace NS; ...`
        let base = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("ferry ui said: {first:?}"))
            .trim_end_matches('/')
            .to_string();
        Self { child, base }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A GET with `host` as its Host header; the first `limit` bytes of the answer, headers included.
    fn get_raw(&self, path: &str, host: &str, limit: usize) -> String {
        let address = self.base.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buffer = [0u8; 1024];
        while got.len() < limit {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buffer[..n]),
            }
        }
        String::from_utf8_lossy(&got).to_string()
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless Chromium with a profile of its own, removed on drop; each page load is a process group of its own,
/// killed whole when it ends or takes too long.
struct Browser {
    binary: PathBuf,
    profile: tempfile::TempDir,
    shots: Option<PathBuf>,
}

impl Browser {
    fn new() -> Self {
        let binary = ["chromium", "chromium-browser"]
            .iter()
            .map(|b| Path::new("/usr/bin").join(b))
            .find(|p| p.exists())
            .expect("headless Chromium: apt-get install chromium (hack/setup.sh installs it)");
        let shots = std::env::var_os("FERRY_UI_SCREENSHOTS").map(PathBuf::from);
        if let Some(dir) = &shots {
            std::fs::create_dir_all(dir).unwrap();
        }
        Self {
            binary,
            profile: tempfile::tempdir().unwrap(),
            shots,
        }
    }

    fn run(&self, args: &[String]) -> String {
        let mut command = Command::new(&self.binary);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
            ])
            .arg(format!("--user-data-dir={}", self.profile.path().display()))
            // The live stream stays open: give the page a moment after load, then take what it shows.
            .arg("--timeout=3000")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0);
        let mut child = command.spawn().expect("starting chromium");
        let group = Group(child.id());
        let mut out = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromium {args:?} did not finish in 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(group);
        reader.join().unwrap()
    }

    /// The DOM after the page loaded and its script ran.
    fn dom(&self, url: &str) -> String {
        let dom = self.run(&["--dump-dom".into(), url.into()]);
        assert!(
            dom.contains("</html>"),
            "chromium gave no page for {url}: {dom}"
        );
        dom
    }

    /// A screenshot as `name.png` in `FERRY_UI_SCREENSHOTS`, when set.
    fn screenshot(&self, url: &str, name: &str) {
        let Some(dir) = &self.shots else { return };
        let file = dir.join(format!("{name}.png"));
        self.run(&[
            format!("--screenshot={}", file.display()),
            "--window-size=1280,1600".into(),
            url.into(),
        ]);
        assert!(file.exists(), "no screenshot {}", file.display());
    }
}

/// A process group, killed on drop: Chromium leaves helpers (zygote, renderer) behind when its main process is
/// killed alone.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(Stdio::null())
            .status();
    }
}

/// A dumped DOM, read as a person and as assistive technology would.
struct Page<'a> {
    dom: &'a str,
}

impl<'a> Page<'a> {
    fn new(dom: &'a str) -> Self {
        Self { dom }
    }

    /// The text of the page's main part, tags removed and white space collapsed.
    fn text(&self) -> String {
        let main = self
            .dom
            .find("<main")
            .map_or(self.dom, |start| &self.dom[start..]);
        text_of(main)
    }

    /// The table row that mentions `needle`, as HTML.
    fn row_with(&self, needle: &str) -> String {
        self.dom
            .split("<tr")
            .skip(1)
            .map(|row| row.split("</tr>").next().unwrap_or_default())
            .find(|row| row.contains(needle))
            .unwrap_or_else(|| panic!("no row with {needle}: {}", self.dom))
            .to_string()
    }

    /// The text of the `n`th cell after the one of the row that names `needle`.
    fn cell_after(&self, needle: &str, n: usize) -> String {
        let row = self.row_with(needle);
        let cells: Vec<&str> = row.split("<td").skip(1).collect();
        text_of(cells.get(n.saturating_sub(1)).copied().unwrap_or_default())
    }

    /// The checkpoints of the timeline table, in order.
    fn timeline(&self) -> Vec<String> {
        let start = self
            .dom
            .find("Checkpoints in the order entered")
            .unwrap_or_else(|| panic!("no timeline: {}", self.dom));
        let table = &self.dom[start..];
        let table = &table[..table.find("</table>").unwrap()];
        table
            .split(r#"<th scope="row">"#)
            .skip(1)
            .map(|cell| {
                text_of(cell.split("</th>").next().unwrap())
                    .trim_end_matches("(now)")
                    .trim()
                    .to_string()
            })
            .collect()
    }

    /// The throughput chart's description.
    fn chart_summary(&self) -> String {
        let desc = self.dom.split("<desc").nth(1).unwrap_or_default();
        text_of(desc.split("</desc>").next().unwrap_or_default())
    }

    /// One `h1`; every progress bar with its value; every chart with a title and description it is labelled by;
    /// the language set; focus not taken from the keyboard (no positive tabindex).
    fn assert_accessible(&self, what: &str) {
        let dom = self.dom;
        assert_eq!(dom.matches("<h1").count(), 1, "{what}: one h1");
        assert!(dom.contains(r#"<html lang="en">"#), "{what}");
        assert!(dom.contains(r##"href="#main""##), "{what}: a skip link");
        for tag in dom
            .split('<')
            .filter(|t| t.contains(r#"role="progressbar""#))
        {
            let tag = tag.split('>').next().unwrap();
            for attribute in [
                "aria-valuenow=",
                "aria-valuemin=",
                "aria-valuemax=",
                "aria-label=",
            ] {
                assert!(tag.contains(attribute), "{what}: {attribute} on <{tag}>");
            }
        }
        for chart in dom
            .split("<svg")
            .skip(1)
            .filter(|s| s.contains(r#"role="img""#))
        {
            let head = chart.split('>').next().unwrap();
            let labelled = head
                .split(r#"aria-labelledby=""#)
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or_else(|| panic!("{what}: a chart without aria-labelledby: <svg{head}>"));
            for id in labelled.split_whitespace() {
                let at = dom
                    .find(&format!(r#"id="{id}">"#))
                    .unwrap_or_else(|| panic!("{what}: no element {id}"));
                let text = text_of(dom[at..].split("</").next().unwrap());
                assert!(text.len() > 10, "{what}: {id} says {text:?}");
            }
        }
        assert!(
            !dom.contains("tabindex=\"1"),
            "{what}: no positive tabindex"
        );
    }
}

/// Text without tags or entities' escapes that matter here, white space collapsed.
fn text_of(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => {
                in_tag = true;
                text.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    let text = text
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", " ");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
