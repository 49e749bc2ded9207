//! The Kubernetes client: in a pod, the service account's in-cluster config; else
//! `--kubeconfig` (or `KUBECONFIG`, `~/.kube/config`); for `kubectl ipool`, as kubectl finds
//! it ([`kubectl_client`]). Every request has a read deadline (a
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
    finish(config, read_timeout)
}

/// A client found as kubectl finds its cluster (`kubectl ipool`): `kubeconfig`, else the
/// files `KUBECONFIG` lists (merged, as kubectl merges them), else `~/.kube/config`, and only
/// without any of those the pod's service account; `context` names the kubeconfig's context
/// (default: its current-context). With the apiserver's URL, for messages.
pub async fn kubectl_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    read_timeout: Duration,
) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => match Config::from_kubeconfig(&options).await {
            Ok(c) => c,
            Err(e) if context.is_some() => {
                return Err(anyhow::Error::new(e).context(format!(
                    "--context {}: the kubeconfig (KUBECONFIG, or ~/.kube/config)",
                    context.unwrap_or_default()
                )))
            }
            Err(e) => Config::incluster().map_err(|_| {
                anyhow::Error::new(e).context(
                    "no Kubernetes config: no --kubeconfig, KUBECONFIG or ~/.kube/config, and not in a pod",
                )
            })?,
        },
    };
    let server = config.cluster_url.to_string();
    Ok((finish(config, read_timeout)?, server))
}

fn finish(mut config: Config, read_timeout: Duration) -> anyhow::Result<Client> {
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
