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
mod tests;
