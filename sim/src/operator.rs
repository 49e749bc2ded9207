//! The operator's pool commands, through the store as `ipoolctl cluster pool` runs them: the
//! pool deleted (refused while a block of it is owned, and then as it was), made anew with the
//! other block size once it is gone, and spare pools of other block sizes made and deleted.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ipool_server::cluster::datastore::Store;
use ipool_server::cluster::etcd::client::Limiter;

use crate::net::OPERATOR;
use crate::world::{OpDone, World};
use crate::{StoreKind, POOL};

impl World {
    /// A store connection of the operator's own, looking for the nodes' names where the
    /// daemons keep them or (`elsewhere`) where they do not (another Lease namespace, another
    /// etcd prefix: an operator's slip).
    pub(crate) fn operator_store_elsewhere(
        &self,
        elsewhere: bool,
    ) -> futures::future::BoxFuture<'static, Result<Store, String>> {
        let conn = crate::daemon::connector(
            self.opts.store,
            self.net.clone(),
            OPERATOR,
            Arc::new(AtomicBool::new(true)),
        );
        let mut settings = self.setting.config("operator").cluster.expect("[cluster]");
        if elsewhere {
            match self.opts.store {
                StoreKind::Etcd => settings.prefix = "/elsewhere".into(),
                StoreKind::Kube => settings.lease_namespace = "elsewhere".into(),
            }
        }
        let limiter = Arc::new(Limiter::new(1000.0, 1000));
        Box::pin(async move {
            conn(&settings, None, &limiter)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// A pool command (one operator command at a time).
pub(crate) fn pool_op(w: &mut World) {
    if w.op.is_some() {
        return;
    }
    let kind = w.choices.pick(3);
    let other_size = match w.opts.block_v4() {
        28 => 27,
        _ => 28,
    };
    let (what, spec) = match kind {
        0 => (format!("pool delete {POOL}"), None),
        1 => (
            format!("pool create {POOL} (block size /{other_size}, if it is gone)"),
            Some(w.opts.pool(other_size)),
        ),
        _ => {
            let mut spare = w.opts.pool(27);
            spare.name = "spare".into();
            spare.cidrs = vec!["10.81.0.0/24".parse().expect("a CIDR")];
            ("pool create spare, then delete it".to_string(), Some(spare))
        }
    };
    w.note(format!("operator: {what}"));
    w.op = Some(crate::world::Op {
        forced: false,
        release_of: None,
    });
    let (store, ops) = (w.operator_store_elsewhere(false), w.ops.clone());
    tokio::spawn(async move {
        let result = match store.await {
            Err(e) => Err(e),
            Ok(s) => {
                let r = match (kind, spec) {
                    (0, _) => s.delete_pool(POOL).await.map(|()| "deleted".to_string()),
                    (1, Some(spec)) => match s.get_pool(POOL).await {
                        Ok(Some(_)) => Ok("it stands: nothing done".to_string()),
                        Ok(None) => s.create_pool(&spec).await.map(|()| "created".into()),
                        Err(e) => Err(e),
                    },
                    (_, Some(spec)) => match s.create_pool(&spec).await {
                        Ok(()) => s
                            .delete_pool(&spec.name)
                            .await
                            .map(|()| "created and deleted".to_string()),
                        Err(e) => Err(e),
                    },
                    _ => Ok(String::new()),
                };
                r.map_err(|e| e.to_string())
            }
        };
        ops.lock().expect("ops").push(OpDone { what, result });
    });
}
