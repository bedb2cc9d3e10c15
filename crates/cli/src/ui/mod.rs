//! `ferry ui`: a local web dashboard of plans, migrations, ESXi hosts' disk slots and Events, served on this
//! machine with the user's own kubeconfig: no server in the cluster and no new rights. It only reads. What it
//! shows and how it looks is `ferry-ui` (pure); here are the watches that keep it current and the HTTP server.

mod cache;
mod server;

use std::io::Write;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Args;

use crate::views::Scope;

#[derive(Args)]
pub struct UiArgs {
    /// Where to serve, as IP:PORT (port 0: any free one). A loopback address only, unless --allow-remote.
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// Serve on an address other machines may reach. Whoever reaches it sees what your kubeconfig may read.
    #[arg(long)]
    allow_remote: bool,
    #[command(flatten)]
    scope: Scope,
}

pub async fn run(args: UiArgs) -> Result<()> {
    check_listen(args.listen, args.allow_remote)?;
    let (client, namespace) = args.scope.client().await?;
    let watched = (!args.scope.all_namespaces).then_some(namespace);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;
    let cache = cache::Cache::start(client, watched.clone());
    let scope = watched.map_or_else(
        || "every namespace".to_string(),
        |ns| format!("namespace {ns}"),
    );
    // The first line says where it serves (tests and scripts read it, with port 0 in particular).
    println!("ferry ui: serving http://{address}/ for {scope}; Ctrl-C stops it");
    std::io::stdout().flush()?;
    let app = server::router(cache, args.allow_remote);
    tokio::select! {
        served = axum::serve(listener, app) => served.context("serving the dashboard")?,
        _ = shutdown() => {}
    }
    Ok(())
}

/// Only loopback unless asked: the dashboard answers with what the user's credentials may read.
fn check_listen(address: SocketAddr, allow_remote: bool) -> Result<()> {
    if address.ip().is_loopback() || allow_remote {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to serve on {address}: it is not a loopback address, and the dashboard shows whoever reaches it \
         what your kubeconfig may read. Use --listen 127.0.0.1:PORT, or add --allow-remote to serve there anyway"
    )
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async {
        match terminate.as_mut() {
            Some(signal) => {
                signal.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = interrupt => {}
        _ = terminated => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_is_served_unless_remote_is_allowed() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(check_listen(at("127.0.0.1:8787"), false).is_ok());
        assert!(check_listen(at("127.0.0.2:0"), false).is_ok());
        assert!(check_listen(at("[::1]:8787"), false).is_ok());
        let refused = check_listen(at("0.0.0.0:8787"), false)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("not a loopback address") && refused.contains("--allow-remote"),
            "{refused}"
        );
        assert!(check_listen(at("192.0.2.10:8787"), false).is_err());
        assert!(check_listen(at("0.0.0.0:8787"), true).is_ok());
    }
}
