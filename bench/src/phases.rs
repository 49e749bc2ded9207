//! The benchmark's phases against a running ipoold: where the time goes (breakdown), latency
//! at a fill, throughput at a concurrency, and the restart of a full daemon.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};

use crate::alive;
use crate::daemon::Daemon;
use crate::grpc::{self, NetSpec};
use crate::live::Live;
use crate::plugin::{self, ipool_ipam_json, ipool_subnet, Net, Op};
use crate::report::{Breakdown, LatencyRow, Restart, ThroughputRow};
use crate::setup::{Bins, Names, Plan};

pub(crate) fn breakdown(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    daemon: &Daemon,
    plan: &Plan,
    names: &mut Names,
) -> Result<Breakdown> {
    let name = names.next();
    let ip = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let hl = Net::host_local(&bins.host_local, &name)?;
    let (mut version_ipool, mut version_host_local) = (Vec::new(), Vec::new());
    for i in 0..plan.warmup + plan.samples {
        let (a, b) = (ip.version()?, hl.version()?);
        if i >= plan.warmup {
            version_ipool.push(a);
            version_host_local.push(b);
        }
    }
    let spec = NetSpec {
        network: name.clone(),
        ipam_json: ipool_ipam_json(&daemon.socket, &ipool_subnet(&name)),
    };
    let live = Live::new(format!("ipool (gRPC) network {name}"));
    let direct = rt.block_on(grpc::sequential(
        &daemon.socket,
        &spec,
        plan.warmup + plan.samples,
        &live,
    ))?;
    let direct = &direct[plan.warmup..];
    let status = rt.block_on(grpc::sequential_status(
        &daemon.socket,
        &spec,
        plan.warmup + plan.samples,
    ))?;
    Ok(Breakdown {
        status: status[plan.warmup..].to_vec(),
        version_ipool,
        version_host_local,
        connect: direct.iter().map(|d| d.0).collect(),
        add: direct.iter().map(|d| d.1).collect(),
        del: direct.iter().map(|d| d.2).collect(),
    })
}

/// ADD and DEL latency of both plugins in fresh networks holding `fill` attachments.
pub(crate) fn latency_at(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    daemon: &Daemon,
    plan: &Plan,
    fill: usize,
    names: &mut Names,
    phases: &mut Vec<(String, Duration)>,
) -> Result<[LatencyRow; 2]> {
    let name = names.next();
    let ip = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let hl = Net::host_local(&bins.host_local, &name)?;
    // The control: an empty network of the same daemon, measured in the same loop, each call
    // right after a host-local call at this fill, like `ip`'s. Only the fill differs.
    let ctl = Net::ipool(&bins.ipool, &daemon.socket, &names.next());
    if fill > 0 {
        let t = Instant::now();
        progress!(
            "prefilling {fill} attachments in network {name} (ipool over gRPC, host-local files)"
        );
        let spec = NetSpec {
            network: name.clone(),
            ipam_json: ipool_ipam_json(&daemon.socket, &ipool_subnet(&name)),
        };
        rt.block_on(grpc::prefill(
            &daemon.socket,
            &spec,
            fill,
            plan.prefill_connections,
            plan.prefill_in_flight,
            "fill-",
            ip.live.clone(),
        ))?;
        for (c, a) in hl.prefill_host_local(fill, fill - 1, "fill-")? {
            hl.live.added(&c, &[a])?;
        }
        ensure!(
            ip.live.len() == fill && hl.live.len() == fill,
            "prefill made {} ipool and {} host-local attachments, not {fill}",
            ip.live.len(),
            hl.live.len()
        );
        phases.push((format!("prefill {fill}"), t.elapsed()));
    }
    let t = Instant::now();
    progress!(
        "sequential latency at fill {fill} ({} samples)",
        plan.samples
    );
    let row = |op| LatencyRow {
        op,
        fill,
        ipool: Vec::new(),
        host_local: Vec::new(),
        ipool_alone: Vec::new(),
        ipool_control: Vec::new(),
    };
    let (mut add, mut del) = (row(Op::Add), row(Op::Del));
    // A B A B: ipool ADD, host-local ADD, ipool DEL, host-local DEL of the same container;
    // then the control's ADD and DEL, each also right after a host-local call (of a container
    // of its own, not measured), so both ipool networks follow the same neighbour. The first
    // `warmup` rounds are not recorded.
    for i in 0..plan.warmup + plan.samples {
        let c = format!("lat-{i}");
        let k = format!("ctl-{i}");
        let round = [
            ip.call(Op::Add, &c)?,
            hl.call(Op::Add, &c)?,
            ip.call(Op::Del, &c)?,
            hl.call(Op::Del, &c)?,
            ctl.call(Op::Add, &c)?,
            hl.call(Op::Add, &k)?,
            ctl.call(Op::Del, &c)?,
            hl.call(Op::Del, &k)?,
        ];
        if i >= plan.warmup {
            add.ipool.push(round[0]);
            add.host_local.push(round[1]);
            del.ipool.push(round[2]);
            del.host_local.push(round[3]);
            add.ipool_control.push(round[4]);
            del.ipool_control.push(round[6]);
        }
    }
    // The same network, ipool only, back to back: what the fill costs ipool itself, without
    // host-local's call (~90 ms at 10 000, with a core idle) just before each measurement.
    for i in 0..plan.samples {
        let c = format!("alone-{i}");
        add.ipool_alone.push(ip.call(Op::Add, &c)?);
        del.ipool_alone.push(ip.call(Op::Del, &c)?);
    }
    ensure!(
        ip.live.len() == fill && hl.live.len() == fill && ctl.live.len() == 0,
        "after the measurement the networks hold {} (ipool), {} (host-local) and {} (the empty \
         control) attachments, not {fill}, {fill} and 0",
        ip.live.len(),
        hl.live.len(),
        ctl.live.len()
    );
    phases.push((format!("latency at fill {fill}"), t.elapsed()));
    Ok([add, del])
}

