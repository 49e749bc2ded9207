//! The daemon's Unix socket and its gRPC server.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::ipam::{spawn_maintenance, Ipam};
use crate::service::{CniServer, CniService, OpsServer, OpsService};

/// Longest a single call may run on the server (a client usually gives up sooner).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Binds the daemon's socket: creates its directory, refuses to take over the socket of a
/// daemon that still answers, removes a stale one, and makes it owner-only (0600).
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves the `Cni` and `Ops` services on `listener` until `shutdown` completes; runs the pool
/// maintenance loop meanwhile. The caller recovers `ipam` before (so no call is accepted
/// before the state is rebuilt) and owns the listener (so tests can use a temp socket).
pub async fn run(
    listener: UnixListener,
    ipam: Ipam,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let maintenance = AbortOnDrop(spawn_maintenance(ipam.clone()));
    let result = tonic::transport::Server::builder()
        .timeout(CALL_TIMEOUT)
        .add_service(CniServer::new(CniService::new(ipam.clone())))
        .add_service(OpsServer::new(OpsService::new(ipam)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
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

/// Completes on SIGTERM (what Kubernetes sends) or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
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
