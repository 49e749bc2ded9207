//! "Allocations are valid until proven leaked" (Calico's rule): something is released only when
//! it was seen without what keeps it (its pod, its network namespace) at two checks at least a
//! grace apart; any check that finds it kept clears the suspicion, and so does its re-creation.
//! One tracker for both the pod GC and the leak check.

use std::collections::HashMap;
use std::hash::Hash;

use crate::model::Millis;

/// Things seen without what keeps them: -> (their creation time, when first seen so).
#[derive(Debug)]
pub struct Suspects<K> {
    seen: HashMap<K, (Millis, Millis)>,
}

impl<K> Default for Suspects<K> {
    fn default() -> Self {
        Suspects {
            seen: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> Suspects<K> {
    /// One check: `missing` is everything seen without what keeps it now (with its creation
    /// time); the rest is cleared. Returns each with when it was first seen so (now, the first
    /// time, or when it was created anew since).
    pub fn check(
        &mut self,
        missing: impl IntoIterator<Item = (K, Millis)>,
        now: Millis,
    ) -> Vec<(K, Millis, Millis)> {
        let mut next = HashMap::new();
        let mut out = Vec::new();
        for (key, created) in missing {
            let first = self
                .seen
                .get(&key)
                .filter(|(c, _)| *c == created)
                .map_or(now, |(_, f)| *f);
            next.insert(key.clone(), (created, first));
            out.push((key, created, first));
        }
        self.seen = next;
        out
    }

    /// True when `first` (from [`Suspects::check`]) and `created` are both at least `grace`
    /// before `now`, and this is not the first sighting.
    pub fn due(first: Millis, created: Millis, now: Millis, grace: Millis) -> bool {
        first < now && now - first >= grace && now.saturating_sub(created) >= grace
    }

    /// No longer a suspect (released, or found kept).
    pub fn clear(&mut self, key: &K) {
        self.seen.remove(key);
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests;
