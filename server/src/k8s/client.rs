//! The Kubernetes client: in a pod, the service account's in-cluster config; else
//! `--kubeconfig` (or `KUBECONFIG`, `~/.kube/config`).

use std::path::Path;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// A client for the cluster: from `kubeconfig` when given, else inferred (in-cluster first).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        // In a pod: the service account, whatever KUBECONFIG says.
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => Config::incluster()
            .context("the in-cluster config (the pod's service account)")?,
        None => Config::infer().await.context(
            "no Kubernetes config: not in a pod (KUBERNETES_SERVICE_HOST unset) and no --kubeconfig, KUBECONFIG or ~/.kube/config",
        )?,
    };
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).context("making the Kubernetes client")?;
    tracing::info!(apiserver = %server, "Kubernetes client ready");
    Ok(client)
}
