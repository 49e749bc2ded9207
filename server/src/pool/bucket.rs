//! A token bucket in front of an address source: at most `burst` calls at once, refilled at
//! `rate` calls per second. Pure: the caller passes the time.

use super::Millis;

#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    last: Millis,
}

impl TokenBucket {
    /// A full bucket. `rate_per_sec` must be > 0 and `burst` >= 1 (the config checks it).
    pub fn new(rate_per_sec: f64, burst: u32, now: Millis) -> TokenBucket {
        TokenBucket {
            rate_per_sec,
            burst: burst.max(1) as f64,
            tokens: burst.max(1) as f64,
            last: now,
        }
    }

    fn refill(&mut self, now: Millis) {
        if now > self.last {
            let gained = (now - self.last) as f64 / 1000.0 * self.rate_per_sec;
            self.tokens = (self.tokens + gained).min(self.burst);
            self.last = now;
        }
    }

    /// Calls per second.
    pub fn rate(&self) -> f64 {
        self.rate_per_sec
    }

    /// Calls that may come at once.
    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// Takes one token, or says how many milliseconds until one is there.
    pub fn try_take(&mut self, now: Millis) -> Result<(), Millis> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let ms = ((1.0 - self.tokens) / self.rate_per_sec * 1000.0).ceil() as Millis;
            Err(ms.max(1))
        }
    }

    /// Takes one token now, whether or not there is one: the level may go below zero, and
    /// later callers wait the longer (for calls that must not wait, counted all the same).
    pub fn take_now(&mut self, now: Millis) {
        self.refill(now);
        self.tokens -= 1.0;
    }

    /// Tokens available at `now` (for status reports).
    pub fn level(&self, now: Millis) -> f64 {
        let mut b = self.clone();
        b.refill(now);
        b.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let mut b = TokenBucket::new(10.0, 3, 1_000);
        for _ in 0..3 {
            assert_eq!(b.try_take(1_000), Ok(()));
        }
        assert_eq!(b.try_take(1_000), Err(100));
        assert_eq!(b.try_take(1_050), Err(50));
        assert_eq!(b.try_take(1_100), Ok(()));
        // A long pause refills only up to the burst.
        assert!((b.level(100_000) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_call_that_cannot_wait_takes_a_token_all_the_same() {
        let mut b = TokenBucket::new(10.0, 1, 1_000);
        b.take_now(1_000);
        b.take_now(1_000);
        // Two taken from one: the next waits for two refills.
        assert_eq!(b.try_take(1_000), Err(200));
        assert_eq!(b.try_take(1_200), Ok(()));
    }

    #[test]
    fn clock_going_backwards_does_not_mint_tokens() {
        let mut b = TokenBucket::new(1.0, 1, 5_000);
        assert_eq!(b.try_take(5_000), Ok(()));
        assert!(b.try_take(4_000).is_err());
        assert!(b.try_take(5_500).is_err());
        assert_eq!(b.try_take(6_000), Ok(()));
    }
}
