use super::*;
use std::os::unix::fs::PermissionsExt;

/// A fake plugin in `dir` that answers VERSION with `versions`.
fn fake(dir: &Path, name: &str, versions: &[&str]) {
    let list: Vec<String> = versions.iter().map(|v| format!("\"{v}\"")).collect();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncat >/dev/null\necho '{{\"cniVersion\":\"0.4.0\",\"supportedVersions\":[{}]}}'\n",
            list.join(",")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn conflist() -> serde_json::Value {
    serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [
        {"type": "bridge", "ipam": {"type": "ipool"}},
        {"type": "portmap"}]})
}

#[test]
fn every_plugin_type_is_named_once() {
    assert_eq!(plugin_types(&conflist()), ["bridge", "ipool", "portmap"]);
}

#[test]
fn the_highest_version_every_plugin_supports() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), "ipool", &["0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    fake(dir.path(), "bridge", &["0.3.0", "0.3.1", "0.4.0", "1.0.0"]);
    fake(dir.path(), "portmap", &["0.4.0", "1.0.0", "1.1.0"]);
    let chain = common_version(&conflist(), dir.path()).unwrap();
    assert_eq!(chain.version, "1.0.0");
    assert!(chain.assumed.is_empty());
    fake(dir.path(), "bridge", &["0.4.0", "1.0.0", "1.1.0"]);
    assert_eq!(
        common_version(&conflist(), dir.path()).unwrap().version,
        "1.1.0"
    );
    fake(dir.path(), "portmap", &["0.3.0"]);
    let e = common_version(&conflist(), dir.path()).unwrap_err();
    assert!(matches!(e, ChainError::NoCommonVersion(_)), "{e}");
}

#[test]
fn a_missing_plugin_is_named() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), "ipool", &["1.1.0"]);
    let e = common_version(&conflist(), dir.path()).unwrap_err();
    assert_eq!(
        e,
        ChainError::Missing {
            missing: vec!["bridge".into(), "portmap".into()],
            dir: dir.path().display().to_string()
        }
    );
    assert!(e.to_string().contains("bridge, portmap"), "{e}");
}

#[test]
fn a_plugin_that_cannot_be_run_here_is_taken_at_the_templates_version() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), "ipool", &["0.4.0", "1.0.0", "1.1.0"]);
    fake(dir.path(), "portmap", &["0.4.0", "1.0.0", "1.1.0"]);
    // exec fails as for a dynamically linked plugin in an image without a loader.
    let bridge = dir.path().join("bridge");
    std::fs::write(&bridge, "#!/nonexistent/loader\n").unwrap();
    std::fs::set_permissions(&bridge, std::fs::Permissions::from_mode(0o755)).unwrap();
    let chain = common_version(&conflist(), dir.path()).unwrap();
    assert_eq!(chain.version, "1.0.0", "the template's, not 1.1.0");
    assert_eq!(chain.assumed.len(), 1, "{chain:?}");
    assert!(
        chain.assumed[0].starts_with("bridge (cannot be run here"),
        "{chain:?}"
    );
    // A template without a version to assume: refused, naming the plugin.
    let mut c = conflist();
    c["cniVersion"] = "".into();
    let e = common_version(&c, dir.path()).unwrap_err();
    assert!(e.to_string().contains("plugin bridge"), "{e}");
    // A plugin that runs but answers nothing useful is refused too.
    std::fs::write(&bridge, "#!/bin/sh\necho not json\n").unwrap();
    let e = common_version(&conflist(), dir.path()).unwrap_err();
    assert!(matches!(e, ChainError::NoVersion { .. }), "{e}");
}
