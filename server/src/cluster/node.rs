//! This node in cluster mode: its name, its etcd connection (made when first needed, again
//! after a failure), the token bucket in front of its etcd calls, whether etcd answers, the
//! pools it read, and the heartbeat that says its daemon runs.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::etcd::{ClusterError, ClusterStore, PoolSpec, Tls};
use crate::config::ClusterSettings;
use crate::metrics::Metrics;
use crate::pool::TokenBucket;

/// How often the heartbeat's `seen` key is rewritten (release-node reads it).
pub const SEEN_EVERY: Duration = Duration::from_secs(60);

pub struct ClusterNode {
    name: String,
    settings: ClusterSettings,
    tls: Option<Tls>,
    conn: tokio::sync::Mutex<Option<ClusterStore>>,
    bucket: Mutex<TokenBucket>,
    started: Instant,
    /// Since when, and why, etcd does not answer (None: the last call succeeded).
    down: Mutex<Option<(Instant, String)>>,
    pools: Mutex<HashMap<String, PoolSpec>>,
    metrics: Arc<Metrics>,
}

impl ClusterNode {
    /// Reads the TLS files (an unreadable one is an error now, not at the first claim).
    pub fn new(
        settings: ClusterSettings,
        name: String,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<ClusterNode>, String> {
        settings.validate()?;
        ipool_proto::names::check_name("node name", &name)?;
        let tls = Tls::read(
            settings.ca_file.as_deref(),
            settings
                .cert_file
                .as_deref()
                .zip(settings.key_file.as_deref()),
        )?;
        let tls = settings
            .etcd_endpoints
            .iter()
            .any(|e| e.starts_with("https://"))
            .then_some(tls);
        Ok(Arc::new(ClusterNode {
            bucket: Mutex::new(TokenBucket::new(settings.etcd_rate, settings.etcd_burst, 0)),
            name,
            settings,
            tls,
            conn: tokio::sync::Mutex::new(None),
            started: Instant::now(),
            down: Mutex::new(None),
            pools: Mutex::default(),
            metrics,
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// One token for an etcd call, if the bucket has one now.
    pub fn try_call(&self) -> bool {
        let now = self.started.elapsed().as_millis() as u64;
        self.bucket
            .lock()
            .expect("bucket lock")
            .try_take(now)
            .is_ok()
    }

    async fn store(&self) -> Result<ClusterStore, ClusterError> {
        let mut conn = self.conn.lock().await;
        if let Some(s) = conn.as_ref() {
            return Ok(s.clone());
        }
        let s = ClusterStore::connect(
            &self.settings.etcd_endpoints,
            &self.settings.prefix,
            Duration::from_millis(self.settings.etcd_timeout_ms),
            self.tls.as_ref(),
        )
        .await?;
        *conn = Some(s.clone());
        Ok(s)
    }

    /// Runs `f` against etcd: timed (`op`), and etcd counted up or down by its outcome.
    pub async fn call<T, F, Fut>(&self, op: &str, f: F) -> Result<T, ClusterError>
    where
        F: FnOnce(ClusterStore) -> Fut,
        Fut: Future<Output = Result<T, ClusterError>>,
    {
        let t = Instant::now();
        let r = match self.store().await {
            Ok(s) => f(s).await,
            Err(e) => Err(e),
        };
        let reached = !matches!(&r, Err(e) if e.is_unreachable());
        self.metrics.cluster.etcd_call(op, t.elapsed(), reached);
        let mut down = self.down.lock().expect("down lock");
        match (&r, reached) {
            (Err(e), false) => {
                if down.is_none() {
                    tracing::warn!(node = %self.name, error = %e, "etcd does not answer: serving the blocks this node owns, claiming none until it does");
                    *down = Some((Instant::now(), e.to_string()));
                }
            }
            _ => {
                if let Some((since, _)) = down.take() {
                    tracing::info!(node = %self.name, after_secs = since.elapsed().as_secs(), "etcd answers again");
                }
            }
        }
        r
    }

    /// Why this node is degraded (etcd unreachable), if it is.
    pub fn degraded(&self) -> Option<String> {
        self.down
            .lock()
            .expect("down lock")
            .as_ref()
            .map(|(since, why)| {
                format!(
                    "etcd unreachable for {} s ({why}): serving owned blocks only",
                    since.elapsed().as_secs()
                )
            })
    }

    /// Pool `name` as last read from etcd (read now if never).
    pub async fn pool(&self, name: &str) -> Result<Option<PoolSpec>, ClusterError> {
        if let Some(p) = self.pools.lock().expect("pools lock").get(name) {
            return Ok(Some(p.clone()));
        }
        self.read_pool(name).await
    }

    /// Pool `name`, read from etcd now (and kept).
    pub async fn read_pool(&self, name: &str) -> Result<Option<PoolSpec>, ClusterError> {
        let name_owned = name.to_string();
        let spec = self
            .call("get_pool", |s| async move { s.get_pool(&name_owned).await })
            .await?;
        let mut pools = self.pools.lock().expect("pools lock");
        match &spec {
            Some(p) => pools.insert(name.to_string(), p.clone()),
            None => pools.remove(name),
        };
        Ok(spec)
    }

    /// Keeps this node's heartbeat: a key on a lease kept alive while the daemon runs, and a
    /// `seen` time rewritten every [`SEEN_EVERY`]. Runs until aborted; etcd failures are
    /// retried (a new lease once etcd answers again).
    pub async fn heartbeat(self: Arc<Self>) {
        let ttl = self.settings.heartbeat_ttl_secs;
        let mut wait = Duration::from_secs(1);
        loop {
            let node = self.name.clone();
            let lease = self
                .call("heartbeat", |s| async move {
                    s.start_heartbeat(&node, ttl).await
                })
                .await;
            match lease {
                Ok(mut beat) => {
                    wait = Duration::from_secs(1);
                    let every = Duration::from_secs(ttl / 3).max(Duration::from_secs(1));
                    let mut last_seen = Instant::now();
                    loop {
                        tokio::time::sleep(every).await;
                        let seen = last_seen.elapsed() >= SEEN_EVERY;
                        let r = self
                            .call("heartbeat", |_| async { beat.renew(seen).await })
                            .await;
                        if let Err(e) = r {
                            tracing::warn!(node = %self.name, error = %e, "heartbeat lost; starting a new one");
                            break;
                        }
                        if seen {
                            last_seen = Instant::now();
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(node = %self.name, error = %e, "cannot start the heartbeat; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}
