//! `greeting`: run the Greeting controller against the current kubeconfig (for example the lab's), or print
//! its CRD.

use kube::CustomResourceExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("crd") => {
            print!(
                "{}",
                serde_saphyr::to_string(&greeting::crd::Greeting::crd())?
            );
            Ok(())
        }
        None | Some("run") => {
            let client = kube::Client::try_default().await?;
            greeting::install_crd(&client).await?;
            tracing::info!("watching Greetings in every namespace; Ctrl-C stops");
            greeting::controller::run(client, None, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await;
            Ok(())
        }
        Some(other) => {
            anyhow::bail!("unknown command {other:?}; use `greeting [run]` or `greeting crd`")
        }
    }
}
