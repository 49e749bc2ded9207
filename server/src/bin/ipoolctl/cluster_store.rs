//! Which store `ipoolctl cluster` works on, and the connection to it: etcd (the --etcd-*
//! flags) or the Kubernetes API (`--datastore kubernetes`, --kubeconfig), or whatever an
//! ipoold config's `[cluster]` names (--config).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ipool_server::cluster::datastore::StoreHandle;
use ipool_server::cluster::etcd::{EtcdStore, Tls};
use ipool_server::cluster::kube::KubeStore;
use ipool_server::config::cluster::{DatastoreKind, DEFAULT_LEASE_NAMESPACE};

use crate::{EXIT_UNREACHABLE, EXIT_USAGE};

/// The store ipoolctl writes with (its field manager on the apiserver).
const FIELD_MANAGER: &str = "ipoolctl";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DatastoreArg {
    Etcd,
    Kubernetes,
}

/// Where the store is. Global to `cluster`'s subcommands: accepted after them too.
#[derive(clap::Args, Debug)]
pub(crate) struct StoreArgs {
    /// Take the store (and etcd's endpoints, TLS files and prefix, or the Lease namespace)
    /// from this ipoold config's `[cluster]`, as the daemon on the node does (in the
    /// DaemonSet: /etc/ipool/ipoold.toml), instead of the flags.
    #[arg(
        long,
        global = true,
        env = "IPOOL_CONFIG",
        conflicts_with_all = ["datastore", "etcd_endpoints", "etcd_prefix", "etcd_cacert", "etcd_cert", "etcd_key"]
    )]
    config: Option<PathBuf>,
    /// Where pools and blocks live: etcd, or the Kubernetes API (ipool.io custom resources).
    #[arg(long, global = true, env = "IPOOL_DATASTORE", value_enum)]
    datastore: Option<DatastoreArg>,
    /// The apiserver: --datastore kubernetes's store (default: KUBECONFIG, ~/.kube/config,
    /// or the pod's service account); with etcd, where `check` and `release-node
    /// --from-check` read the Nodes and pods (without it they are not read).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use (default: its current-context); the kubeconfig is then
    /// found as kubectl finds it (--kubeconfig, KUBECONFIG, ~/.kube/config), before the pod's
    /// service account.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Run as `kubectl ipool` (kubectl-ipool): the store is the Kubernetes API unless said
    /// otherwise, its kubeconfig found as kubectl finds it.
    #[arg(skip)]
    pub(crate) kubectl: bool,
    /// --datastore kubernetes: the namespace of the nodes' Leases.
    #[arg(long, global = true, default_value = DEFAULT_LEASE_NAMESPACE)]
    lease_namespace: String,
    /// etcd endpoints, comma-separated (http://10.0.0.1:2379,...); default
    /// http://127.0.0.1:2379.
    #[arg(
        long,
        global = true,
        env = "IPOOL_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    etcd_endpoints: Vec<String>,
    /// Key prefix of ipool's data in etcd; default /ipool/v1.
    #[arg(long, global = true, env = "IPOOL_ETCD_PREFIX")]
    etcd_prefix: Option<String>,
    /// Seconds a call to the store (etcd or the Kubernetes API) may take. `--etcd-timeout`,
    /// its old name, is still accepted (deprecated).
    #[arg(long, global = true, default_value_t = 5, alias = "etcd-timeout")]
    store_timeout: u64,
    /// The CA that signed etcd's server certificate (https endpoints).
    #[arg(long, global = true, env = "IPOOL_ETCD_CACERT")]
    etcd_cacert: Option<PathBuf>,
    /// A client certificate for etcd (with --etcd-key).
    #[arg(long, global = true, env = "IPOOL_ETCD_CERT", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// The client certificate's key (with --etcd-cert).
    #[arg(long, global = true, env = "IPOOL_ETCD_KEY", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
}

/// Where the store is, from the flags or from an ipoold config.
enum Target {
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
        cacert: Option<PathBuf>,
        cert_key: Option<(PathBuf, PathBuf)>,
        /// Where the Nodes and pods are read, if anywhere.
        kubeconfig: Option<PathBuf>,
    },
    Kube {
        kubeconfig: Option<PathBuf>,
        lease_namespace: String,
    },
}

impl StoreArgs {
    /// `[cluster] pin_ttl_secs` of the --config given, if one is (its default where the
    /// table leaves it out).
    pub(crate) fn config_pin_ttl(&self) -> Result<Option<u64>, String> {
        let Some(path) = &self.config else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
        let config = ipool_server::config::DaemonConfig::parse(&text)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
        Ok(config.cluster.map(|c| c.pin_ttl_secs))
    }