/// ADD/s then DEL/s of both plugins with `c` threads, runs interleaved.
pub(crate) fn throughput_at(
    bins: &Bins,
    daemon: &Daemon,
    plan: &Plan,
    c: usize,
    names: &mut Names,
) -> Result<ThroughputRow> {
    let name = names.next();
    let ip = Net::ipool(&bins.ipool, &daemon.socket, &name);
    let hl = Net::host_local(&bins.host_local, &name)?;
    let per = plan.calls.div_ceil(c);
    let id = |t: usize, k: usize| format!("thr-{t}-{k}");
    let ipool_add = plugin::run_parallel(&ip, Op::Add, c, per, id)?;
    let host_local_add = plugin::run_parallel(&hl, Op::Add, c, per, id)?;
    ensure!(
        ip.live.len() == c * per && hl.live.len() == c * per,
        "ADD runs left {} (ipool) and {} (host-local) attachments, not {}",
        ip.live.len(),
        hl.live.len(),
        c * per
    );
    let ipool_del = plugin::run_parallel(&ip, Op::Del, c, per, id)?;
    let host_local_del = plugin::run_parallel(&hl, Op::Del, c, per, id)?;
    Ok(ThroughputRow {
        concurrency: c,
        calls: c * per,
        ipool_add,
        host_local_add,
        ipool_del,
        host_local_del,
    })
}

/// A daemon with `restart_allocations` attachments is SIGKILLed and started again.
pub(crate) fn restart(
    rt: &tokio::runtime::Runtime,
    bins: &Bins,
    config: &Path,
    plan: &Plan,
    phases: &mut Vec<(String, Duration)>,
) -> Result<Restart> {
    let n = plan.restart_allocations;
    let subnet = "10.98.0.0/15";
    let t = Instant::now();
    progress!("restart: filling a fresh ipoold with {n} allocations in {subnet}");
    let mut d = Daemon::start(&bins.ipoold, Some(config))?;
    let spec = NetSpec {
        network: "bench-restart".to_string(),
        ipam_json: ipool_ipam_json(&d.socket, subnet),
    };
    let live = Arc::new(Live::new("ipool network bench-restart"));
    let fill_time = alive(&mut d, |d| {
        rt.block_on(grpc::prefill(
            &d.socket,
            &spec,
            n,
            plan.prefill_connections,
            plan.prefill_in_flight,
            "r-",
            live.clone(),
        ))
    })?;
    let rss_before_kib = d.rss_kib()?;
    phases.push((format!("restart: fill {n}"), t.elapsed()));

    let t = Instant::now();
    progress!("restart: SIGKILL, start again, poll connect+Add");
    d.kill9()?;
    let spawned = Instant::now();
    d.spawn()?;
    let first = alive(&mut d, |d| {
        rt.block_on(grpc::first_add(
            d.socket.clone(),
            &spec,
            "after-restart",
            spawned,
            Duration::from_secs(120),
        ))
    })?;
    let rss_after_kib = d.rss_kib()?;
    live.added("after-restart", std::slice::from_ref(&first.address))?;
    // The allocations survived: an Add of an existing key returns its address.
    let again = rt.block_on(async {
        let mut c = grpc::connect(&d.socket).await?;
        grpc::add(&mut c, &spec, "r-0").await
    })?;
    let before = live.addresses_of("r-0");
    ensure!(
        before.as_deref() == Some(std::slice::from_ref(&again)),
        "restart: r-0 held {before:?} before the restart and {again} after it"
    );
    if live.len() != n + 1 {
        bail!(
            "restart: {} live attachments, expected {}",
            live.len(),
            n + 1
        );
    }
    phases.push(("restart: measure".into(), t.elapsed()));
    Ok(Restart {
        allocations: n,
        subnet: subnet.to_string(),
        fill_time,
        rss_before_kib,
        connected: first.connected,
        first_add: first.added,
        rss_after_kib,
    })
}
