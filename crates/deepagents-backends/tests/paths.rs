//! Virtual path parsing and normalization.

use deepagents_backends::VPath;
use proptest::prelude::*;

#[test]
fn normalizes_harmless_forms() {
    for (raw, normalized) in [
        ("/", "/"),
        ("//", "/"),
        ("/a//b/", "/a/b"),
        ("/a/./b", "/a/b"),
        ("/./", "/"),
        ("/%2e%2e/x", "/%2e%2e/x"),
        ("/．．/x", "/．．/x"),
    ] {
        assert_eq!(VPath::parse(raw).unwrap().as_str(), normalized, "{raw}");
    }
}

#[test]
fn rejects_escapes_with_a_reason() {
    for (raw, reason) in [
        ("", "empty"),
        ("relative/path", "absolute"),
        ("/a/../b", "`..`"),
        ("/..", "`..`"),
        ("/a/..", "`..`"),
        ("~/x", "`~`"),
        ("~", "`~`"),
        ("C:/Windows", "drive"),
        ("c:\\x", "backslash"),
        ("/a\\..\\b", "backslash"),
        ("/a\0b", "control"),
        ("/a\nb", "control"),
    ] {
        let error = VPath::parse(raw).unwrap_err();
        assert!(error.to_string().contains(reason), "{raw:?}: {error}");
    }
}

#[test]
fn prefixes_respect_segment_boundaries() {
    let mem = VPath::parse("/mem").unwrap();
    let memories = VPath::parse("/memories/x").unwrap();
    assert!(!memories.starts_with(&mem));
    assert!(VPath::parse("/mem/x").unwrap().starts_with(&mem));
    assert_eq!(
        VPath::parse("/mem/a/b")
            .unwrap()
            .strip_prefix(&mem)
            .unwrap()
            .as_str(),
        "/a/b"
    );
    assert_eq!(mem.strip_prefix(&mem).unwrap().as_str(), "/");
    assert_eq!(VPath::parse("/b").unwrap().under(&mem).as_str(), "/mem/b");
    assert_eq!(VPath::root().under(&mem).as_str(), "/mem");
    assert_eq!(mem.parent().unwrap(), VPath::root());
}

proptest! {
    #[test]
    fn parsed_paths_are_normal_and_never_climb(raw in "[/a-z.~\\\\:]{0,24}") {
        if let Ok(path) = VPath::parse(&raw) {
            let s = path.as_str();
            prop_assert!(s.starts_with('/'));
            prop_assert!(!s.contains("//"));
            prop_assert!(s == "/" || !s.ends_with('/'));
            prop_assert!(!s.split('/').any(|seg| seg == ".." || seg == "."));
            prop_assert!(!s.contains('\\'));
            // Normalization is idempotent.
            prop_assert_eq!(VPath::parse(s).unwrap(), path);
        }
    }

    #[test]
    fn strip_then_under_round_trips(a in "[a-z]{1,5}", b in "(/[a-z]{1,5}){0,3}") {
        let prefix = VPath::parse(&format!("/{a}")).unwrap();
        let full = VPath::parse(&format!("/{a}{b}")).unwrap();
        let inner = full.strip_prefix(&prefix).unwrap();
        prop_assert_eq!(inner.under(&prefix), full);
    }
}
