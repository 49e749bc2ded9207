//! A real containerd (Debian's) for the tests, with its CRI plugin on a socket of the test's
//! own: its root, state and sockets in a temporary directory, the native snapshotter (no
//! overlay inside overlay), and a sandbox ("pause") image made here (a static C program,
//! built into an image by podman and imported with ctr: no registry is reached). Sandboxes are
//! run, stopped and listed through the CRI, as the kubelet does. Needs root, containerd, ctr,
//! podman and gcc.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipool_proto::cri::runtime_service_client::RuntimeServiceClient;
use ipool_proto::cri::*;
use tonic::transport::{Channel, Endpoint, Uri};

/// The sandbox image's name.
pub const PAUSE: &str = "localhost/ipool-pause:test";

const PAUSE_C: &str = "#include <signal.h>\n#include <unistd.h>\nstatic void done(int s) { (void)s; _exit(0); }\nint main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }\n";

/// What a machine needs for these tests; None when it has it all.
pub fn missing() -> Option<String> {
    if !super::is_root() {
        return Some("root".into());
    }
    for bin in ["containerd", "ctr", "podman", "gcc", "runc"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).exists()))
            .unwrap_or(false);
        if !found {
            return Some(bin.into());
        }
    }
    None
}

pub struct Containerd {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    child: Option<Child>,
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pause image as a docker archive in `dir`.
fn pause_image(dir: &Path) -> PathBuf {
    let ctx = dir.join("pause");
    std::fs::create_dir_all(&ctx).expect("mkdir");
    std::fs::write(ctx.join("pause.c"), PAUSE_C).expect("write pause.c");
    run(
        Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(ctx.join("pause"))
            .arg(ctx.join("pause.c")),
        "gcc -static pause.c",
    );
    std::fs::write(
        ctx.join("Containerfile"),
        "FROM scratch\nCOPY pause /pause\nENTRYPOINT [\"/pause\"]\n",
    )
    .expect("write Containerfile");
    run(
        Command::new("podman")
            .args(["build", "-q", "-t", PAUSE])
            .arg(&ctx),
        "podman build (the pause image)",
    );
    let archive = dir.join("pause.tar");
    run(
        Command::new("podman")
            .args(["save", "--format", "docker-archive", "-o"])
            .arg(&archive)
            .arg(PAUSE),
        "podman save",
    );
    archive
}

impl Containerd {
    /// Starts containerd and imports the pause image into its `k8s.io` namespace.
    pub fn start() -> Containerd {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("containerd.sock");
        let d = dir.path().display();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = "{d}/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  # Inside a container (CI's machines): the sandbox's oom_score_adj (-998) no lower than
  # containerd's own, which an unprivileged parent could not set.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni-bin"
    conf_dir = "{d}/cni-conf"
"#
        );
        std::fs::write(dir.path().join("config.toml"), config).expect("write config");
        let log = std::fs::File::create(dir.path().join("containerd.log")).expect("log");
        let mut c = Containerd {
            socket,
            child: None,
            dir,
        };
        c.child = Some(
            Command::new("containerd")
                .arg("--config")
                .arg(c.dir.path().join("config.toml"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn containerd"),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "containerd did not start:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let archive = pause_image(c.dir.path());
        run(
            Command::new("ctr")
                .arg("--address")
                .arg(&c.socket)
                .args([
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--snapshotter",
                    "native",
                ])
                .arg(&archive),
            "ctr images import",
        );
        c
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Freezes containerd (SIGSTOP: its socket takes connections and answers nothing), or
    /// thaws it (SIGCONT).
    pub fn freeze(&self, frozen: bool) {
        if let Some(c) = &self.child {
            let sig = if frozen { "-STOP" } else { "-CONT" };
            run(
                Command::new("kill").arg(sig).arg(c.id().to_string()),
                "kill -STOP/-CONT containerd",
            );
        }
    }

    /// Stops containerd (SIGKILL): its socket answers no more.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    async fn client(&self) -> RuntimeServiceClient<Channel> {
        let path = self.socket.clone();
        let ch = Endpoint::from_static("http://cri.invalid")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                }
            }))
            .await
            .expect("connect to containerd's CRI");
        RuntimeServiceClient::new(ch)
    }

    /// Runs a sandbox of pod `namespace/name` (`uid`) on the host's network, as the kubelet
    /// asks for one; its id.
    pub fn run_sandbox(&self, namespace: &str, name: &str, uid: &str) -> String {
        self.block_on(async {
            let mut c = self.client().await;
            let config = PodSandboxConfig {
                metadata: Some(PodSandboxMetadata {
                    name: name.into(),
                    uid: uid.into(),
                    namespace: namespace.into(),
                    attempt: 0,
                }),
                hostname: String::new(),
                log_directory: self.dir.path().join("logs").display().to_string(),
                labels: [
                    ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
                    ("io.kubernetes.pod.name".to_string(), name.to_string()),
                    (
                        "io.kubernetes.pod.namespace".to_string(),
                        namespace.to_string(),
                    ),
                ]
                .into(),
                annotations: Default::default(),
                linux: Some(LinuxPodSandboxConfig {
                    cgroup_parent: String::new(),
                    security_context: Some(LinuxSandboxSecurityContext {
                        namespace_options: Some(NamespaceOption {
                            network: NamespaceMode::Node as i32,
                            pid: NamespaceMode::Pod as i32,
                            ipc: NamespaceMode::Pod as i32,
                        }),
                    }),
                }),
            };
            let r = c
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
                .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", self.log()));
            r.into_inner().pod_sandbox_id
        })
    }

    pub fn stop_sandbox(&self, id: &str) {
        self.block_on(async {
            let mut c = self.client().await;
            c.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .expect("StopPodSandbox");
            c.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .expect("RemovePodSandbox");
        })
    }

    /// The ready sandboxes' pod UIDs.
    pub fn ready(&self) -> Vec<String> {
        self.block_on(async {
            let mut c = self.client().await;
            let r = c
                .list_pod_sandbox(ListPodSandboxRequest { filter: None })
                .await
                .expect("ListPodSandbox")
                .into_inner();
            r.items
                .iter()
                .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
                .filter_map(|s| s.metadata.as_ref().map(|m| m.uid.clone()))
                .collect()
        })
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Its sandboxes' shims outlive it: stop them first, then containerd.
        if self.child.is_some() {
            self.freeze(false);
            let ids: Vec<String> = self.block_on(async {
                let mut c = self.client().await;
                c.list_pod_sandbox(ListPodSandboxRequest { filter: None })
                    .await
                    .map(|r| r.into_inner().items.into_iter().map(|s| s.id).collect())
                    .unwrap_or_default()
            });
            for id in ids {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.stop_sandbox(&id)
                }));
            }
        }
        self.kill();
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.path().join("state"))
            .stderr(Stdio::null())
            .status();
    }
}
