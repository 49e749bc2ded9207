//! A fake Kubernetes apiserver for the tests and the benchmark: real HTTP/1.1 on 127.0.0.1, the core/v1 paths
//! ipoold reads (nodes and pods: list, watch, get), the `/apis` paths of cluster mode's
//! Kubernetes store (custom resources and Leases, read and written: [`writes`]), with resourceVersions, field selectors
//! (`metadata.name=`, `spec.nodeName=`), watches streamed as chunked JSON lines, and the
//! failures a real one has: error statuses, an apiserver that is down, dropped connections,
//! and expired resourceVersions (410 Gone).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::access::{Access, Attributes, UserInfo};
use crate::apiserver::{url_pairs, Event, Objects};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

type Body = BoxBody<Bytes, std::io::Error>;

/// An object's place: (resource, namespace, name); namespace "" for nodes.
type Key = (String, String, String);

struct World {
    /// The objects, by the apiserver's rules (`ipool_testkit::apiserver`); every change kept
    /// as an event (watches read them).
    store: Objects,
    /// Watches from a resourceVersion below this get 410 Gone.
    oldest: u64,
    /// Every connection is dropped without an answer (and open watches end) while set.
    down: bool,
    /// The next requests answered with these statuses (first first).
    failures: Vec<u16>,
    /// Bumped to cut every open watch.
    cut: u64,
    /// Request lines seen ("GET /api/v1/nodes?...").
    requests: Vec<String>,
    /// Bytes of the bodies sent under `/apis` (answers, and the lines of watches).
    sent_bytes: u64,
    /// The next requests (other than watches) get no answer at all: the connection stays open,
    /// silent (a black hole).
    hangs: usize,
    /// Open watches hear nothing while set (their connections stay open).
    frozen: bool,
    /// ipool.io's resources are not served (its CRDs not applied).
    no_crds: bool,
    /// Seconds the server's clock is moved on by (the times it stamps on writes).
    clock_skew: i64,
    /// The next request whose line contains the pattern is answered with the status.
    targeted: Vec<(String, u16)>,
    /// The next request whose line contains the pattern is applied, and its connection then
    /// dropped without an answer (the caller cannot know it was applied).
    lost: Vec<String>,
    /// The next request whose line contains the pattern waits until the hold is released.
    holds: Vec<Hold>,
    /// Who may do what, for requests with a token ([`FakeApi::enforce`]); None: anyone
    /// anything.
    access: Option<Arc<Access>>,
    /// Each bearer token's user ([`FakeApi::kubeconfig_as`]).
    tokens: BTreeMap<String, UserInfo>,
}

/// A request held by [`FakeApi::hold`]: it waits, unanswered, until [`Hold::release`].
#[derive(Clone)]
pub struct Hold {
    pattern: String,
    caught: Arc<Mutex<Option<String>>>,
    gate: tokio::sync::watch::Sender<bool>,
}

