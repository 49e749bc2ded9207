//! deploy/monitoring with the real tools: promtool checks the alert rules and runs their unit
//! tests, and a real Prometheus scrapes a real ipoold and evaluates the rules against it: an
//! exhausted pool makes its alerts active, a healthy daemon none.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

fn monitoring_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

fn promtool(args: &[&str]) {
    let o = Command::new(PROMTOOL)
        .args(args)
        .current_dir(monitoring_dir())
        .output()
        .expect("promtool");
    assert!(
        o.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
}

/// A Prometheus on loopback, killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scraping `target` and evaluating `rules` every second.
    fn start(target: &str, rules: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: ipool\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).expect("log"))
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        eventually(
            30,
            "prometheus ready",
            || match std::net::TcpStream::connect(&p.addr).map(|_| get(&p.addr, "/-/ready")) {
                Ok((status, _)) if status.contains("200") => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
        p
    }

    /// `path` of the HTTP API, its `data`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = get(&self.addr, path);
        assert!(status.contains("200"), "{path}: {status}\n{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["status"], "success", "{v}");
        v["data"].clone()
    }

    /// The active alerts: (name, network label, state).
    fn alerts(&self) -> Vec<(String, String, String)> {
        let data = self.api("/api/v1/alerts");
        data["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .map(|a| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    s(&a["labels"]["alertname"]),
                    s(&a["labels"]["network"]),
                    s(&a["state"]),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET over HTTP/1.0 (so that no reply comes chunked); (status line, body).
fn get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

#[test]
#[ignore = "needs prometheus and promtool (apt-get install prometheus); CI runs it with --include-ignored"]
fn the_alert_rules_pass_promtool_and_fire_in_a_real_prometheus_on_an_exhausted_pool() {
    require(
        Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists(),
        "needs prometheus and promtool (apt-get install prometheus)",
    );
    promtool(&["check", "rules", "rules.yaml"]);
    promtool(&["test", "rules", "rules-test.yaml"]);

    // A network of six addresses at most (its range holds 253): exhausted by its capacity.
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut d = Daemon::prepare_with_config(
        "[[network]]\nname = \"mon\"\nranges = [[{ subnet = \"10.79.0.0/24\" }]]\ncapacity = 6\n",
    );
    d.add_args(&["--metrics-listen", &metrics]);
    d.spawn();
    let conf = d.conf("1.0.0", "mon", "");
    let rules = monitoring_dir().join("rules.yaml");
    let prom = Prometheus::start(&metrics, &rules);

    // Scraped, and the rules evaluated on it: nothing active while the pool has room.
    eventually(30, "ipoold scraped", || {
        let r = prom.api("/api/v1/query?query=ipool_pool_available%7Bnetwork%3D%22mon%22%7D");
        match r["result"][0]["value"][1].as_str() {
            Some("6") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let groups = prom.api("/api/v1/rules");
    let evaluated = groups["groups"][0]["lastEvaluation"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !evaluated.starts_with("0001"),
        "the rules were never evaluated: {groups}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        prom.alerts(),
        Vec::new(),
        "a healthy ipoold raises no alert"
    );

    for k in 0..6 {
        let r = cni("ADD", &format!("mon-{k}"), &conf);
        assert!(r.ok, "ADD {k}: {r:?}");
    }
    let full = cni("ADD", "mon-6", &conf);
    assert!(!full.ok, "a seventh ADD past the capacity: {full:?}");

    // The exhausted pool's alerts become active, and no other; IpoolPoolExhausted fires once
    // its `for` (1m) has passed (NearlyExhausted's 10m is left to the promtool tests).
    let started = Instant::now();
    let active = eventually(30, "the exhausted pool's alerts", || {
        let mut a = prom.alerts();
        a.sort();
        let names: Vec<_> = a
            .iter()
            .map(|(n, net, _)| (n.as_str(), net.as_str()))
            .collect();
        match names[..] {
            [("IpoolPoolExhausted", "mon"), ("IpoolPoolNearlyExhausted", "mon")] => Ok(a),
            _ => Err(a),
        }
    });
    for (name, _, state) in &active {
        assert!(state == "pending" || state == "firing", "{name} is {state}");
    }
    eprintln!(
        "alerts active {:.1} s after the pool was exhausted: {active:?}",
        started.elapsed().as_secs_f64()
    );
    eventually(120, "IpoolPoolExhausted firing", || {
        let a = prom.alerts();
        match a
            .iter()
            .any(|(n, net, state)| n == "IpoolPoolExhausted" && net == "mon" && state == "firing")
        {
            true => Ok(()),
            false => Err(a),
        }
    });
}
