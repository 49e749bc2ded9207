use super::render;

#[test]
fn any_width_renders() {
    let long = "n".repeat(70_000);
    let out = render(&["NETWORK", "IN-USE"], vec![vec![long.clone(), "1".into()]]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[1], format!("{long}  1"));
    assert!(lines[0].starts_with("NETWORK ") && lines[0].ends_with("  IN-USE"));
    assert_eq!(lines[0].len(), 70_000 + 2 + 6);
    let short = render(&["A", "B"], vec![vec!["é".into(), "x".into()]]);
    assert_eq!(short, "A  B\né  x\n");
}
