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
mod tests;
