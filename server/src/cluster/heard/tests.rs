use super::*;

fn gone(pool: &str, block: &str) -> Watched {
    Watched::BlockGone {
        pool: pool.into(),
        block: block.parse().unwrap(),
    }
}

#[test]
fn each_source_takes_in_its_pools_blocks_once_and_a_restart_once() {
    let h = Heard::default();
    let (mut a, mut b) = (h.now(), h.now());
    h.hear(gone("p", "10.0.0.0/26"));
    h.hear(gone("q", "10.1.0.0/26"));
    let news = h.since("p", &mut a);
    assert_eq!(news.gone, vec!["10.0.0.0/26".parse::<IpNet>().unwrap()]);
    assert!(!news.restarted);
    assert_eq!(h.since("p", &mut a), News::default(), "taken in once");
    assert_eq!(
        h.since("q", &mut b).gone.len(),
        1,
        "another source, its own pace"
    );
    h.hear(Watched::Restarted);
    assert!(h.since("p", &mut a).restarted);
    assert!(!h.since("p", &mut a).restarted);
}

#[test]
fn a_source_fallen_behind_what_is_kept_syncs_everything() {
    let h = Heard::default();
    let mut c = h.now();
    for i in 0..(KEPT + 2) {
        h.hear(gone("q", &format!("10.{}.{}.0/24", i / 256, i % 256)));
    }
    assert!(h.since("p", &mut c).restarted);
    assert!(!h.since("p", &mut c).restarted);
}

#[test]
fn a_pool_written_wakes_the_followers_and_the_engine() {
    let h = Heard::default();
    let (mut pools, mut changes) = (h.pool_changes(), h.changes());
    h.hear(Watched::Pool("p".into()));
    assert!(pools.has_changed().unwrap() && changes.has_changed().unwrap());
    pools.mark_unchanged();
    changes.mark_unchanged();
    h.hear(gone("p", "10.0.0.0/26"));
    assert!(!pools.has_changed().unwrap() && changes.has_changed().unwrap());
}

#[test]
fn a_pool_written_is_news_for_its_sources_only() {
    let h = Heard::default();
    let (mut a, mut b) = (h.now(), h.now());
    h.hear(Watched::Pool("p".into()));
    assert!(h.since("p", &mut a).pool_written);
    assert!(!h.since("p", &mut a).pool_written, "once");
    assert!(!h.since("q", &mut b).pool_written);
}
