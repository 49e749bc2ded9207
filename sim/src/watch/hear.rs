//! A watch hears its news from the store: what changed since it last heard, as etcd or the
//! apiserver would send it.

use super::*;
use crate::store::Shared;

impl Watches {
    /// Watch `i` hears everything since it last heard (etcd: a progress notification when
    /// there is nothing); one behind the history kept is told so and ends.
    pub fn hear(&mut self, i: usize, shared: &Shared) -> Heard {
        let mut heard = Heard {
            events: 0,
            gone: Vec::new(),
        };
        let Some(o) = self.open.get_mut(i) else {
            return heard;
        };
        let ended = match (&o.target, shared) {
            (Target::Etcd { key, end, id, feed }, Shared::Etcd(e)) => {
                if (o.after as i64) < e.compacted() {
                    let _ = feed.send(Ok(compacted(e, *id)));
                    true
                } else {
                    let events = e.events_after(key, end, o.after as i64);
                    heard.events = events.len();
                    heard.gone = events
                        .iter()
                        .filter(|ev| ev.r#type == EventType::Delete as i32)
                        .filter_map(|ev| index_block(&ev.kv.as_ref()?.key))
                        .collect();
                    o.after = e.revision() as u64;
                    let answer = pb::WatchResponse {
                        header: e.header(),
                        watch_id: *id,
                        events,
                        ..Default::default()
                    };
                    let ended = feed.send(Ok(answer)).is_err();
                    if ended {
                        heard.gone.clear();
                    }
                    ended
                }
            }
            (
                Target::Api {
                    resource,
                    ns,
                    selector,
                    feed,
                },
                Shared::Api {
                    objects, oldest, ..
                },
            ) => {
                if o.after + 1 < *oldest {
                    let _ = feed.send(Ok(expired()));
                    true
                } else {
                    let lines: Vec<serde_json::Value> = objects
                        .events
                        .iter()
                        .filter(|ev| ev.0 > o.after)
                        .filter_map(|ev| watch_event(ev, resource, ns, selector))
                        .collect();
                    heard.events = lines.len();
                    heard.gone = lines
                        .iter()
                        .filter(|l| l["type"] == "DELETED" && resource == "ipblocks")
                        .filter_map(|l| l["object"]["spec"]["cidr"].as_str()?.parse().ok())
                        .collect();
                    o.after = objects.rv;
                    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
                    let ended = !body.is_empty() && feed.send(Ok(Bytes::from(body))).is_err();
                    if ended {
                        heard.gone.clear();
                    }
                    ended
                }
            }
            _ => true,
        };
        if ended {
            self.open.remove(i);
        }
        heard
    }
}
