//! Log output that waits for the daemon's thread to go idle.
//!
//! ipoold logs a line per ADD and DEL. Written as it is made, that line is a `write(2)` between
//! the store's flush and the reply, on the path of every pod, and one more syscall per call
//! under load. [`DeferredLog`] keeps the lines made on threads marked with
//! [`defer_on_this_thread`] (ipoold's runtime thread) in memory and writes them in
//! one go from [`DeferredLog::flush`], which ipoold calls when its runtime is about to park
//! (`on_thread_park`: no task left to run, so every reply has been written). Lines from other
//! threads (sled, the checkpoint and heap-trim threads) are written at once, after whatever is
//! waiting, so the order between threads is kept. [`FLUSH_AT`] bytes waiting are written
//! without waiting for the park, which a busy runtime may not reach for a while.

use std::cell::Cell;
use std::io::{self, Write};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing_subscriber::fmt::MakeWriter;

/// Bytes of waiting lines written at once, park or not.
pub const FLUSH_AT: usize = 32 * 1024;

thread_local! {
    static DEFER: Cell<bool> = const { Cell::new(false) };
}

/// Lines made on the calling thread wait for [`DeferredLog::flush`] from now on (`false`: they
/// are written at once again).
pub fn defer_on_this_thread(defer: bool) {
    DEFER.with(|d| d.set(defer));
}

/// A [`MakeWriter`] for tracing-subscriber; clones share the buffer and the output.
pub struct DeferredLog<W> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for DeferredLog<W> {
    fn clone(&self) -> Self {
        DeferredLog {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<W> {
    waiting: Mutex<Vec<u8>>,
    out: Mutex<W>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<W: Write> DeferredLog<W> {
    pub fn new(out: W) -> DeferredLog<W> {
        DeferredLog {
            shared: Arc::new(Shared {
                waiting: Mutex::new(Vec::with_capacity(FLUSH_AT)),
                out: Mutex::new(out),
            }),
        }
    }

    /// Writes the waiting lines. A failed write drops them: there is nowhere else to say so.
    pub fn flush(&self) {
        let mut out = lock(&self.shared.out);
        let _ = self.write_waiting(&mut out);
    }

    /// With `out` held (locks are always taken out, then waiting): writes the waiting lines
    /// and empties the buffer, keeping its capacity.
    fn write_waiting(&self, out: &mut W) -> io::Result<()> {
        let mut w = lock(&self.shared.waiting);
        if w.is_empty() {
            return Ok(());
        }
        let written = out.write_all(&w).and_then(|()| out.flush());
        w.clear();
        written
    }

    fn line(&self, bytes: &[u8]) -> io::Result<()> {
        if DEFER.with(Cell::get) {
            // Only the waiting lock here: a flush holding both just delays this line.
            let mut w = lock(&self.shared.waiting);
            if w.len() + bytes.len() <= FLUSH_AT {
                w.extend_from_slice(bytes);
                return Ok(());
            }
        }
        let mut out = lock(&self.shared.out);
        self.write_waiting(&mut out)?;
        out.write_all(bytes)?;
        out.flush()
    }
}

/// One event's output: tracing-subscriber formats the whole line and writes it in one call.
pub struct Line<'a, W> {
    log: &'a DeferredLog<W>,
}

impl<W: Write> Write for Line<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.log.line(bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a, W: Write + 'a> MakeWriter<'a> for DeferredLog<W> {
    type Writer = Line<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        Line { log: self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that records each write it gets.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Writes {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            lock(&self.0).push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Writes {
        fn taken(&self) -> Vec<Vec<u8>> {
            std::mem::take(&mut *lock(&self.0))
        }
    }

    fn put(log: &DeferredLog<Writes>, s: &str) {
        log.make_writer().write_all(s.as_bytes()).expect("write");
    }

    #[test]
    fn a_deferring_thread_waits_for_flush_and_gets_one_write() {
        let out = Writes::default();
        let log = DeferredLog::new(out.clone());
        defer_on_this_thread(true);
        put(&log, "one\n");
        put(&log, "two\n");
        assert!(out.taken().is_empty(), "written before the flush");
        log.flush();
        assert_eq!(out.taken(), vec![b"one\ntwo\n".to_vec()]);
        log.flush();
        assert!(out.taken().is_empty(), "nothing waits after a flush");
        defer_on_this_thread(false);
        put(&log, "three\n");
        assert_eq!(out.taken(), vec![b"three\n".to_vec()]);
    }

    #[test]
    fn another_threads_line_goes_out_at_once_after_what_waits() {
        let out = Writes::default();
        let log = DeferredLog::new(out.clone());
        defer_on_this_thread(true);
        put(&log, "waiting\n");
        let other = log.clone();
        std::thread::spawn(move || put(&other, "from another thread\n"))
            .join()
            .expect("the other thread");
        assert_eq!(
            out.taken().concat(),
            b"waiting\nfrom another thread\n".to_vec()
        );
        defer_on_this_thread(false);
    }

    #[test]
    fn past_flush_at_the_lines_go_out_without_a_flush() {
        let out = Writes::default();
        let log = DeferredLog::new(out.clone());
        defer_on_this_thread(true);
        let line = format!("{}\n", "x".repeat(999));
        let fit = FLUSH_AT / line.len();
        for _ in 0..fit {
            put(&log, &line);
        }
        assert!(out.taken().is_empty());
        put(&log, &line);
        let written = out.taken().concat();
        assert_eq!(written.len(), (fit + 1) * line.len());
        defer_on_this_thread(false);
    }
}
