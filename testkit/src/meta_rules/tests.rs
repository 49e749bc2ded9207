use super::*;

#[test]
fn names_label_values_and_selectors_by_the_apiservers_rules() {
    assert!(valid_name("a.b-c") && !valid_name("a..b") && !valid_name(""));
    assert!(!valid_name("A") && !valid_name(&"a".repeat(254)));
    assert!(valid_label_value("") && valid_label_value("a_b.c-d"));
    assert!(!valid_label_value(&"a".repeat(64)) && !valid_label_value("-a"));
    let terms = selector_terms("a=b,c!=d,e").unwrap();
    let obj = serde_json::json!({"metadata": {"labels": {"a": "b", "e": "x"}}});
    assert!(labels_match(&obj, &terms));
    assert!(selector_terms(&format!("a={}", "v".repeat(64))).is_err());
}
