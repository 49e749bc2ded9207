//! The Kubernetes watch cache's memory: ipoold with `[kubernetes]` against an apiserver of the
//! benchmark's own (real HTTP on loopback: the Node, the node's pods as a kubelet-era apiserver
//! returns them, managedFields and all, a watch that stays quiet), its RSS once the cache holds
//! 0 and then N pods.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Request, Response};
use serde_json::{json, Value};

use crate::daemon::Daemon;

const NODE: &str = "bench-node";

/// RSS with `pods` pods in the watch cache.
#[derive(Clone, Debug)]
pub struct KubeRow {
    pub pods: usize,
    /// The size of the pods as the apiserver served them (JSON), for scale.
    pub served_bytes: usize,
    pub rss_kib: u64,
}

/// A pod as an apiserver returns it for a running Deployment's replica: what ipool reads and
/// the rest (labels, managedFields, containers, conditions) that it must not keep.
fn pod(i: usize) -> Value {
    let name = format!("web-{i:04}-7d9c8f6b5d-x{i:04}");
    let ip = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
    let managed: Vec<Value> = (0..3)
        .map(|k| {
            json!({"manager": format!("kube-controller-manager-{k}"), "operation": "Update",
                   "apiVersion": "v1", "time": "2026-11-01T00:00:00Z", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                                "f:ownerReferences": {".": {}}},
                                "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {},
                                "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {}}}},
                                "f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:podIPs": {}}}})
        })
        .collect();
    let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-11-01T00:00:00Z"}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default", "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "resourceVersion": format!("{}", 1000 + i), "creationTimestamp": "2026-11-01T00:00:00Z",
            "generateName": format!("web-{i:04}-7d9c8f6b5d-"),
            "labels": {"app": "web", "pod-template-hash": "7d9c8f6b5d", "tier": "frontend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-01T00:00:00Z",
                            "prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": format!("web-{i:04}-7d9c8f6b5d"), "uid": "rs-uid",
                                 "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed
        },
        "spec": {
            "nodeName": NODE, "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "web", "image": "registry.example/web:1.2.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "production"}, {"name": "LOG", "value": "info"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.0.2.10",
            "startTime": "2026-11-01T00:00:00Z", "qosClass": "Burstable",
            "conditions": conditions,
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "started": true,
                "image": "registry.example/web:1.2.3", "imageID": "registry.example/web@sha256:0000",
                "containerID": format!("containerd://{i:064}"),
                "state": {"running": {"startedAt": "2026-11-01T00:00:00Z"}}}]
        }
    })
}

type Body = BoxBody<Bytes, Infallible>;

fn full(v: &Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("a response")
}

/// The page of `list` a query asks for (`limit`, `continue`: an offset), as an apiserver pages.
fn page(list: &Value, query: &str) -> Value {
    let arg = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let from = arg("continue").unwrap_or(0).min(items.len());
    let to = arg("limit").map_or(items.len(), |l| (from + l).min(items.len()));
    let mut out = list.clone();
    out["items"] = Value::Array(items[from..to].to_vec());
    if to < items.len() {
        out["metadata"]["continue"] = json!(to.to_string());
    }
    out
}

/// Serves the Node, the pods (list, paged), quiet watches and `/version` on a free loopback
/// port.
fn serve(rt: &tokio::runtime::Runtime, pods: Arc<Value>) -> Result<std::net::SocketAddr> {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .context("binding the fake apiserver")?;
    let addr = listener.local_addr()?;
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let pods = pods.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let pods = pods.clone();
                    async move { Ok::<_, Infallible>(answer(&req, &pods)) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn answer(req: &Request<hyper::body::Incoming>, pods: &Value) -> Response<Body> {
    let path = req.uri().path();
    let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
    match path {
        "/version" => full(&json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"})),
        p if p == format!("/api/v1/nodes/{NODE}") => full(&json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "resourceVersion": "1"}})),
        "/api/v1/pods" if watch => {
            // A watch that hears nothing until the client ends it.
            let quiet = futures::stream::pending::<Result<Frame<Bytes>, Infallible>>();
            Response::builder()
                .header("content-type", "application/json")
                .body(BodyExt::boxed(StreamBody::new(quiet)))
                .expect("a response")
        }
        "/api/v1/pods" => full(&page(pods, req.uri().query().unwrap_or_default())),
        _ => Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(b"{}")).boxed())
            .expect("a response"),
    }
}

/// ipoold's RSS with the watch cache holding 0 pods, then `n`.
pub fn run(rt: &tokio::runtime::Runtime, ipoold: &Path, n: usize) -> Result<Vec<KubeRow>> {
    let mut rows = Vec::new();
    for count in [0, n] {
        let items: Vec<Value> = (0..count).map(pod).collect();
        let list = json!({"apiVersion": "v1", "kind": "PodList",
                          "metadata": {"resourceVersion": format!("{}", 1000 + count)},
                          "items": items});
        let served_bytes = list.to_string().len();
        let addr = serve(rt, Arc::new(list))?;
        let dir = tempfile::tempdir().context("temp dir")?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: b\n  context:\n    cluster: b\n    user: b\ncurrent-context: b\nusers:\n- name: b\n  user: {{}}\n"
            ),
        )?;
        let config = dir.path().join("ipoold.toml");
        std::fs::write(
            &config,
            "[kubernetes]\n[[network]]\nname = \"k\"\nranges = [[{ subnet = \"10.96.0.0/16\" }]]\n",
        )?;
        let extra = vec![
            "--kubeconfig".to_string(),
            kubeconfig.display().to_string(),
            "--node-name".to_string(),
            NODE.to_string(),
        ];
        let d = Daemon::start_with(ipoold, Some(&config), &extra)?;
        let want = format!("pods={count}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !d
            .full_log()
            .lines()
            .any(|l| l.contains("watch cache is complete") && l.contains(&want))
        {
            if Instant::now() > deadline {
                bail!(
                    "ipoold did not list {count} pods within 60 s; its log:\n{}",
                    d.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The list's buffers given back (ipoold trims its heap every 5 s).
        std::thread::sleep(Duration::from_secs(6));
        rows.push(KubeRow {
            pods: count,
            served_bytes,
            rss_kib: d.rss_kib()?,
        });
    }
    Ok(rows)
}
