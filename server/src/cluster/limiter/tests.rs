use super::*;

#[tokio::test(start_paused = true)]
async fn requests_wait_for_tokens_and_urgent_ones_do_not() {
    let l = Limiter::new(10.0, 2);
    let t = tokio::time::Instant::now();
    l.acquire(false).await;
    l.acquire(false).await;
    assert_eq!(l.waited_ms(), 0, "the burst");
    // Urgent: at once, and in debt.
    l.acquire(true).await;
    assert_eq!(t.elapsed(), Duration::ZERO);
    // The next one waits for the debt and its own token: 200 ms at 10/s.
    l.acquire(false).await;
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert!(l.last_wait(Duration::from_secs(1)).is_some());
}