    fn resolve(&self) -> Result<Target, String> {
        let Some(path) = &self.config else {
            let kube = match self.datastore {
                Some(d) => d == DatastoreArg::Kubernetes,
                None => self.kubectl,
            };
            if kube {
                if !self.etcd_endpoints.is_empty() || self.etcd_cacert.is_some() {
                    return Err("--etcd-* flags are for --datastore etcd".into());
                }
                return Ok(Target::Kube {
                    kubeconfig: self.kubeconfig.clone(),
                    lease_namespace: self.lease_namespace.clone(),
                });
            }
            return Ok(Target::Etcd {
                endpoints: match self.etcd_endpoints.is_empty() {
                    true => vec!["http://127.0.0.1:2379".to_string()],
                    false => self.etcd_endpoints.clone(),
                },
                prefix: self
                    .etcd_prefix
                    .clone()
                    .unwrap_or_else(|| ipool_server::cluster::etcd::DEFAULT_PREFIX.to_string()),
                cacert: self.etcd_cacert.clone(),
                cert_key: self.etcd_cert.clone().zip(self.etcd_key.clone()),
                kubeconfig: self.kubeconfig.clone(),
            });
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
        let config = ipool_server::config::DaemonConfig::parse(&text)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
        let c = config
            .cluster
            .ok_or_else(|| format!("--config {}: no [cluster] table", path.display()))?;
        Ok(match c.datastore {
            DatastoreKind::Etcd => Target::Etcd {
                endpoints: c.etcd_endpoints,
                prefix: c.prefix,
                cacert: c.ca_file,
                cert_key: c.cert_file.zip(c.key_file),
                kubeconfig: self.kubeconfig.clone(),
            },
            DatastoreKind::Kubernetes => Target::Kube {
                kubeconfig: c.kubeconfig.or_else(|| self.kubeconfig.clone()),
                lease_namespace: c.lease_namespace,
            },
        })
    }
}

/// The store the flags name, connected, and what to call it in messages; else the exit code
/// (a bad flag: usage; no answer: unreachable).
pub(crate) async fn connect(args: &StoreArgs) -> Result<(StoreHandle, &'static str), ExitCode> {
    let fail = |msg: String, code: u8| {
        eprintln!("ipoolctl: {msg}");
        ExitCode::from(code)
    };
    let timeout = Duration::from_secs(args.store_timeout.max(1));
    match args.resolve().map_err(|e| fail(e, EXIT_USAGE))? {
        Target::Etcd {
            endpoints,
            prefix,
            cacert,
            cert_key,
            ..
        } => {
            for e in &endpoints {
                ipool_server::config::cluster::check_endpoint(e)
                    .map_err(|e| fail(format!("--etcd-endpoints: {e}"), EXIT_USAGE))?;
            }
            let tls = Tls::read(
                cacert.as_deref(),
                cert_key.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
            )
            .map_err(|e| fail(e.to_string(), EXIT_USAGE))?;
            let https = endpoints.iter().any(|e| e.starts_with("https://"));
            let store = EtcdStore::connect(&endpoints, &prefix, timeout, https.then_some(&tls))
                .await
                .map_err(|e| {
                    fail(
                        format!("cannot reach etcd at {}: {e}", endpoints.join(",")),
                        EXIT_UNREACHABLE,
                    )
                })?;
            Ok((Arc::new(store), "etcd"))
        }
        Target::Kube {
            kubeconfig,
            lease_namespace,
        } => {
            let (client, url) = args
                .kube_client(kubeconfig.as_deref(), timeout)
                .await
                .map_err(|e| fail(format!("{e:#}"), EXIT_USAGE))?;
            let store = KubeStore::connect(client, &lease_namespace, None, FIELD_MANAGER)
                .await
                .map_err(|e| {
                    let code = crate::cluster_out::exit_for(&e);
                    match &url {
                        Some(url) => fail(format!("the apiserver at {url}: {e}"), code),
                        None => fail(format!("the Kubernetes API: {e}"), code),
                    }
                })?;
            Ok((Arc::new(store), "the Kubernetes API"))
        }
    }
}

impl StoreArgs {
    /// A client of the apiserver `kubeconfig` names: found as kubectl finds it with
    /// `--context` or as `kubectl ipool`, else as ipoold finds it (in a pod, its service
    /// account first).
    /// With the apiserver's URL where kubectl's way found it (for messages).
    async fn kube_client(
        &self,
        kubeconfig: Option<&std::path::Path>,
        timeout: Duration,
    ) -> anyhow::Result<(kube::Client, Option<String>)> {
        match self.kubectl || self.context.is_some() {
            true => {
                let (client, url) =
                    ipool_server::k8s::kubectl_client(kubeconfig, self.context.as_deref(), timeout)
                        .await?;
                Ok((client, Some(url)))
            }
            false => Ok((ipool_server::k8s::client(kubeconfig, timeout).await?, None)),
        }
    }

    /// `--kubeconfig` given though the store is etcd: only for what reads the apiserver
    /// besides the store (`check`, `release-node --from-check`); elsewhere a slip (a forgotten
    /// `--datastore kubernetes`), refused rather than ignored.
    pub(crate) fn kubeconfig_beside_etcd(&self) -> bool {
        matches!(
            self.resolve(),
            Ok(Target::Etcd {
                kubeconfig: Some(_),
                ..
            })
        )
    }
}

/// The apiserver the flags name, for what `cluster check` reads of it (Nodes, pods): the
/// store's own on the Kubernetes API, `--kubeconfig`'s with etcd, else none.
pub(crate) async fn apiserver(args: &StoreArgs) -> Result<Option<kube::Client>, ExitCode> {
    let kubeconfig = match args.resolve() {
        Ok(Target::Kube { kubeconfig, .. }) => kubeconfig,
        Ok(Target::Etcd {
            kubeconfig: Some(k),
            ..
        }) => Some(k),
        Ok(Target::Etcd { .. }) => return Ok(None),
        Err(e) => {
            eprintln!("ipoolctl: {e}");
            return Err(ExitCode::from(EXIT_USAGE));
        }
    };
    let timeout = Duration::from_secs(args.store_timeout.max(1) * 6);
    match args.kube_client(kubeconfig.as_deref(), timeout).await {
        Ok((c, _)) => Ok(Some(c)),
        Err(e) => {
            eprintln!("ipoolctl: the apiserver: {e:#}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}
