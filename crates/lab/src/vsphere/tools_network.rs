//! What VMware Tools in a lab guest reports of its network: vcsim cannot ask a guest, so the lab tells it through
//! its launcher (`tools/vcsim/guestnet.go`) what ESXi would read from the running tools: each NIC's address with
//! its origin, the default gateway and the DNS servers; or nothing, as when the tools do not run.

use std::time::Duration;

use anyhow::{Result, ensure};
use ferry_vsphere::{Session, VmSelector, inventory};
use serde_json::{Value, json};

use crate::vsphere::lab_hands::lab_client;
use crate::vsphere::vcsim::VcsimEndpoint;

/// One address on one of the guest's NICs, and the default route and resolver through it, as the tools report them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolsReport {
    pub address: String,
    pub prefix_length: u8,
    /// Configured by hand (`origin: manual`), else leased (`dhcp`).
    pub manual: bool,
    /// The default gateway, on this NIC's network.
    pub gateway: Option<String>,
    pub dns_servers: Vec<String>,
}

/// Makes vcsim report `reports` for VM `vm`, the first for its first NIC and so on; with none, no network at all
/// (as when the tools do not run).
pub async fn report_guest_network(
    endpoint: &VcsimEndpoint,
    vm: &str,
    reports: &[ToolsReport],
) -> Result<()> {
    // The lab's VM names need no escaping.
    ensure!(
        vm.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
        "{vm} would need escaping in a URL"
    );
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(60))?).await?;
    let described = async {
        let found = inventory::find_vm(&session, &VmSelector::Name(vm.into())).await?;
        inventory::describe_vm(&session, &found).await
    }
    .await;
    session.logout().await;
    let nics = described?.nics;
    ensure!(
        nics.len() >= reports.len(),
        "{vm} has {} NIC(s), not {}",
        nics.len(),
        reports.len()
    );
    let body = reported(vm, &nics, reports);
    let url = format!(
        "{}/ferry-lab/guest-net?vm={vm}",
        endpoint.url.trim_end_matches("/sdk"),
    );
    let response = lab_client(endpoint)?
        .put(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = response.status();
    ensure!(
        status.is_success(),
        "vcsim refused {vm}'s guest network: {status} {}",
        response.text().await.unwrap_or_default()
    );
    Ok(())
}

/// vSphere's `guest.net` and `guest.ipStack` for a VM's NICs, as JSON of govmomi's types.
fn reported(
    vm: &str,
    nics: &[ferry_vsphere::inventory::NicInfo],
    reports: &[ToolsReport],
) -> Value {
    if reports.is_empty() {
        return json!({"net": [], "ipStack": []});
    }
    let net: Vec<Value> = nics
        .iter()
        .zip(reports)
        .map(|(nic, report)| {
            json!({
                "network": nic.network, "macAddress": nic.mac, "connected": true, "deviceConfigId": nic.key,
                "ipAddress": [report.address],
                "ipConfig": {"ipAddress": [{
                    "ipAddress": report.address, "prefixLength": report.prefix_length,
                    "origin": if report.manual { "manual" } else { "dhcp" }, "state": "preferred"}]},
            })
        })
        .collect();
    let routes: Vec<Value> = reports
        .iter()
        .enumerate()
        .filter_map(|(device, r)| Some((device, r.gateway.as_ref()?)))
        .map(|(device, gateway)| {
            json!({"network": "0.0.0.0", "prefixLength": 0,
                   "gateway": {"ipAddress": gateway, "device": device.to_string()}})
        })
        .collect();
    let dns: Vec<&String> = reports.iter().flat_map(|r| &r.dns_servers).collect();
    json!({
        "net": net,
        "ipStack": [{
            "dnsConfig": {"dhcp": !reports[0].manual, "hostName": vm, "domainName": "", "ipAddress": dns},
            "ipRouteConfig": {"ipRoute": routes},
        }],
    })
}
