//! Which Events are written, and when: client-go's aggregation for events.k8s.io/v1
//! (k8s.io/client-go/tools/events), which kubelet and the scheduler use. The first occurrence
//! of an event (one pod, one reason) is created; the second makes it a series (count 2),
//! patched; later ones are only counted here. A series not seen for [`FINISH`] is written
//! once more with its final count and forgotten, a single event forgotten; every [`REFRESH`]
//! each series is written again, so that the apiserver's event TTL (an hour by default) does
//! not drop one that goes on. A pod whose ADD is refused 200 times in a crash loop costs two
//! writes, then one per [`REFRESH`] while it goes on, and one when it ends.
//!
//! One difference: a series is written at its finish only if it was counted since it was
//! last written (client-go writes it anyway; what the apiserver holds is the same).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::error::Refusal;

/// A series not seen for this long is over (client-go's `finishTime`).
pub const FINISH: Duration = Duration::from_secs(6 * 60);
/// Each series is written again this often (client-go's `refreshTime`).
pub const REFRESH: Duration = Duration::from_secs(30 * 60);
/// Events remembered at most; an occurrence of a new one past it is dropped (client-go drops
/// past its queue's 1000).
pub const MAX_KEPT: usize = 4096;

/// The pod an event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One refused ADD of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occurrence {
    pub pod: PodRef,
    pub refusal: Refusal,
    /// What the ADD was told, and what to do.
    pub note: String,
    pub at: SystemTime,
}

/// An Event as first made: its name, and the occurrence that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Made {
    pub name: String,
    pub first: Occurrence,
}

/// A write to the apiserver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Create the event.
    Create(Made),
    /// Patch the event's series (create it with the series, if it is gone).
    Series {
        made: Made,
        count: u32,
        last: SystemTime,
    },
}

/// What became of an occurrence.
#[derive(Debug, PartialEq, Eq)]
pub enum Observed {
    Write(Write),
    /// Counted in its series, nothing written now.
    Counted,
    /// Too many events remembered: dropped.
    Dropped,
}

struct Kept {
    made: Made,
    /// The occurrences so far (1: a single event, not a series).
    count: u32,
    last: SystemTime,
    /// The count last written.
    written: u32,
}

type Key = (PodRef, Refusal);

/// The events remembered, and their series.
#[derive(Default)]
pub struct Series {
    kept: HashMap<Key, Kept>,
}

impl Series {
    /// `o`, and what to write for it.
    pub fn observe(&mut self, o: Occurrence) -> Observed {
        let key = (o.pod.clone(), o.refusal);
        if let Some(k) = self.kept.get_mut(&key) {
            k.count += 1;
            k.last = o.at;
            if k.count > 2 {
                return Observed::Counted;
            }
            k.written = k.count;
            return Observed::Write(Write::Series {
                made: k.made.clone(),
                count: k.count,
                last: k.last,
            });
        }
        if self.kept.len() >= MAX_KEPT {
            return Observed::Dropped;
        }
        let made = Made {
            name: name_for(&o.pod.name, o.at),
            first: o.clone(),
        };
        self.kept.insert(
            key,
            Kept {
                made: made.clone(),
                count: 1,
                last: o.at,
                written: 1,
            },
        );
        Observed::Write(Write::Create(made))
    }

    /// The event `made` could not be created: forgotten, so that its next occurrence tries
    /// again.
    pub fn not_created(&mut self, made: &Made) {
        let key = (made.first.pod.clone(), made.first.refusal);
        if self.kept.get(&key).is_some_and(|k| k.made == *made) {
            self.kept.remove(&key);
        }
    }

    /// The series over at `now` (not seen for [`FINISH`]): written with their final count
    /// where it changed since, and forgotten; single events that old forgotten.
    pub fn finish(&mut self, now: SystemTime) -> Vec<Write> {
        let mut writes = Vec::new();
        self.kept.retain(|_, k| {
            let over = now.duration_since(k.last).unwrap_or_default() >= FINISH;
            if over && k.count > 1 && k.count != k.written {
                writes.push(Write::Series {
                    made: k.made.clone(),
                    count: k.count,
                    last: k.last,
                });
            }
            !over
        });
        writes
    }

    /// Every series, written again (its TTL at the apiserver renewed).
    pub fn refresh(&mut self) -> Vec<Write> {
        self.kept
            .values_mut()
            .filter(|k| k.count > 1)
            .map(|k| {
                k.written = k.count;
                Write::Series {
                    made: k.made.clone(),
                    count: k.count,
                    last: k.last,
                }
            })
            .collect()
    }

    /// Events remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// An event's name, as client-go makes it: the pod's, a dot, the time in hex nanoseconds
/// (the pod's name cut so that the whole stays a DNS subdomain of at most 253 characters).
pub fn name_for(pod: &str, at: SystemTime) -> String {
    let nanos = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let suffix = format!(".{nanos:x}");
    let mut head = pod.get(..253 - suffix.len()).unwrap_or(pod);
    head = head.trim_end_matches(['-', '.']);
    format!("{head}{suffix}")
}

#[cfg(test)]
mod tests;
