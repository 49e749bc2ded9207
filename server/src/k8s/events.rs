//! Why an ADD was refused, on the pod: an Event (events.k8s.io/v1, type Warning) whose reason
//! names what an operator can act on ([`Refusal`]) and whose note is the ADD's error and what
//! to do, as `kubectl describe pod` and `kubectl events` show them. Written in the
//! background, never in an ADD's way, and aggregated as client-go's recorder does
//! ([`series`]): a pod refused over and over costs a bounded number of writes.
//!
//! # Layout
//! - `events.rs`: the handle an ADD records with, and the task that writes.
//! - `series.rs`: which occurrences are written, and when (no I/O).

mod series;

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

pub use series::PodRef;
use series::{Made, Observed, Occurrence, Series, Write};

use crate::error::Refusal;
use crate::metrics::Metrics;

/// The events' `reportingController`.
pub const REPORTER: &str = "ipool.io/ipoold";
/// The events' `action`.
pub const ACTION: &str = "AllocateAddress";
/// The apiserver's limit on a note, in bytes.
const NOTE_MAX: usize = 1024;
/// Occurrences waiting to be written at most; past it they are dropped (as client-go's).
const QUEUE: usize = 1000;
/// The field manager of ipoold's writes.
const MANAGER: &str = "ipoold";

/// Where refused ADDs are recorded (cheap to clone).
#[derive(Clone)]
pub struct Events {
    tx: mpsc::Sender<Occurrence>,
    metrics: Arc<Metrics>,
}

impl Events {
    /// Starts writing the events of node `node`'s daemon.
    pub fn start(client: Client, node: &str, metrics: Arc<Metrics>) -> Events {
        let (tx, rx) = mpsc::channel(QUEUE);
        let mut instance = format!("ipoold-{node}");
        instance.truncate(128);
        tokio::spawn(run(client, instance, rx, metrics.clone()));
        Events { tx, metrics }
    }

    /// Records that an ADD of `pod` was refused for `refusal` with `message`.
    pub fn refused(&self, pod: PodRef, refusal: Refusal, message: &str) {
        let o = Occurrence {
            pod,
            refusal,
            note: note(refusal, message),
            at: SystemTime::now(),
        };
        if self.tx.try_send(o).is_err() {
            self.metrics.pod_event(refusal.reason(), "dropped");
        }
    }
}

/// The note: the ADD's error, and what to do (cut to the apiserver's limit, at a character).
fn note(refusal: Refusal, message: &str) -> String {
    let mut n = format!("{message}. To fix: {}", refusal.remedy());
    if n.len() > NOTE_MAX {
        let mut end = NOTE_MAX - 3;
        while !n.is_char_boundary(end) {
            end -= 1;
        }
        n.truncate(end);
        n.push_str("...");
    }
    n
}

async fn run(
    client: Client,
    instance: String,
    mut rx: mpsc::Receiver<Occurrence>,
    metrics: Arc<Metrics>,
) {
    let w = Writer {
        client,
        instance,
        metrics,
    };
    let mut series = Series::default();
    let start = tokio::time::Instant::now();
    let mut finish = tokio::time::interval_at(start + series::FINISH, series::FINISH);
    let mut refresh = tokio::time::interval_at(start + series::REFRESH, series::REFRESH);
    loop {
        let writes = tokio::select! {
            o = rx.recv() => {
                let Some(o) = o else { return };
                let reason = o.refusal.reason();
                match series.observe(o) {
                    Observed::Write(write) => vec![write],
                    Observed::Counted => {
                        w.metrics.pod_event(reason, "aggregated");
                        continue;
                    }
                    Observed::Dropped => {
                        w.metrics.pod_event(reason, "dropped");
                        continue;
                    }
                }
            }
            _ = finish.tick() => series.finish(SystemTime::now()),
            _ = refresh.tick() => series.refresh(),
        };
        for write in writes {
            if let Err(made) = w.write(write).await {
                series.not_created(&made);
            }
        }
    }
}

struct Writer {
    client: Client,
    instance: String,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Writes `write`; the event it would have made, if it could not.
    async fn write(&self, write: Write) -> Result<(), Made> {
        let (made, series) = match write {
            Write::Create(made) => (made, None),
            Write::Series { made, count, last } => (made, Some((count, last))),
        };
        let reason = made.first.refusal.reason();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &made.first.pod.namespace);
        if let Some((count, last)) = series {
            let patch = serde_json::json!({ "series": series_of(count, last) });
            let params = PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            match api.patch(&made.name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => {
                    self.metrics.pod_event(reason, "patched");
                    return Ok(());
                }
                // Gone (its TTL at the apiserver, or deleted): made again, with its series.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(event = %made.name, namespace = %made.first.pod.namespace, error = %e, "cannot update an event on a pod");
                    self.metrics.pod_event(reason, "failed");
                    return Ok(());
                }
            }
        }
        let event = self.event(&made, series);
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, &event).await {
            Ok(_) => {
                self.metrics.pod_event(reason, "created");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(event = %made.name, namespace = %made.first.pod.namespace, error = %e, "cannot record an event on a pod");
                self.metrics.pod_event(reason, "failed");
                Err(made)
            }
        }
    }

    fn event(&self, made: &Made, series: Option<(u32, SystemTime)>) -> Event {
        let o = &made.first;
        Event {
            metadata: ObjectMeta {
                name: Some(made.name.clone()),
                namespace: Some(o.pod.namespace.clone()),
                ..Default::default()
            },
            event_time: Some(micro(o.at)),
            reporting_controller: Some(REPORTER.into()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(ACTION.into()),
            reason: Some(o.refusal.reason().into()),
            type_: Some("Warning".into()),
            note: Some(o.note.clone()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(o.pod.namespace.clone()),
                name: Some(o.pod.name.clone()),
                uid: Some(o.pod.uid.clone()).filter(|u| !u.is_empty()),
                ..Default::default()
            }),
            series: series.map(|(count, last)| series_of(count, last)),
            ..Default::default()
        }
    }
}

fn series_of(count: u32, last: SystemTime) -> EventSeries {
    EventSeries {
        count: count as i32,
        last_observed_time: micro(last),
    }
}

fn micro(t: SystemTime) -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or_default())
}

#[cfg(test)]
mod tests;
