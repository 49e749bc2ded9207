//! The Kubernetes client: in a pod, the service account's in-cluster config; else
//! `--kubeconfig` (or `KUBECONFIG`, `~/.kube/config`). Every request has a read deadline (a
//! black-holed connection fails instead of hanging until TCP gives up); the watches are ended
//! by the apiserver before it ([`watch_config`]) and made again.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config};

/// A client for the cluster: from `kubeconfig` when given, else inferred (in-cluster first);
/// no answer for `read_timeout` fails a request.
pub async fn client(kubeconfig: Option<&Path>, read_timeout: Duration) -> anyhow::Result<Client> {
    let mut config = match kubeconfig {
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
    config.read_timeout = Some(read_timeout);
    // The deadline counts from the request, not from when its pooled connection went idle.
    config.reset_reader_on_write = true;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).context("making the Kubernetes client")?;
    tracing::info!(apiserver = %server, read_timeout_secs = read_timeout.as_secs(), "Kubernetes client ready");
    Ok(client)
}

/// A watch the apiserver ends before the client's read deadline (`read_timeout`) could: a quiet
/// watch is made again rather than failed.
pub fn watch_config(read_timeout: Duration) -> watcher::Config {
    let secs = read_timeout.as_secs().saturating_sub(5).max(1);
    watcher::Config::default().timeout(u32::try_from(secs).unwrap_or(u32::MAX))
}