impl Hold {
    /// Waits until a request was caught (panics after `secs`); its request line.
    pub fn caught_within(&self, secs: u64) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(line) = self.caught.lock().unwrap().clone() {
                return line;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no request matching {:?} within {secs} s",
                self.pattern
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// The request line caught, if one was.
    pub fn caught(&self) -> Option<String> {
        self.caught.lock().unwrap().clone()
    }

    /// Lets the held request through (it is answered as the world is now).
    pub fn release(&self) {
        self.gate.send_replace(true);
    }
}

impl Default for World {
    fn default() -> Self {
        World {
            store: Objects::new(true),
            oldest: 0,
            down: false,
            failures: Vec::new(),
            cut: 0,
            requests: Vec::new(),
            sent_bytes: 0,
            hangs: 0,
            frozen: false,
            no_crds: false,
            clock_skew: 0,
            targeted: Vec::new(),
            lost: Vec::new(),
            holds: Vec::new(),
            access: None,
            tokens: BTreeMap::new(),
        }
    }
}

pub struct FakeApi {
    pub addr: SocketAddr,
    world: Arc<Mutex<World>>,
    wake: tokio::sync::watch::Sender<u64>,
}

impl FakeApi {
    /// Serves on a free loopback port, on a thread of its own.
    pub fn start() -> FakeApi {
        let world = Arc::new(Mutex::new(World::default()));
        let (wake, _) = tokio::sync::watch::channel(0u64);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (w, k) = (world.clone(), wake.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(listener, w, k));
        });
        FakeApi { addr, world, wake }
    }

    /// A kubeconfig in `dir` that points at this server.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        self.kubeconfig_via(dir, &self.addr.to_string())
    }

    /// A kubeconfig in `dir` that reaches this server at `via` (host:port: a proxy's).
    pub fn kubeconfig_via(&self, dir: &Path, via: &str) -> PathBuf {
        let path = match via == self.addr.to_string() {
            true => dir.join("kubeconfig"),
            false => dir.join(format!("kubeconfig-{}", via.replace(':', "-"))),
        };
        self.write_kubeconfig(&path, via, None);
        path
    }

    /// Who may do what from now on, for requests with a token (the tests' own, with none,
    /// stay a cluster admin's): RBAC (403) and the admission policies (422) of `access`.
    pub fn enforce(&self, access: Access) {
        self.change(|w| w.access = Some(Arc::new(access)));
    }

    /// A kubeconfig in `dir` (named `name`) whose token is `user`'s, reaching this server at
    /// `via` (host:port).
    pub fn kubeconfig_as(&self, dir: &Path, name: &str, via: &str, user: UserInfo) -> PathBuf {
        let token = {
            let mut w = self.world.lock().unwrap();
            let token = format!("token-{}", w.tokens.len() + 1);
            w.tokens.insert(token.clone(), user);
            token
        };
        let path = dir.join(name);
        self.write_kubeconfig(&path, via, Some(&token));
        path
    }

    fn write_kubeconfig(&self, path: &Path, via: &str, token: Option<&str>) {
        let user = match token {
            Some(t) => format!("\n    token: {t}"),
            None => " {}".to_string(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{via}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user:{user}\n"
        );
        // Whole or not at all: a daemon may be reading it (each reconnection does).
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write kubeconfig");
        std::fs::rename(&tmp, path).expect("rename kubeconfig");
    }

    fn change(&self, f: impl FnOnce(&mut World)) {
        let v = {
            let mut w = self.world.lock().unwrap();
            f(&mut w);
            w.store.rv + w.cut
        };
        self.wake.send_replace(v);
    }

    /// Creates or replaces an object (`resource`: "nodes", "pods", "namespaces", or the owners
    /// of pins, read by name only: "statefulsets", "virtualmachines",
    /// "virtualmachineinstances", and KubeVirt's "virtualmachineinstancemigrations", listed).
    pub fn put(&self, resource: &str, obj: Value) {
        let (kind, _) = kind_of(resource);
        self.change(|w| w.store.put(resource, kind, obj));
    }

    /// Deletes an object; false when there was none.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let mut found = false;
        self.change(|w| found = w.store.delete(resource, namespace, name));
        found
    }

    /// The apiserver down (connections dropped unanswered, open watches cut) or back.
    pub fn set_down(&self, down: bool) {
        self.change(|w| {
            w.down = down;
            w.cut += 1;
        });
    }

    /// The next requests answered with these HTTP statuses.
    pub fn fail_next(&self, statuses: &[u16]) {
        self.change(|w| w.failures.extend_from_slice(statuses));
    }

    /// The next request whose line ("GET /apis/...?...", query as sent) contains `pattern`
    /// answered with `status`, whatever it asked.
    pub fn fail_matching(&self, pattern: &str, status: u16) {
        self.change(|w| w.targeted.push((pattern.to_string(), status)));
    }

    /// The next request whose line contains `pattern` is applied, its answer lost (the
    /// connection dropped).
    pub fn lose_answer(&self, pattern: &str) {
        self.change(|w| w.lost.push(pattern.to_string()));
    }

    /// The next request whose line contains `pattern` is held, unanswered, until the
    /// returned hold is released; everything else is answered meanwhile.
    pub fn hold(&self, pattern: &str) -> Hold {
        let hold = Hold {
            pattern: pattern.to_string(),
            caught: Arc::default(),
            gate: tokio::sync::watch::Sender::new(false),
        };
        self.change(|w| w.holds.push(hold.clone()));
        hold
    }

    /// True when the object exists.
    pub fn has(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let key = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        self.world.lock().unwrap().store.objects.contains_key(&key)
    }

    /// Open watches hear nothing while `frozen` (a watch that fell behind); GETs and lists
    /// answer as usual.
    pub fn freeze_watches(&self, frozen: bool) {
        self.change(|w| w.frozen = frozen);
    }

    /// The next `n` requests other than watches are never answered (their connections stay
    /// open and silent).
    pub fn hang_next(&self, n: usize) {
        self.change(|w| w.hangs += n);
    }

    /// Cuts every open watch mid-stream (the connection is dropped, no final chunk).
    pub fn drop_watches(&self) {
        self.change(|w| w.cut += 1);
    }

    /// Forgets the history: a watch from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        self.change(|w| {
            w.oldest = w.store.rv + 1;
            w.cut += 1;
        });
    }

    /// Replaces an object of the `/apis` paths as an update would (its uid kept, a new
    /// resourceVersion), whatever resourceVersion it says.
    pub fn put_custom(&self, resource: &str, obj: Value) {
        self.change(|w| w.store.put_custom(resource, obj));
    }

    /// Serves ipool.io's resources (its CRDs applied) or not.
    pub fn set_crds(&self, applied: bool) {
        self.world.lock().unwrap().no_crds = !applied;
    }

    /// Moves the server's clock on by `secs` (the times it stamps on writes).
    pub fn advance_clock(&self, secs: i64) {
        self.world.lock().unwrap().clock_skew += secs;
    }

    /// Every object of `resource` (all namespaces).
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let w = self.world.lock().unwrap();
        w.store
            .objects
            .iter()
            .filter(|(k, _)| k.0 == resource)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// One object, if it exists.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        self.world.lock().unwrap().store.objects.get(&key).cloned()
    }

    /// The request lines served so far.
    pub fn requests(&self) -> Vec<String> {
        self.world.lock().unwrap().requests.clone()
    }

    /// Bytes of the bodies sent under `/apis` so far (answers, and watches' lines).
    pub fn sent_bytes(&self) -> u64 {
        self.world.lock().unwrap().sent_bytes
    }

    /// What its clients cost it so far.
    pub fn load(&self) -> crate::load::Load {
        let w = self.world.lock().unwrap();
        crate::load::Load::of_requests(&w.requests, w.sent_bytes)
    }
}

