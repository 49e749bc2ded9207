//! The correctness check: which address each live attachment of a network holds. An ADD that
//! returns an address another live attachment holds is a duplicate, and the benchmark stops.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{bail, Result};

#[derive(Default)]
struct Inner {
    /// address -> container ID
    by_addr: HashMap<String, String>,
    /// container ID -> addresses
    by_container: HashMap<String, Vec<String>>,
}

/// Live attachments of one network of one plugin.
pub struct Live {
    what: String,
    inner: Mutex<Inner>,
}

impl Live {
    /// `what` names the plugin and network in error messages.
    pub fn new(what: impl Into<String>) -> Live {
        Live {
            what: what.into(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Records that `container` now holds `addrs` (without prefix length); an address some
    /// other live container holds is an error.
    pub fn added(&self, container: &str, addrs: &[String]) -> Result<()> {
        if addrs.is_empty() {
            bail!("{}: ADD for {container} returned no address", self.what);
        }
        let mut m = self.inner.lock().expect("live-set mutex poisoned");
        for a in addrs {
            if let Some(holder) = m.by_addr.get(a) {
                if holder != container {
                    bail!(
                        "{}: DUPLICATE ADDRESS: {a} was returned to {container} while {holder} still holds it",
                        self.what
                    );
                }
            }
        }
        for a in addrs {
            m.by_addr.insert(a.clone(), container.to_string());
        }
        m.by_container
            .entry(container.to_string())
            .or_default()
            .extend(addrs.iter().cloned());
        Ok(())
    }

    /// Forgets `container`'s addresses (called before its DEL runs, so that a concurrent ADD
    /// that gets an address the DEL just released is not taken for a duplicate).
    pub fn deleting(&self, container: &str) {
        let mut m = self.inner.lock().expect("live-set mutex poisoned");
        if let Some(addrs) = m.by_container.remove(container) {
            for a in addrs {
                m.by_addr.remove(&a);
            }
        }
    }

    /// The addresses `container` holds, if it is live.
    pub fn addresses_of(&self, container: &str) -> Option<Vec<String>> {
        self.inner
            .lock()
            .expect("live-set mutex poisoned")
            .by_container
            .get(container)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .expect("live-set mutex poisoned")
            .by_container
            .len()
    }
}

/// "10.96.0.2/16" -> "10.96.0.2".
pub fn strip_prefix_len(addr: &str) -> String {
    addr.split('/').next().unwrap_or(addr).to_string()
}
