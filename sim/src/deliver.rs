//! A request on its way delivered as a pick says, and what it did to the store checked.

use tokio::time::Instant;

use crate::net::command_of;
use crate::store::Fate;
use crate::world::World;

impl World {
    /// Delivers the `i`th request on its way as `fate` says, and checks what it did to the
    /// store.
    pub fn deliver(&mut self, i: usize, fate: Fate) -> Result<(), String> {
        let Some(mut req) = self.net.take(i) else {
            return Ok(());
        };
        let shared = &self.shared;
        req.wire.drop_condition(&mut self.conditions, |path| {
            shared.resource_version_at(path)
        });
        let (from, awaited, sent, writes) = (req.from, req.awaited(), req.sent, req.writes());
        // What it writes, for the writes parked on it (`crate::rivals`).
        let written = match self.swarm.races && matches!(fate, Fate::Answer | Fate::Lose) {
            true => req.wire.written(),
            false => crate::rivals::Keys::default(),
        };
        let who = match from {
            f if command_of(f).is_some() => "the operator".to_string(),
            s => self
                .slots
                .get(s)
                .map_or("?".into(), |x| format!("{} (slot {s})", x.name)),
        };
        let what = match &req.wire {
            crate::net::Wire::Etcd(c) => crate::describe::describe_call(c),
            crate::net::Wire::EtcdWatch(c) => format!(
                "watch {} from revision {}",
                String::from_utf8_lossy(&c.key).replace("/ipool/v1/", ""),
                c.start_revision
            ),
            crate::net::Wire::Api {
                method,
                path,
                query,
                ..
            } if query.contains("watch=") => format!("{method} {path}?{query}"),
            crate::net::Wire::Api { method, path, .. } => format!("{method} {path}"),
        };
        self.note(format!(
            "{fate:?} {what} from {who}{}",
            if awaited {
                String::new()
            } else {
                format!(
                    " (sent at {}ms; its caller gave up: late)",
                    sent.saturating_duration_since(self.started).as_millis()
                )
            }
        ));
        if let Some(writes) = self.idle_writes.as_mut().filter(|_| changes(&req.wire)) {
            writes.push(format!("{what} from {who}"));
        }
        let now = Instant::now();
        let wall = self.wall.now_ms();
        let cronjob = command_of(from).is_some_and(|op| self.operator.cronjob.contains(&op));
        let node = self.slots.get(from).map_or("?", |s| s.name.as_str());
        let user = crate::identity::user_of(from, cronjob, node);
        let version_before = self.shared.version();
        let (shared, limbo) = (&mut self.shared, &mut self.limbo);
        let delivered = self
            .net
            .watches(|ws| shared.deliver(req, fate, now, wall, limbo, ws, &user));
        if self.net.rival_landed(&written) > 0 {
            self.note("the writes parked on what it wrote arrive next".to_string());
        }
        if let Some(why) = &delivered.denied {
            return Err(format!(
                "the apiserver refused a request by deploy/cluster-kubernetes's RBAC or admission policies: {why}"
            ));
        }
        // A renewal whose caller gave up is one the daemon never learns of: it renews nothing.
        let renewed = delivered.renewed && awaited;
        let (ms, timeout) = (self.ms(), self.setting.timeout.as_millis() as u64);
        let (revision, sent_ms) = (self.shared.version(), self.ms_of(sent));
        let etcd = matches!(self.shared, crate::store::Shared::Etcd(_));
        if let Some(s) = self.slots.get_mut(from) {
            if renewed {
                // As far as the name's lease goes: a name taken on a lease granted earlier
                // lapses a TTL after the grant, not after the put.
                let heard = delivered.heard.map_or(ms, |t| {
                    ms.saturating_sub(now.saturating_duration_since(t).as_millis() as u64)
                });
                s.renewed_at = Some(ms);
                s.renewals.push(heard);
            }
            match (fate, awaited) {
                // An answer with the store's header shows a reset: any answer when the
                // cluster id changed, else an answer that read the node's witness.
                (Fate::Answer, true) => {
                    if etcd && revision > version_before {
                        s.written.push((revision, ms));
                    }
                    // Not a read's answer at a revision below each write of the node's the
                    // restore lost, to a request sent before the node heard any of them land:
                    // etcd may have read it before those writes (found by the simulation:
                    // seed 97 000 002 530, a read sent before a claim's answer, answered by an
                    // etcd restored with its data copied, revision back below the claim's). A
                    // write's answer shows it: its number is past theirs.
                    let blind = !writes
                        && !s.lost_writes.is_empty()
                        && s.lost_writes
                            .iter()
                            .all(|(rev, at)| sent_ms < *at && revision < *rev);
                    let shows = (delivered.keys && !blind) || self.resets.shows_id;
                    if s.unaware && delivered.headed && shows {
                        s.unaware = false;
                        s.aware_at = Some(ms);
                    }
                }
                // Its caller sees the failure at its deadline.
                (Fate::Drop, true) => s.trouble(ms + timeout),
                _ => s.trouble(ms),
            }
        }
        if renewed && self.shared.version() == self.seen.version {
            // A lease renewed: no revision, but a holder's term.
            self.snapshot();
        }
        // A daemon that took its name before etcd was restored, and not since, writes under a
        // name the store may give another daemon of that name: what it gives back is the
        // restore's doing.
        let doubtful = self.slots.get(from).is_some_and(|s| {
            self.resets
                .restored_at
                .is_some_and(|r| s.renewed_at.is_none_or(|t| t < r))
        });
        self.resets.doubtful_writer = doubtful;
        let r = self.store_check(&who, command_of(from), Some(sent));
        self.resets.doubtful_writer = false;
        r
    }
}

/// `wire` may change the store, and is no renewal (of a lease, or of a node's Lease).
fn changes(wire: &crate::net::Wire) -> bool {
    match wire {
        crate::net::Wire::Etcd(c) => crate::net::etcd_writes(c),
        crate::net::Wire::EtcdWatch(_) => false,
        crate::net::Wire::Api { method, path, .. } => method != "GET" && !path.contains("/leases/"),
    }
}
