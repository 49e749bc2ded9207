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

impl Runtime {
    pub fn new(path: PathBuf, timeout: Duration) -> Runtime {
        Runtime {
            path,
            timeout,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// The runtime `[kubernetes] cri_socket` names: "" none; a path that one; unset the first
    /// well-known socket that exists (none: none).
    pub fn configured(setting: Option<&str>, timeout: Duration) -> Option<Runtime> {
        let path = match setting {
            Some("") => return None,
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(WELL_KNOWN.iter().find(|p| Path::new(p).exists())?),
        };
        Some(Runtime::new(path, timeout))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn connect(&self) -> Result<RuntimeServiceClient<Channel>, String> {
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
            .map_err(|e| format!("connecting to {}: {e}", self.path.display()))?;
        let c = RuntimeServiceClient::new(channel);
        *client = Some(c.clone());
        Ok(c)
    }

    /// Whether the runtime runs a ready sandbox of `pod` (its UID; by namespace and name where
    /// the runtime gave no UID). Err: it did not answer (nothing may be let go on that).
    pub async fn sandbox_ready(&self, pod: &crate::model::Pod) -> Result<bool, String> {
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
                return Err(format!("{}: {}", self.path.display(), status.message()));
            }
            Err(_) => {
                *self.client.lock().await = None;
                return Err(format!(
                    "{}: no answer within {:?}",
                    self.path.display(),
                    self.timeout
                ));
            }
        };
        let uid = pod.uid.as_str();
        Ok(listed.items.iter().any(|s| {
            let m = s.metadata.clone().unwrap_or_default();
            let same = match uid {
                "" => m.namespace == pod.namespace && m.name == pod.name,
                _ => m.uid == uid || s.labels.get(UID_LABEL).is_some_and(|u| u == uid),
            };
            s.state == PodSandboxState::SandboxReady as i32 && same
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_asked_is_the_configs_or_a_well_known_one_and_empty_turns_it_off() {
        let t = Duration::from_secs(1);
        assert!(Runtime::configured(Some(""), t).is_none());
        let r = Runtime::configured(Some("/x/cri.sock"), t).expect("named");
        assert_eq!(r.path(), Path::new("/x/cri.sock"));
        let found = WELL_KNOWN.iter().find(|p| Path::new(p).exists());
        match (Runtime::configured(None, t), found) {
            (Some(r), Some(p)) => assert_eq!(r.path(), Path::new(p)),
            (None, None) => {}
            (r, f) => panic!("{:?} against {f:?}", r.map(|r| r.path().to_path_buf())),
        }
    }

    #[test]
    fn a_runtime_that_is_not_there_does_not_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = Runtime::new(dir.path().join("none.sock"), Duration::from_millis(200));
        let pod = crate::model::Pod {
            namespace: "app".into(),
            name: "a".into(),
            uid: "u".into(),
        };
        let e = rt.block_on(r.sandbox_ready(&pod)).expect_err("no answer");
        assert!(e.contains("none.sock"), "{e}");
    }
}
