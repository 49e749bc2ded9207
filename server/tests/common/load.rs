//! What the daemons cost their store, counted at the store (`ipool_testkit::load`): the fake
//! apiserver's requests, or a real etcd's own counters.
#![allow(dead_code)]

use super::backend::Backend;
pub use ipool_testkit::load::Load;

impl Backend {
    /// The store's counts so far.
    pub fn load(&self) -> Load {
        match self {
            Backend::Kube { api, .. } => api.load(),
            Backend::Etcd(e) => {
                let url = e.lock().unwrap().client_url.clone();
                let (_, body) = super::http_get(url.trim_start_matches("http://"), "/metrics");
                Load::of_etcd_metrics(&body)
            }
        }
    }
}