fn kind_of(resource: &str) -> (&'static str, &'static str) {
    match resource {
        "nodes" => ("Node", "NodeList"),
        "pods" => ("Pod", "PodList"),
        "namespaces" => ("Namespace", "NamespaceList"),
        "statefulsets" => ("StatefulSet", "StatefulSetList"),
        "virtualmachines" => ("VirtualMachine", "VirtualMachineList"),
        "virtualmachineinstances" => ("VirtualMachineInstance", "VirtualMachineInstanceList"),
        "virtualmachineinstancemigrations" => (
            "VirtualMachineInstanceMigration",
            "VirtualMachineInstanceMigrationList",
        ),
        other => panic!("the fake apiserver has no {other}"),
    }
}

async fn serve(
    listener: std::net::TcpListener,
    world: Arc<Mutex<World>>,
    wake: tokio::sync::watch::Sender<u64>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        if world.lock().unwrap().down {
            drop(stream);
            continue;
        }
        let (world, wake) = (world.clone(), wake.clone());
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (world, wake) = (world.clone(), wake.clone());
                    async move {
                        let hang = {
                            let mut w = world.lock().unwrap();
                            let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
                            let hang = !watch && w.hangs > 0;
                            if hang {
                                w.hangs -= 1;
                                w.requests.push(format!(
                                    "{} {} (unanswered)",
                                    req.method(),
                                    req.uri()
                                ));
                            }
                            hang
                        };
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        let held = {
                            let mut w = world.lock().unwrap();
                            let line = format!("{} {}", req.method(), req.uri());
                            let i = w.holds.iter().position(|h| line.contains(&h.pattern));
                            i.map(|i| {
                                let h = w.holds.remove(i);
                                *h.caught.lock().unwrap() = Some(line);
                                h.gate.subscribe()
                            })
                        };
                        let (parts, body) = req.into_parts();
                        let body = match body.collect().await {
                            Ok(b) => b.to_bytes(),
                            Err(e) => return Err(std::io::Error::other(e)),
                        };
                        let answered = match held {
                            None => answer(parts, &body, &world, &wake),
                            // A request received whole is applied when let through, whether
                            // or not its client is still there (it gave up: the write lands
                            // late, as an apiserver's that was slow to reach etcd does).
                            Some(mut gate) => tokio::spawn(async move {
                                let _ = gate.wait_for(|open| *open).await;
                                answer(parts, &body, &world, &wake)
                            })
                            .await
                            .map_err(std::io::Error::other)?,
                        };
                        answered.ok_or_else(|| std::io::Error::other("the fake apiserver is down"))
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|e: Infallible| match e {})
                .boxed(),
        )
        .expect("response")
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    full(
        StatusCode::from_u16(code).expect("status"),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// `metadata.name=n1,spec.nodeName=n1`: every term holds.
fn selected(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (path, want, eq) = match term.split_once("!=") {
            Some((p, v)) => (p, v, false),
            None => match term.split_once('=') {
                Some((p, v)) => (p, v.trim_start_matches('='), true),
                None => return false,
            },
        };
        let got = path.split('.').fold(obj, |v, k| &v[k]);
        (got.as_str().unwrap_or("") == want) == eq
    })
}

