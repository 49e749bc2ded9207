//! The fake apiserver the tests run against: `ipool_testkit::fake_api` (shared with
//! `ipool-bench`).
pub use ipool_testkit::fake_api::*;
