//! The stream of allocation events that `Watch` serves.

use std::net::IpAddr;

use super::{Ipam, ReleaseBy, Released};
use crate::model::{AttachmentKey, AttachmentRecord, Millis, Pod, Reservation};

/// How many events a watcher may fall behind before it is told it lagged.
pub(super) const EVENT_BUFFER: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Add,
    Release,
    Reserve,
    Expire,
    Gc,
}

/// One allocation event, as `Watch` streams it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub at_ms: Millis,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub namespace: String,
    pub pod: String,
    pub addresses: Vec<IpAddr>,
    pub reason: String,
}

impl Event {
    /// `key`: the attachment, if the event is about one (a reservation's events have none).
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: EventKind,
        at_ms: Millis,
        network: &str,
        key: Option<&AttachmentKey>,
        namespace: &str,
        pod: &str,
        addresses: &[IpAddr],
        reason: &str,
    ) -> Event {
        Event {
            kind,
            at_ms,
            network: network.to_string(),
            container_id: key.map(|k| k.container_id.clone()).unwrap_or_default(),
            ifname: key.map(|k| k.ifname.clone()).unwrap_or_default(),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            addresses: addresses.to_vec(),
            reason: reason.to_string(),
        }
    }

    pub(super) fn of_record(
        kind: EventKind,
        at_ms: Millis,
        r: &AttachmentRecord,
        reason: &str,
    ) -> Event {
        Event::of_attachment(kind, at_ms, &r.key, &r.pod, &r.addresses, reason)
    }

    /// An event about the attachment `key` of `pod`.
    fn of_attachment(
        kind: EventKind,
        at_ms: Millis,
        key: &AttachmentKey,
        pod: &Pod,
        addresses: &[IpAddr],
        reason: &str,
    ) -> Event {
        Event::new(
            kind,
            at_ms,
            &key.network,
            Some(key),
            &pod.namespace,
            &pod.name,
            addresses,
            reason,
        )
    }

    pub(super) fn of_reservation(
        kind: EventKind,
        at_ms: Millis,
        r: &Reservation,
        reason: &str,
    ) -> Event {
        let k = &r.key;
        Event::new(
            kind,
            at_ms,
            &k.network,
            None,
            &k.namespace,
            &k.name,
            &r.addresses,
            reason,
        )
    }
}

impl Ipam {
    /// Sends an event to every watcher; never blocks (a slow watcher lags instead). The event
    /// is only built when somebody watches: the ADD path pays nothing otherwise.
    pub(super) fn emit(&self, e: impl FnOnce() -> Event) {
        if self.shared.events.receiver_count() > 0 {
            let _ = self.shared.events.send(e());
        }
    }

    pub(super) fn emit_released(&self, released: &[Released], by: ReleaseBy, reason: &str) {
        let now = self.now();
        let kind = by.event();
        for r in released {
            let (k, p) = (&r.key, &r.pod);
            self.emit(|| Event::of_attachment(kind, now, k, p, &r.addresses, reason));
            if let Some(until) = r.reserved_until {
                self.emit(|| {
                    let why = format!("sticky pod; until {until} (engine ms)");
                    Event::new(
                        EventKind::Reserve,
                        now,
                        &k.network,
                        None,
                        &p.namespace,
                        &p.name,
                        &r.addresses,
                        &why,
                    )
                });
            }
        }
    }

    /// A receiver of every event from now on.
    pub fn watch(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }
}