/// The answer to a request; None drops the connection (the apiserver is down).
fn answer(
    req: hyper::http::request::Parts,
    body: &[u8],
    world: &Arc<Mutex<World>>,
    wake: &tokio::sync::watch::Sender<u64>,
) -> Option<Response<Body>> {
    let path = req.uri.path().to_string();
    let mut q = url_pairs(req.uri.query().unwrap_or(""));
    // A list of metadata only (`Accept: application/json;as=PartialObjectMetadataList;...`):
    // carried to `respond` as a query key no client sends.
    let accept = req.headers.get(hyper::header::ACCEPT);
    if accept
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadataList"))
    {
        q.insert(METADATA_ONLY.into(), "1".into());
    }
    if let Some(ct) = req.headers.get(hyper::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default().to_string();
        q.insert(crate::apiserver::CONTENT_TYPE.into(), ct);
    }
    let v = {
        let mut w = world.lock().unwrap();
        w.requests.push(format!("{} {}", req.method, req.uri));
        if w.down {
            return None;
        }
        // Who asks, and whether they may (with enforcement on).
        let caller = match access_of(&w, &req) {
            Ok(c) => c,
            Err(denied) => {
                return Some(full(
                    StatusCode::from_u16(denied.status).expect("status"),
                    denied.body,
                ))
            }
        };
        let line = format!("{} {}", req.method, req.uri);
        if let Some(i) = w
            .targeted
            .iter()
            .position(|(p, _)| line.contains(p.as_str()))
        {
            let (_, code) = w.targeted.remove(i);
            return Some(status(
                code,
                "InternalError",
                &format!("injected failure {code}"),
            ));
        }
        if !w.failures.is_empty() {
            return Some(respond(&mut w, &path, &q, world, wake));
        }
        let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
        if let (true, Some((resource, ns))) = (
            watching && req.method == hyper::Method::GET && !w.no_crds,
            crate::apiserver::watch_target(&path),
        ) {
            // A watch of ipool's resources (or Leases) with a label selector, as the watch
            // cache serves it.
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            if let Some(bad) = crate::apiserver::check_selector(&selector) {
                return Some(full(StatusCode::BAD_REQUEST, bad.body));
            }
            let filter =
                move |ev: &Event| crate::apiserver::watch_event(ev, &resource, &ns, &selector);
            return Some(stream(&w, &q, world, wake, Box::new(filter), false));
        }
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let now = unix + w.clock_skew;
        let crds = !w.no_crds;
        let guard = caller.as_ref().map(|(a, u)| (&**a, u));
        if let Some(a) = w
            .store
            .respond_as(guard, req.method.as_str(), &path, &q, body, now, crds)
        {
            w.sent_bytes += a.body.to_string().len() as u64;
            let r = full(StatusCode::from_u16(a.status).expect("status"), a.body);
            let v = w.store.rv + w.cut;
            let line = format!("{} {}", req.method, req.uri);
            let lost = w.lost.iter().position(|p| line.contains(p.as_str()));
            if let Some(i) = lost {
                w.lost.remove(i);
            }
            drop(w);
            wake.send_replace(v);
            return lost.is_none().then_some(r);
        }
        if req.method != hyper::Method::GET {
            return Some(status(
                405,
                "MethodNotAllowed",
                &format!("{} {path}", req.method),
            ));
        }
        Some(respond(&mut w, &path, &q, world, wake))
    };
    v
}

