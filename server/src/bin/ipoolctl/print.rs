//! Output: each reply as an aligned table or as JSON (`--output`).

use crate::{pb, Output};

pub(super) fn table(header: &[&str], rows: Vec<Vec<String>>) {
    out!("{}", render(header, rows));
}

/// The table's text: columns padded to their widest cell, however wide (`format!`'s own
/// padding panics past 65 535).
fn render(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let width = |c: &str| c.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(width(c));
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<String>| {
        let mut l = String::new();
        for (c, w) in cells.iter().zip(&widths) {
            l.push_str(c);
            l.extend(std::iter::repeat_n(' ', w.saturating_sub(width(c)) + 2));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r);
    }
    out
}

pub(super) fn print_status(r: &pb::PoolStatusResponse, out: Output) {
    for p in &r.host_problems {
        eprintln!("ipoold: {p}");
    }
    if !r.store_error.is_empty() {
        eprintln!(
            "ipoold's store has failed: it serves no ADD or DEL until it is reopened (it retries by itself): {}",
            r.store_error
        );
    }
    if out == Output::Json {
        let v: Vec<serde_json::Value> = r
            .pools
            .iter()
            .map(|p| {
                serde_json::json!({
                    "network": p.network, "family": p.family, "ranges": p.ranges,
                    "capacity": p.capacity, "inUse": p.in_use, "idle": p.idle,
                    "cooling": p.cooling, "reserved": p.reserved,
                    "quarantined": p.quarantined, "drained": p.drained,
                    "retiring": p.retiring,
                    "lastSourceError": p.last_source_error, "freeInSource": p.free_in_source,
                    "minIdle": p.min_idle, "maxIdle": p.max_idle, "bucketTokens": p.bucket_tokens,
                    "degraded": p.degraded, "sourceDetail": p.source_detail,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return;
    }
    let rows = r
        .pools
        .iter()
        .map(|p| {
            vec![
                p.network.clone(),
                format!("IPv{}", p.family),
                match p.retiring {
                    true => format!("{} (retiring)", p.ranges.join(",")),
                    false => p.ranges.join(","),
                },
                p.in_use.to_string(),
                p.idle.to_string(),
                p.cooling.to_string(),
                match p.quarantined {
                    0 => p.reserved.to_string(),
                    q => format!("{} ({q} quarantined)", p.reserved),
                },
                p.capacity.to_string(),
                p.free_in_source.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "NETWORK", "FAMILY", "RANGES", "IN-USE", "IDLE", "COOLING", "RESERVED", "CAPACITY",
            "FREE",
        ],
        rows,
    );
    for p in &r.pools {
        let family = format!("{} IPv{}", p.network, p.family);
        if !p.source_detail.is_empty() {
            outln!("{family}: {}", p.source_detail);
        }
        if !p.degraded.is_empty() {
            outln!("{family}: DEGRADED: {}", p.degraded);
        }
    }
}

pub(super) fn print_list(r: &pb::ListAllocationsResponse, out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = r
            .allocations
            .iter()
            .map(|a| {
                serde_json::json!({
                    "network": a.network, "containerID": a.container_id, "ifname": a.ifname,
                    "podNamespace": a.pod_namespace, "podName": a.pod_name, "podUID": a.pod_uid,
                    "addresses": a.addresses, "netns": a.netns, "createdAtMs": a.created_at_ms,
                    "owner": a.owner, "sticky": a.sticky,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return;
    }
    // The owner column only where Kubernetes says who owns pods.
    let owners = r
        .allocations
        .iter()
        .any(|a| !a.owner.is_empty() || a.sticky);
    let rows = r
        .allocations
        .iter()
        .map(|a| {
            let pod = if a.pod_name.is_empty() {
                "-".to_string()
            } else {
                format!("{}/{}", a.pod_namespace, a.pod_name)
            };
            let mut row = vec![
                a.network.clone(),
                a.addresses.join(","),
                pod,
                a.container_id.chars().take(12).collect(),
                a.ifname.clone(),
            ];
            if owners {
                row.push(match (a.owner.is_empty(), a.sticky) {
                    (true, false) => "-".to_string(),
                    (true, true) => "(sticky)".to_string(),
                    (false, false) => a.owner.clone(),
                    (false, true) => format!("{} (sticky)", a.owner),
                });
            }
            row
        })
        .collect();
    let mut header = vec!["NETWORK", "ADDRESSES", "POD", "CONTAINER", "IFNAME"];
    if owners {
        header.push("OWNER");
    }
    table(&header, rows);
}

pub(super) fn print_reservations(rs: &[pb::Reservation], out: Output) {
    if out == Output::Json {
        let v: Vec<serde_json::Value> = rs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "network": r.network, "namespace": r.namespace, "pod": r.name,
                    "addresses": r.addresses, "createdAtMs": r.created_at_ms,
                    "expiresAtMs": r.expires_at_ms, "reason": r.reason, "podUID": r.pod_uid,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let rows = rs
        .iter()
        .map(|r| {
            vec![
                r.network.clone(),
                format!("{}/{}", r.namespace, r.name),
                r.addresses.join(","),
                match r.pod_uid.is_empty() {
                    true => format!("{}s", r.expires_at_ms.saturating_sub(now) / 1000),
                    false => "pod gone".to_string(),
                },
                r.reason.clone(),
            ]
        })
        .collect();
    table(
        &["NETWORK", "POD", "ADDRESSES", "EXPIRES-IN", "REASON"],
        rows,
    );
}

pub(super) fn print_event(e: &pb::Event, out: Output) {
    let kind = pb::event::Kind::try_from(e.kind)
        .map(|k| k.as_str_name().to_string())
        .unwrap_or_else(|_| e.kind.to_string());
    if out == Output::Json {
        outln!(
            "{}",
            serde_json::json!({
                "kind": kind, "atMs": e.at_ms, "network": e.network,
                "containerID": e.container_id, "ifname": e.ifname, "namespace": e.namespace,
                "pod": e.pod, "addresses": e.addresses, "reason": e.reason,
            })
        );
        return;
    }
    let pod = if e.pod.is_empty() {
        "-".to_string()
    } else {
        format!("{}/{}", e.namespace, e.pod)
    };
    let container = if e.container_id.is_empty() {
        "-"
    } else {
        &e.container_id
    };
    outln!(
        "{}  {kind}  {}  {pod}  {container}  {}  {}",
        e.at_ms,
        if e.network.is_empty() {
            "-"
        } else {
            &e.network
        },
        e.addresses.join(","),
        e.reason
    );
}

#[cfg(test)]
mod tests;
