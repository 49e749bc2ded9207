use super::parse_listen;

#[test]
fn metrics_listen_takes_an_address_and_port_in_every_spelling_kubernetes_gives() {
    assert_eq!(
        parse_listen("10.0.0.5:9655").unwrap().to_string(),
        "10.0.0.5:9655"
    );
    assert_eq!(
        parse_listen("[fd00::5]:9655").unwrap().to_string(),
        "[fd00::5]:9655"
    );
    assert_eq!(
        parse_listen("fd00::5:9655").unwrap().to_string(),
        "[fd00::5]:9655"
    );
    for bad in ["10.0.0.5", "node-1:9655", "10.0.0.5:99999", ":9655", ""] {
        let e = parse_listen(bad).unwrap_err();
        assert!(e.contains(&format!("{bad:?}")), "{e}");
    }
}