/// The caller of `req` and the access it is held to, with enforcement on (None: off); a 401
/// for a token no one was given, a 403 for what RBAC does not grant.
fn access_of(
    w: &World,
    req: &hyper::http::request::Parts,
) -> Result<Option<(Arc<Access>, UserInfo)>, crate::apiserver::Answer> {
    let Some(access) = w.access.clone() else {
        return Ok(None);
    };
    let token = req
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let user = match token {
        None => UserInfo::admin(),
        Some(t) => match w.tokens.get(t) {
            Some(u) => u.clone(),
            None => {
                return Err(crate::apiserver::status(
                    401,
                    "Unauthorized",
                    "Unauthorized",
                ))
            }
        },
    };
    let q = url_pairs(req.uri.query().unwrap_or(""));
    if let Some(a) = Attributes::of(req.method.as_str(), req.uri.path(), &q) {
        access.authorize(&user, &a)?;
    }
    Ok(Some((access, user)))
}

/// The key [`answer`] marks a list of metadata only with.
const METADATA_ONLY: &str = " as=PartialObjectMetadataList";

fn respond(
    w: &mut World,
    path: &str,
    q: &BTreeMap<String, String>,
    world: &Arc<Mutex<World>>,
    wake: &tokio::sync::watch::Sender<u64>,
) -> Response<Body> {
    if !w.failures.is_empty() {
        let code = w.failures.remove(0);
        return status(code, "InternalError", &format!("injected failure {code}"));
    }
    if path == "/version" {
        return full(
            StatusCode::OK,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "",
                   "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                   "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
        );
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // api/v1/{resource} | api/v1/{resource}/{name} | api/v1/namespaces/{ns}/{resource}[/{name}]
    let (resource, ns, name) = match parts.as_slice() {
        ["api", "v1", r] => (*r, None, None),
        ["api", "v1", r, n] => (*r, None, Some(*n)),
        ["api", "v1", "namespaces", ns, r] => (*r, Some(*ns), None),
        ["api", "v1", "namespaces", ns, r, n] => (*r, Some(*ns), Some(*n)),
        // The owners of pins ipoold reads: a StatefulSet, KubeVirt's VMs and instances; and
        // KubeVirt's migrations, listed in a namespace.
        ["apis", "apps" | "kubevirt.io", "v1", "namespaces", ns, r, n] => (*r, Some(*ns), Some(*n)),
        ["apis", "kubevirt.io", "v1", "namespaces", ns, r] => (*r, Some(*ns), None),
        _ => return status(404, "NotFound", &format!("no route {path}")),
    };
    let group_ok = match resource {
        "statefulsets" => parts.get(1) == Some(&"apps"),
        "virtualmachines" | "virtualmachineinstances" | "virtualmachineinstancemigrations" => {
            parts.get(1) == Some(&"kubevirt.io")
        }
        _ => parts.first() == Some(&"api"),
    };
    if !group_ok {
        return status(404, "NotFound", &format!("no route {path}"));
    }
    if ![
        "nodes",
        "pods",
        "namespaces",
        "statefulsets",
        "virtualmachines",
        "virtualmachineinstances",
        "virtualmachineinstancemigrations",
    ]
    .contains(&resource)
    {
        return status(404, "NotFound", &format!("no resource {resource}"));
    }
    let (_, list_kind) = kind_of(resource);
    if let Some(name) = name {
        let key = (
            resource.to_string(),
            ns.unwrap_or("").to_string(),
            name.to_string(),
        );
        return match w.store.objects.get(&key) {
            Some(obj) => full(StatusCode::OK, obj.clone()),
            None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
        };
    }
    let selector = q.get("fieldSelector").cloned().unwrap_or_default();
    let in_scope = |k: &Key, obj: &Value| {
        k.0 == resource && ns.is_none_or(|n| k.1 == n) && selected(obj, &selector)
    };
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    if !watching {
        let items: Vec<Value> = w
            .store
            .objects
            .iter()
            .filter(|(k, o)| in_scope(k, o))
            .map(|(_, o)| o.clone())
            .collect();
        let rv = w.store.rv.to_string();
        if q.contains_key(METADATA_ONLY) {
            // As the apiserver converts a list for that Accept: each item's metadata alone.
            let items: Vec<Value> = items
                .iter()
                .map(|o| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}))
                .collect();
            return full(
                StatusCode::OK,
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                       "metadata": {"resourceVersion": rv}, "items": items}),
            );
        }
        return full(
            StatusCode::OK,
            json!({"kind": list_kind, "apiVersion": "v1",
                   "metadata": {"resourceVersion": rv}, "items": items}),
        );
    }
    let (resource, ns) = (resource.to_string(), ns.map(str::to_string));
    let core = true;
    let filter = move |ev: &Event| {
        let (_, r, t, o, _) = ev;
        (*r == resource
            && ns
                .as_deref()
                .is_none_or(|n| o["metadata"]["namespace"].as_str() == Some(n))
            && selected(o, &selector))
        .then(|| json!({"type": t, "object": o}))
    };
    stream(w, q, world, wake, Box::new(filter), core)
}

