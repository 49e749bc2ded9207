//! A TCP proxy of the tests' own on loopback, between the daemons and etcd, that a test (or the
//! nemesis) steers: pass bytes, delay them, drop the replies (the request is applied, its answer
//! lost: an ambiguous outcome), black-hole both ways, or cut every connection and refuse new
//! ones.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Each chunk, either way, waits this long.
    Delay(Duration),
    /// Requests reach etcd; answers are dropped.
    DropReplies,
    /// Nothing passes either way; connections stay open.
    Blackhole,
    /// Every connection closed; new ones closed as they come.
    Refuse,
}

pub struct Proxy {
    pub url: String,
    mode: Arc<Mutex<Mode>>,
    /// Bumped when connections are to be cut.
    cuts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// A proxy to `target` ("127.0.0.1:PORT") on a free loopback port.
    pub fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        listener.set_nonblocking(true).expect("nonblocking");
        let (mode, cuts, stop) = (
            Arc::new(Mutex::new(Mode::Pass)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let target = target.to_string();
        let (m, c, s) = (mode.clone(), cuts.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if *m.lock().expect("mode") == Mode::Refuse {
                            drop(client);
                            continue;
                        }
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let cut_at = c.load(Ordering::SeqCst);
                        for (from, to, reply) in [
                            (client.try_clone(), server.try_clone(), false),
                            (server.try_clone(), client.try_clone(), true),
                        ] {
                            let (Ok(from), Ok(to)) = (from, to) else {
                                continue;
                            };
                            let (m, c, s) = (m.clone(), c.clone(), s.clone());
                            std::thread::spawn(move || pipe(from, to, reply, m, c, cut_at, s));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            url,
            mode,
            cuts,
            stop,
        }
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
        if matches!(mode, Mode::Refuse) {
            self.cut();
        }
    }

    pub fn mode(&self) -> Mode {
        *self.mode.lock().expect("mode")
    }

    /// Closes every open connection (new ones pass, as the mode says).
    pub fn cut(&self) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

/// Copies `from` to `to` as the mode says, until either side closes or the connection is cut.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    reply: bool,
    mode: Arc<Mutex<Mode>>,
    cuts: Arc<AtomicU64>,
    cut_at: u64,
    stop: Arc<AtomicBool>,
) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if cuts.load(Ordering::SeqCst) != cut_at || stop.load(Ordering::SeqCst) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        let m = *mode.lock().expect("mode");
        match m {
            Mode::Pass => {}
            Mode::Delay(d) => std::thread::sleep(d),
            Mode::DropReplies if reply => continue,
            Mode::DropReplies => {}
            Mode::Blackhole => continue,
            Mode::Refuse => break,
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
