//! The node's container runtime, asked over its CRI socket (`[kubernetes] cri_socket`; by
//! default the first of containerd's and CRI-O's that exists): whether a pod's sandbox still
//! runs (`ListPodSandbox`, ready sandboxes, the pod's UID). The pod GC asks it before it lets
//! an address go, and a quarantine's end too: a sandbox the runtime still runs keeps its
//! address whatever the apiserver says (a pod force-deleted while its sandbox runs), and so
//! does a runtime that does not answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipool_proto::cri::runtime_service_client::RuntimeServiceClient;
use ipool_proto::cri::{
    ListPodSandboxRequest, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// Where containerd and CRI-O listen, in the order looked for.
pub const WELL_KNOWN: [&str; 2] = ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

/// The label the kubelet sets on a sandbox with its pod's UID.
const UID_LABEL: &str = "io.kubernetes.pod.uid";

/// A runtime's CRI socket, connected on first use (and again after a failure).
pub struct Runtime {
    path: PathBuf,
    timeout: Duration,
    client: tokio::sync::Mutex<Option<RuntimeServiceClient<Channel>>>,
}

/// The runtime did not answer the CRI (not reachable, an error, no answer in time): the
/// message names its socket.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CriUnanswered(pub String);

impl Runtime {
    pub fn new(path: PathBuf, timeout: Duration) -> Runtime {
        Runtime {
            path,
            timeout,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// The runtime `[kubernetes] cri_socket` names: "" none; a path that one (said at start
    /// when it does not answer: every address it is asked about is kept meanwhile); unset the
    /// first well-known socket that answers the CRI (a containerd without its CRI plugin,
    /// Docker Engine's, is passed over, and said).
    pub async fn configured(setting: Option<&str>, timeout: Duration) -> Option<Runtime> {
        match setting {
            Some("") => None,
            Some(p) => {
                let r = Runtime::new(PathBuf::from(p), timeout);
                if let Err(e) = r.answers().await {
                    tracing::warn!(socket = p, error = %e, "[kubernetes] cri_socket does not answer the CRI now: the pod GC keeps every address it would ask about until it does");
                }
                Some(r)
            }
            None => {
                for p in WELL_KNOWN.iter().filter(|p| Path::new(p).exists()) {
                    let r = Runtime::new(PathBuf::from(p), timeout);
                    match r.answers().await {
                        Ok(_) => return Some(r),
                        Err(e) => {
                            tracing::warn!(socket = p, error = %e, "a container runtime's socket that does not answer the CRI (its CRI plugin off?): not asked; set [kubernetes] cri_socket to the kubelet's runtime")
                        }
                    }
                }
                None
            }
        }
    }

    /// The runtime's name and version, if it answers the CRI.
    pub async fn answers(&self) -> Result<String, CriUnanswered> {
        let mut c = self.connect().await?;
        let req = ipool_proto::cri::VersionRequest {
            version: "v1".into(),
        };
        match tokio::time::timeout(self.timeout, c.version(req)).await {
            Ok(Ok(v)) => {
                let v = v.into_inner();
                Ok(format!("{} {}", v.runtime_name, v.runtime_version))
            }
            Ok(Err(status)) => {
                *self.client.lock().await = None;
                Err(CriUnanswered(format!(
                    "{}: {}",
                    self.path.display(),
                    status.message()
                )))
            }
            Err(_) => {
                *self.client.lock().await = None;
                Err(CriUnanswered(format!(
                    "{}: no answer within {:?}",
                    self.path.display(),
                    self.timeout
                )))
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn connect(&self) -> Result<RuntimeServiceClient<Channel>, CriUnanswered> {
        let mut client = self.client.lock().await;
        if let Some(c) = client.as_ref() {
            return Ok(c.clone());
        }
        let path = self.path.clone();
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                }
            }))
            .await
            .map_err(|e| CriUnanswered(format!("connecting to {}: {e}", self.path.display())))?;
        let c = RuntimeServiceClient::new(channel);
        *client = Some(c.clone());
        Ok(c)
    }

    /// The pods whose sandboxes the runtime runs, ready (one list). Err: it did not answer
    /// (nothing may be let go on that).
    pub async fn ready_sandboxes(&self) -> Result<Vec<SandboxPod>, CriUnanswered> {
        let mut c = self.connect().await?;
        let req = ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                state: Some(PodSandboxStateValue {
                    state: PodSandboxState::SandboxReady as i32,
                }),
                ..PodSandboxFilter::default()
            }),
        };
        let answer = tokio::time::timeout(self.timeout, c.list_pod_sandbox(req)).await;
        let listed = match answer {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => {
                *self.client.lock().await = None;
                return Err(CriUnanswered(format!(
                    "{}: {}",
                    self.path.display(),
                    status.message()
                )));
            }
            Err(_) => {
                *self.client.lock().await = None;
                return Err(CriUnanswered(format!(
                    "{}: no answer within {:?}",
                    self.path.display(),
                    self.timeout
                )));
            }
        };
        Ok(listed
            .items
            .into_iter()
            .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
            .map(|s| {
                let m = s.metadata.unwrap_or_default();
                SandboxPod {
                    uid: s.labels.get(UID_LABEL).cloned().unwrap_or(m.uid),
                    namespace: m.namespace,
                    name: m.name,
                }
            })
            .collect())
    }
}

/// The pod of a ready sandbox, as the runtime names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Whether `ready` has a sandbox of `pod`: by its UID, or by namespace and name where the pod
/// is known without one.
pub fn runs(ready: &[SandboxPod], pod: &crate::model::Pod) -> bool {
    ready.iter().any(|s| match pod.uid.as_str() {
        "" => s.namespace == pod.namespace && s.name == pod.name,
        uid => s.uid == uid,
    })
}

#[cfg(test)]
mod tests;