/// Which events a watch hears, each as the line it is sent as.
type Filter = Box<dyn Fn(&Event) -> Option<Value> + Send>;

/// A watch from the query's resourceVersion (410 Gone when older than what is kept), each
/// event `filter` passes streamed as a JSON line, until the watch is cut; the lines' bytes
/// counted unless `core` (a watch of nodes or pods).
fn stream(
    w: &World,
    q: &BTreeMap<String, String>,
    world: &Arc<Mutex<World>>,
    wake: &tokio::sync::watch::Sender<u64>,
    filter: Filter,
    core: bool,
) -> Response<Body> {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(w.store.rv);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(64);
    if from + 1 < w.oldest {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "message": "too old resource version",
            "reason": "Expired", "code": 410}});
        let _ = tx.try_send(Ok(Frame::data(Bytes::from(format!("{gone}\n")))));
        drop(tx);
    } else {
        let cut = w.cut;
        let (world, mut woken) = (world.clone(), wake.subscribe());
        tokio::spawn(async move {
            let mut cursor = from;
            loop {
                let (lines, now_cut) = {
                    let mut w = world.lock().unwrap();
                    let lines: Vec<String> = w
                        .store
                        .events
                        .iter()
                        .filter(|ev| ev.0 > cursor)
                        .filter_map(&filter)
                        .map(|line| line.to_string())
                        .collect();
                    // A frozen watch hears nothing (and catches up when thawed).
                    if !w.frozen {
                        cursor = w.store.rv;
                        if !core {
                            w.sent_bytes += lines.iter().map(|l| l.len() as u64 + 1).sum::<u64>();
                        }
                    }
                    (if w.frozen { Vec::new() } else { lines }, w.cut)
                };
                if now_cut != cut {
                    // Dropped: an error ends the body without its last chunk.
                    let _ = tx
                        .send(Err(std::io::Error::other("connection dropped")))
                        .await;
                    return;
                }
                for l in lines {
                    if tx
                        .send(Ok(Frame::data(Bytes::from(format!("{l}\n")))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if woken.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}
