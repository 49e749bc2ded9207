//! The store `[cluster] datastore` names, connected: etcd's [`EtcdStore`] or the Kubernetes
//! API's [`KubeStore`], as a [`StoreHandle`]; or whatever a [`Connector`] makes (the simulation's
//! stores on its in-memory etcd and apiserver).

use std::sync::Arc;
use std::time::Duration;

use super::datastore::StoreHandle;
use super::etcd::{EtcdStore, Tls};
use super::kube::KubeStore;
use super::limiter::Limiter;
use super::vocab::ClusterError;
use crate::config::cluster::{ClusterSettings, DatastoreKind};

/// The store `settings` name, its requests through `limiter`; each bounded by
/// `store_timeout_ms`.
pub async fn connect(
    settings: &ClusterSettings,
    tls: Option<&Tls>,
    limiter: &Arc<Limiter>,
) -> Result<StoreHandle, ClusterError> {
    let timeout = Duration::from_millis(settings.store_timeout_ms);
    Ok(match settings.datastore {
        DatastoreKind::Etcd => Arc::new(
            EtcdStore::connect_limited(
                &settings.etcd_endpoints,
                &settings.prefix,
                timeout,
                tls,
                Some(limiter.clone()),
            )
            .await?,
        ),
        DatastoreKind::Kubernetes => {
            // No answer within the timeout fails the call, as etcd's.
            let client = crate::k8s::client(settings.kubeconfig.as_deref(), timeout)
                .await
                .map_err(|e| ClusterError::Refused(format!("{e:#}")))?;
            // The watches wait for minutes: a client of their own, with a deadline to match.
            let read = super::kube::WATCH_READ_TIMEOUT;
            let watches = crate::k8s::client(settings.kubeconfig.as_deref(), read)
                .await
                .map_err(|e| ClusterError::Refused(format!("{e:#}")))?;
            Arc::new(
                KubeStore::connect(
                    client,
                    &settings.lease_namespace,
                    Some(limiter.clone()),
                    super::kube::FIELD_MANAGER,
                )
                .await?
                .with_watch_client(watches, read),
            )
        }
    })
}

/// Makes a node's store connection (when first needed, again after a failure): [`connect`],
/// unless a test or the simulation gives another.
pub type Connector = Arc<
    dyn Fn(
            &ClusterSettings,
            Option<&Tls>,
            &Arc<Limiter>,
        ) -> futures::future::BoxFuture<'static, Result<StoreHandle, ClusterError>>
        + Send
        + Sync,
>;

/// The connector of a daemon: [`connect`].
pub fn connector() -> Connector {
    Arc::new(|settings, tls, limiter| {
        let (settings, tls, limiter) = (settings.clone(), tls.cloned(), limiter.clone());
        Box::pin(async move { connect(&settings, tls.as_ref(), &limiter).await })
    })
}
