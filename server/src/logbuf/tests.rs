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
