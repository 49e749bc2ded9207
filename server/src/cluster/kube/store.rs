//! [`KubeStore`] as a [`Datastore`] (its parts: `pools`, `blocks`, `lease`).

use std::sync::Arc;

use super::KubeStore;
use crate::cluster::datastore::{Datastore, StoreHandle};

impl Datastore for KubeStore {
    fn urgent(&self) -> StoreHandle {
        Arc::new(KubeStore {
            urgent: true,
            ..self.clone()
        })
    }
    fn releasing(&self) -> StoreHandle {
        Arc::new(KubeStore {
            field_manager: super::RELEASE_MANAGER.into(),
            ..self.clone()
        })
    }
    /// A reset apiserver (etcd restored under it) is not detected: see docs/cluster-mode.md.
    fn resets(&self) -> (u64, Option<String>) {
        (0, None)
    }
}

#[cfg(test)]
mod tests;
