//! `ferry inventory`: what Ferry sees on a vSphere endpoint, before anyone writes a migration.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{ConnectConfig, Session, TlsMode};

#[derive(Args)]
pub struct InventoryArgs {
    /// The SDK URL, for example https://vcenter.example.com/sdk.
    #[arg(long, env = "VCSIM_URL")]
    url: String,
    #[arg(long, env = "VCSIM_USERNAME")]
    username: String,
    /// A file holding the password (never pass passwords on the command line).
    #[arg(long, env = "VCSIM_PASSWORD_FILE")]
    password_file: PathBuf,
    /// Pin the endpoint's SHA-256 certificate thumbprint.
    #[arg(long, conflicts_with_all = ["ca_file", "insecure"])]
    thumbprint: Option<String>,
    /// PEM CA certificates that sign the endpoint's certificate.
    #[arg(long, env = "VCSIM_CA_FILE", conflicts_with = "insecure")]
    ca_file: Option<PathBuf>,
    /// Skip certificate verification (prints the thumbprint to pin instead).
    #[arg(long)]
    insecure: bool,
    /// Describe one VM: hardware, disks and NICs.
    #[arg(long)]
    vm: Option<String>,
    #[arg(short, long, value_enum, default_value = "table")]
    output: Output,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

pub async fn run(args: InventoryArgs) -> Result<()> {
    let tls = match (&args.thumbprint, &args.ca_file, args.insecure) {
        (Some(t), _, _) => TlsMode::Thumbprint(t.clone()),
        (None, _, true) => TlsMode::InsecureSkipVerify,
        (None, Some(ca), false) => TlsMode::CaBundle(
            std::fs::read_to_string(ca).with_context(|| format!("reading {}", ca.display()))?,
        ),
        (None, None, false) => bail!(
            "say how to trust {}: --ca-file, --thumbprint, or --insecure",
            args.url
        ),
    };
    let password = std::fs::read_to_string(&args.password_file)
        .with_context(|| format!("reading {}", args.password_file.display()))?
        .trim_end_matches(['\r', '\n'])
        .to_string();
    let config = ConnectConfig {
        url: args.url.clone(),
        username: args.username,
        password,
        tls,
        timeout: Duration::from_secs(60),
    };
    let session = Session::connect(config).await?;
    if args.insecure {
        eprintln!(
            "warning: certificate not verified; to pin it, use --thumbprint {}",
            session.presented_thumbprint().unwrap_or_default()
        );
    }
    let about = session.about().clone();
    match args.vm {
        None => {
            let vms = inventory::list_vms(&session).await?;
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&vms)?),
                Output::Table => {
                    println!(
                        "{} ({}, API {}) at {}\n",
                        about.full_name, about.api_type, about.api_version, args.url
                    );
                    println!(
                        "{:<28} {:<11} {:<10} {:<38} GUEST",
                        "NAME", "POWER", "MOREF", "UUID"
                    );
                    for vm in vms {
                        let power = vm.power_state.map(|p| format!("{p:?}")).unwrap_or_default();
                        println!(
                            "{:<28} {:<11} {:<10} {:<38} {}",
                            vm.name,
                            power,
                            vm.moref,
                            vm.uuid.unwrap_or_default(),
                            vm.guest_id.unwrap_or_default()
                        );
                    }
                }
            }
        }
        Some(name) => {
            let moref = inventory::find_vm(&session, &VmSelector::Name(name)).await?;
            let vm = inventory::describe_vm(&session, &moref).await?;
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&vm)?),
                Output::Table => print_vm(&vm),
            }
        }
    }
    session.logout().await;
    Ok(())
}

fn print_vm(vm: &ferry_vsphere::VmInfo) {
    println!(
        "VM {} ({}) in datacenter {}",
        vm.name, vm.moref, vm.datacenter
    );
    println!("  uuid            {}", vm.uuid.as_deref().unwrap_or("-"));
    println!(
        "  instance uuid   {}",
        vm.instance_uuid.as_deref().unwrap_or("-")
    );
    println!(
        "  guest           {}",
        vm.guest_id.as_deref().unwrap_or("-")
    );
    println!("  firmware        {:?}", vm.firmware);
    println!(
        "  cpu             {} ({} per socket)",
        vm.cpus, vm.cores_per_socket
    );
    println!("  memory          {} MiB", vm.memory_mib);
    println!("  power           {:?}", vm.power_state);
    println!(
        "  tools           {}",
        vm.tools_running_status.as_deref().unwrap_or("-")
    );
    println!("  vTPM            {}", vm.vtpm);
    println!("  snapshots       {}", vm.snapshots);
    println!("  change tracking {}", vm.change_tracking);
    println!("\n  DISK  BUS   CAPACITY    THIN   MODE        FILE");
    for d in &vm.disks {
        println!(
            "  {:<5} {:<5} {:>8} MiB {:<6} {:<11} {}{}",
            d.key,
            d.bus,
            d.capacity_bytes >> 20,
            d.thin,
            d.disk_mode,
            d.file,
            if d.parents.is_empty() {
                String::new()
            } else {
                format!(" (snapshot chain of {})", d.parents.len())
            }
        );
    }
    println!("\n  NIC   MODEL     MAC                NETWORK");
    for n in &vm.nics {
        println!("  {:<5} {:<9} {:<18} {}", n.key, n.model, n.mac, n.network);
    }
    let reported = &vm.guest_network;
    if reported.reported() {
        println!("\n  GUEST ADDRESSES (VMware Tools)");
        for nic in &reported.nics {
            for a in &nic.addresses {
                println!(
                    "  {:<18} {}/{} {}",
                    nic.mac, a.address, a.prefix_length, a.origin
                );
            }
        }
        for g in &reported.default_gateways {
            println!("  default gateway    {}", g.address);
        }
        if !reported.dns_servers.is_empty() {
            println!("  DNS                {}", reported.dns_servers.join(", "));
        }
    }
}
