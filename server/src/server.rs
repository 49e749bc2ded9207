//! The daemon's Unix socket and its gRPC server.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tower::limit::GlobalConcurrencyLimitLayer;

use crate::ipam::{spawn_maintenance, Ipam};
use crate::service::{Access, CniServer, CniService, OpsServer, OpsService};
use crate::tcp_guard;

/// Longest a single call may run on the server (a client usually gives up sooner).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Binds the daemon's socket: creates its directory, refuses to take over the socket of a
/// daemon that still answers, removes a stale one, and makes it owner-only (0600), or with
/// `group` that group's too (0660).
pub fn bind_socket(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            // 0755 whatever the umask (ipoold's is 077): the socket itself is owner-only.
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{} is served by a running process (another ipoold?)",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to remove it",
                    path.display()
                ),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Most calls one listener serves at once (further ones wait their turn).
const MAX_IN_FLIGHT: usize = 1024;
/// Largest request accepted (a CNI config is a few KiB).
const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// Where the daemon serves.
pub struct Listeners {
    /// The Unix socket: `Cni`, `Ops` (everything allowed: the socket is root-only), health,
    /// reflection.
    pub socket: UnixListener,
    /// Besides root, the uid allowed on the CNI service and mutating Ops calls (the daemon's
    /// own).
    pub own_uid: Option<u32>,
    /// `--socket-group`: the socket's group (mode 0660), allowed mutating Ops calls.
    pub group: Option<u32>,
    /// `--ops-listen`: `Ops`, health and reflection over TCP.
    pub ops_tcp: Option<OpsTcp>,
    /// `--metrics-listen`: Prometheus `/metrics` over HTTP.
    pub metrics: Option<TcpListener>,
    /// The pods of this node (with `[kubernetes]`): ADDs of pods take their metadata.
    pub pods: Option<crate::k8s::Pods>,
    /// Cluster mode is on: `/metrics` carries its numbers.
    pub cluster: bool,
    /// Cluster mode's pins of this node's pods (fixed addresses).
    pub holds: Option<crate::cluster::pin::hold::Holds>,
}

pub struct OpsTcp {
    /// Bound (not yet registered with a runtime: the listener runs on a thread of its own).
    pub listener: std::net::TcpListener,
    pub token: Option<Arc<str>>,
    /// With a client CA: mutual TLS, every connection authenticated.
    pub tls: Option<ServerTlsConfig>,
    pub mtls: bool,
}

/// Serves the `Cni` and `Ops` services on `listener` until `shutdown` completes; runs the pool
/// maintenance loop meanwhile. The caller recovers `ipam` before (so no call is accepted
/// before the state is rebuilt) and owns the listener (so tests can use a temp socket).
pub async fn run(
    listener: UnixListener,
    ipam: Ipam,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    serve(
        Listeners {
            socket: listener,
            own_uid: None,
            group: None,
            ops_tcp: None,
            metrics: None,
            pods: None,
            cluster: false,
            holds: None,
        },
        ipam,
        shutdown,
    )
    .await
}

/// Serves every listener until `shutdown` completes.
pub async fn serve(
    l: Listeners,
    ipam: Ipam,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let maintenance = AbortOnDrop(spawn_maintenance(ipam.clone()));

    // Health: SERVING now that recovery is done; NOT_SERVING while every network is drained
    // or the store has failed (until it is reopened).
    let (reporter, health) = tonic_health::server::health_reporter();
    let health_task = {
        let mut watched = ipam.health();
        AbortOnDrop(tokio::spawn(async move {
            loop {
                let status = if watched.borrow_and_update().serving() {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                for name in ["", "ipool.v1.Cni", "ipool.v1.Ops"] {
                    reporter.set_service_status(name, status).await;
                }
                if watched.changed().await.is_err() {
                    return;
                }
            }
        }))
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ipool_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor sets are valid");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_metrics = stop_rx.clone();
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let uds = Server::builder()
        .timeout(CALL_TIMEOUT)
        .layer(GlobalConcurrencyLimitLayer::new(MAX_IN_FLIGHT))
        .add_service(
            CniServer::new(CniService::new(
                ipam.clone(),
                l.own_uid,
                l.pods.clone(),
                l.holds.clone(),
            ))
            .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            OpsServer::new(OpsService::new(
                ipam.clone(),
                Access::Local {
                    own_uid: l.own_uid,
                    group: l.group,
                },
            ))
            .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(health.clone())
        .add_service(reflection.clone())
        .serve_with_incoming_shutdown(UnixListenerStream::new(l.socket), stopped(stop_rx.clone()));
    let tcp = async {
        let Some(t) = l.ops_tcp else {
            return Ok(());
        };
        let mut b = Server::builder();
        if let Some(tls) = t.tls {
            b = b.tls_config(tls)?;
        }
        let router = b
            .timeout(CALL_TIMEOUT)
            .http2_keepalive_interval(Some(tcp_guard::PING_EVERY))
            .http2_keepalive_timeout(Some(tcp_guard::IDLE))
            .max_concurrent_streams(Some(tcp_guard::MAX_STREAMS))
            .layer(GlobalConcurrencyLimitLayer::new(MAX_IN_FLIGHT))
            .add_service(
                OpsServer::new(OpsService::new(
                    ipam.clone(),
                    Access::Tcp {
                        token: t.token,
                        mtls: t.mtls,
                    },
                ))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            )
            .add_service(health)
            .add_service(reflection);
        // On a thread and runtime of its own: what TCP callers cost never runs on the thread
        // that serves the CNI calls.
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let listener = t.listener;
        let spawned = std::thread::Builder::new()
            .name("ipool-ops-tcp".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the TCP Ops runtime; the Ops API is served on the Unix socket only");
                        return;
                    }
                };
                let served = rt.block_on(async move {
                    let incoming = tcp_guard::incoming(
                        listener,
                        tcp_guard::MAX_TCP_CONNECTIONS,
                        tcp_guard::IDLE,
                    );
                    router
                        .serve_with_incoming_shutdown(incoming, stopped(stop_rx))
                        .await
                });
                let _ = done_tx.send(served);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the TCP Ops thread; the Ops API is served on the Unix socket only");
            return Ok(());
        }
        match done_rx.await {
            Ok(served) => served,
            Err(_) => {
                tracing::error!("the TCP Ops thread ended without a result (it panicked?); the Ops API is served on the Unix socket only");
                Ok(())
            }
        }
    };
    let metrics = async {
        if let Some(listener) = l.metrics {
            let registry = Arc::new(crate::exporter::registry(
                &ipam,
                l.pods.is_some(),
                l.cluster,
            ));
            crate::exporter::serve_metrics(listener, registry, stopped(stop_rx_metrics)).await;
        }
        Ok(())
    };
    let signal = async {
        shutdown.await;
        let _ = stop_tx.send(true);
        Ok(())
    };
    let result = tokio::try_join!(uds, tcp, metrics, signal).map(|_| ());
    drop(health_task);
    drop(maintenance);
    result
}

/// Stops a background task when the server stops, however it stops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Completes on SIGTERM (what Kubernetes sends) or SIGINT. The handlers are installed when
/// this is called, not when the future is first polled: call it before the socket is bound,
/// so that a SIGTERM as soon as the socket answers stops the daemon cleanly.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move { wait_for(term, int).await }
}

async fn wait_for(
    term: io::Result<tokio::signal::unix::Signal>,
    int: io::Result<tokio::signal::unix::Signal>,
) {
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = i.recv() => tracing::info!("SIGINT: shutting down"),
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await
        }
    }
}
