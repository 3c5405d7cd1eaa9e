//! Adversarial suite: in virtual mode nothing outside the root is ever read, listed, written or
//! deleted, whatever symlinks, path spellings or races the agent (or a process beside it) uses.

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use deepagents_backends::{
    Backend, BackendContext, BackendError, CompositeBackend, FileOpError, FilesystemBackend,
    GrepQuery, ReadResult, StateBackend, VPath,
};
use tempfile::TempDir;

const CANARY: &str = "CANARY-SECRET-do-not-leak\n";
const SIBLING: &str = "SIBLING-SECRET\n";

fn p(path: &str) -> VPath {
    VPath::parse(path).unwrap()
}

fn cx() -> BackendContext {
    BackendContext::default()
}

/// `tmp/root` (the backend), `tmp/outside/canary.txt`, and `tmp/root2/secret.txt` (a sibling
/// whose name extends the root's, the classic prefix-check hole).
struct World {
    tmp: TempDir,
    backend: FilesystemBackend,
}

impl World {
    fn new() -> Self {
        Self::with(true)
    }

    /// `follow`: whether in-root symlinks are followed (`openat2`) or all refused (the walk).
    fn with(follow: bool) -> Self {
        let tmp = TempDir::new().unwrap();
        std::fs::create_dir_all(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/canary.txt"), CANARY).unwrap();
        std::fs::create_dir_all(tmp.path().join("root2")).unwrap();
        std::fs::write(tmp.path().join("root2/secret.txt"), SIBLING).unwrap();
        let backend = FilesystemBackend::builder(tmp.path().join("root"))
            .follow_symlinks(follow)
            .build()
            .unwrap();
        Self { tmp, backend }
    }

    fn root(&self) -> &Path {
        self.backend.root()
    }

    fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    /// Everything outside the root, by path, with contents.
    fn outside_snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut seen = BTreeMap::new();
        for dir in [self.outside(), self.tmp.path().join("root2")] {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap_or_default();
                seen.insert(path, data);
            }
        }
        seen
    }

    /// The adversarial symlinks, by name.
    fn plant_links(&self) -> Vec<&'static str> {
        let root = self.root();
        let outside = self.outside();
        let links: Vec<(&str, PathBuf)> = vec![
            ("to_slash", "/".into()),
            ("to_etc", "/etc".into()),
            ("to_sibling", "../root2".into()),
            ("to_outside_file", "../outside/canary.txt".into()),
            ("to_outside_abs", outside.clone()),
            ("to_outside_file_abs", outside.join("canary.txt")),
            ("deep_escape", "sub/../../outside".into()),
            ("proc_root", "/proc/self/root".into()),
            ("proc_cwd", "/proc/self/cwd".into()),
            ("loop_a", "loop_b".into()),
            ("loop_b", "loop_a".into()),
            ("self_loop", "self_loop".into()),
            ("dangling_out", "../outside/not-yet.txt".into()),
        ];
        std::fs::create_dir_all(root.join("sub")).unwrap();
        // A symlinked parent directory deeper in the tree, and a chain through it.
        symlink("../../outside", root.join("sub/up")).unwrap();
        symlink("sub/up", root.join("chain")).unwrap();
        let mut names = vec!["sub/up", "chain"];
        for (name, target) in links {
            symlink(&target, root.join(name)).unwrap();
            names.push(name);
        }
        names
    }
}

fn is_refusal(error: &BackendError) -> bool {
    matches!(
        error,
        BackendError::PermissionDenied { .. }
            | BackendError::NotFound { .. }
            | BackendError::NotADirectory { .. }
            | BackendError::IsDirectory { .. }
    )
}

fn leaks(text: &str) -> bool {
    text.contains("CANARY") || text.contains("SIBLING") || text.contains("root:x:0")
}

fn assert_no_leak<T: std::fmt::Debug>(what: &str, value: &T) {
    let shown = format!("{value:?}");
    assert!(!leaks(&shown), "{what} leaked outside content: {shown}");
}

/// Reads must fail (or find nothing in the root) but never return outside content.
async fn assert_unreadable(b: &FilesystemBackend, path: &str) {
    let read = b.read(&cx(), &p(path), 0, 1000).await;
    assert_no_leak(path, &read);
    if let Err(error) = &read {
        assert!(is_refusal(error), "{path}: unexpected error kind {error:?}");
    }
    assert_no_leak(path, &b.read_raw(&cx(), &p(path)).await);
    assert_no_leak(path, &b.download_files(&cx(), vec![path.into()]).await);
    let ls = b.ls(&cx(), &p(path)).await;
    assert_no_leak(path, &ls);
    // Listing through a link that leaves the root lists nothing.
    if let Ok(entries) = &ls {
        assert!(
            entries.is_empty() || !path.contains("to_"),
            "{path}: {entries:?}"
        );
    }
}

#[tokio::test]
async fn symlinks_never_lead_outside() {
    symlinks_never_lead_outside_in(true).await;
}

#[tokio::test]
async fn symlinks_never_lead_outside_without_following() {
    symlinks_never_lead_outside_in(false).await;
}

async fn symlinks_never_lead_outside_in(follow: bool) {
    let world = World::with(follow);
    let before = world.outside_snapshot();
    let links = world.plant_links();
    let b = &world.backend;
    for link in &links {
        for suffix in [
            "",
            "/canary.txt",
            "/secret.txt",
            "/passwd",
            "/etc/passwd",
            "/x/y",
        ] {
            let path = format!("/{link}{suffix}");
            assert_unreadable(b, &path).await;
        }
    }
    // Every link that leaves the root is refused outright (not silently followed).
    for link in [
        "to_outside_file",
        "to_outside_abs",
        "to_sibling",
        "chain",
        "sub/up",
        "to_etc",
    ] {
        let error = b
            .read(&cx(), &p(&format!("/{link}")), 0, 10)
            .await
            .unwrap_err();
        assert!(is_refusal(&error), "{link}: {error:?}");
        let error = b.ls(&cx(), &p(&format!("/{link}"))).await;
        assert!(
            error.is_err() || link == "to_outside_file",
            "{link}: {error:?}"
        );
    }
    for link in ["loop_a", "self_loop"] {
        let error = b
            .read(&cx(), &p(&format!("/{link}")), 0, 10)
            .await
            .unwrap_err();
        assert!(
            matches!(error, BackendError::PermissionDenied { .. }),
            "{link}: {error:?}"
        );
    }
    // Listing the root shows the links' own names only, with no outside metadata.
    let listed = b.ls(&cx(), &p("/")).await.unwrap();
    assert_no_leak("ls /", &listed);
    let outside_file = listed
        .iter()
        .find(|e| e.path == "/to_outside_file")
        .unwrap();
    assert_eq!(outside_file.size, 0, "the canary's size must not show");
    assert!(
        !listed
            .iter()
            .any(|e| e.path == "/to_outside_abs" && e.is_dir)
    );
    assert_eq!(world.outside_snapshot(), before);
}

#[tokio::test]
async fn search_never_walks_outside() {
    search_never_walks_outside_in(true).await;
}

#[tokio::test]
async fn search_never_walks_outside_without_following() {
    search_never_walks_outside_in(false).await;
}

async fn search_never_walks_outside_in(follow: bool) {
    let world = World::with(follow);
    let links = world.plant_links();
    std::fs::write(world.root().join("inside.txt"), "inside needle\n").unwrap();
    let b = &world.backend;
    let all = b.glob(&cx(), "**/*", &p("/")).await.unwrap();
    assert_no_leak("glob", &all);
    let paths: Vec<&str> = all.files.iter().map(|f| f.path.as_str()).collect();
    assert!(paths.contains(&"/inside.txt"));
    for forbidden in ["canary", "secret", "passwd", "hostname"] {
        assert!(
            !paths.iter().any(|p| p.contains(forbidden)),
            "{forbidden} in {paths:?}"
        );
    }
    for pattern in [
        "canary.txt",
        "*.txt",
        "**/canary.txt",
        "passwd",
        "**/secret.txt",
    ] {
        let found = b.glob(&cx(), pattern, &p("/")).await.unwrap();
        assert!(
            found.files.iter().all(|f| f.path == "/inside.txt"),
            "{pattern}: {found:?}"
        );
    }
    for needle in ["CANARY", "SIBLING", "root:"] {
        let found = b
            .grep(&cx(), &GrepQuery::literal(needle, p("/")))
            .await
            .unwrap();
        assert!(found.matches.is_empty(), "{needle}: {found:?}");
    }
    for link in &links {
        let base = p(&format!("/{link}"));
        let globbed = b.glob(&cx(), "*", &base).await;
        assert_no_leak(link, &globbed);
        if let Ok(globbed) = globbed {
            assert!(globbed.files.is_empty(), "{link}: {globbed:?}");
        }
        let grepped = b
            .grep(&cx(), &GrepQuery::literal("SECRET", base.clone()))
            .await;
        assert_no_leak(link, &grepped);
        if let Ok(grepped) = grepped {
            assert!(grepped.matches.is_empty(), "{link}: {grepped:?}");
        }
        let grepped = b
            .grep(
                &cx(),
                &GrepQuery {
                    regex: true,
                    ..GrepQuery::literal(".", base)
                },
            )
            .await;
        assert_no_leak(link, &grepped);
    }
}

#[tokio::test]
async fn writes_through_symlinks_never_touch_outside() {
    writes_through_symlinks_never_touch_outside_in(true).await;
}

#[tokio::test]
async fn writes_through_symlinks_never_touch_outside_without_following() {
    writes_through_symlinks_never_touch_outside_in(false).await;
}

async fn writes_through_symlinks_never_touch_outside_in(follow: bool) {
    let world = World::with(follow);
    let before = world.outside_snapshot();
    let links = world.plant_links();
    let b = &world.backend;
    for link in &links {
        for suffix in [
            "",
            "/canary.txt",
            "/new.txt",
            "/deep/new.txt",
            "/secret.txt",
        ] {
            let path = p(&format!("/{link}{suffix}"));
            let written = b.write(&cx(), &path, "PWNED").await;
            assert!(
                written.is_err() || !link.starts_with("to_"),
                "{path}: {written:?}"
            );
            let _ = b.edit(&cx(), &path, "CANARY", "PWNED", true).await;
            let _ = b.edit(&cx(), &path, "SIBLING", "PWNED", true).await;
            let uploaded = b
                .upload_files(&cx(), vec![(path.to_string(), b"PWNED".to_vec())])
                .await
                .value;
            assert_eq!(uploaded.len(), 1);
            assert_eq!(world.outside_snapshot(), before, "after writing {path}");
        }
    }
    // The dangling link must not create its target outside.
    assert!(!world.outside().join("not-yet.txt").exists());
    // Deleting through links removes nothing outside; deleting a link removes only the link.
    for link in &links {
        for suffix in ["/canary.txt", "/secret.txt"] {
            let _ = b.delete(&cx(), &p(&format!("/{link}{suffix}"))).await;
        }
    }
    assert_eq!(world.outside_snapshot(), before);
    for link in &links {
        let deleted = b.delete(&cx(), &p(&format!("/{link}"))).await;
        assert!(
            matches!(deleted, Ok(ref c) if c.value == 1) || deleted.is_err(),
            "{link}: {deleted:?}"
        );
        assert_eq!(world.outside_snapshot(), before, "after deleting {link}");
    }
    // Recursive deletion of a directory holding links to outside deletes the links only.
    std::fs::create_dir_all(world.root().join("holder")).unwrap();
    symlink(world.outside(), world.root().join("holder/out")).unwrap();
    symlink("/", world.root().join("holder/slash")).unwrap();
    assert_eq!(b.delete(&cx(), &p("/holder")).await.unwrap().value, 2);
    assert_eq!(world.outside_snapshot(), before);
    assert!(Path::new("/etc").exists());
}

#[tokio::test]
async fn dot_dot_is_rejected_everywhere() {
    let world = World::new();
    let before = world.outside_snapshot();
    let b = &world.backend;
    let sneaky = [
        "/../outside/canary.txt",
        "/..",
        "..",
        "../outside/canary.txt",
        "/a/../../outside/canary.txt",
        "/a/..",
        "/./../outside",
        "//..//outside",
        "/a/b/../../../outside/canary.txt",
        "/outside/..",
        "..\\outside\\canary.txt",
        "/a\\..\\..\\outside",
        "~/canary.txt",
        "C:/outside",
        "/\0/etc/passwd",
    ];
    for raw in sneaky {
        assert!(VPath::parse(raw).is_err(), "{raw} must be rejected");
        let uploaded = b
            .upload_files(&cx(), vec![(raw.into(), b"PWNED".to_vec())])
            .await
            .value;
        assert_eq!(uploaded, [Err(FileOpError::InvalidPath)], "{raw}");
        let downloaded = b.download_files(&cx(), vec![raw.into()]).await;
        assert_eq!(downloaded, [Err(FileOpError::InvalidPath)], "{raw}");
    }
    assert_eq!(world.outside_snapshot(), before);
}

#[tokio::test]
async fn odd_spellings_are_just_names_inside_the_root() {
    let world = World::new();
    let before = world.outside_snapshot();
    let b = &world.backend;
    let names = [
        "/%2e%2e/outside/canary.txt",
        "/%2e%2e%2foutside%2fcanary.txt",
        "/..%2f..%2foutside",
        "/%252e%252e/x",
        "/\u{2025}/outside/canary.txt",         // two dot leader
        "/\u{FF0E}\u{FF0E}/outside/canary.txt", // fullwidth full stops
        "/\u{2024}\u{2024}/outside/canary.txt", // one dot leaders
        "/..\u{200B}/outside/canary.txt",       // zero-width space
        "/.../outside/canary.txt",
        "/. ./outside",
        "/\u{FE52}\u{FE52}/x", // small full stops
    ];
    for name in names {
        let path = p(name);
        b.write(&cx(), &path, "inside").await.unwrap();
        let host = world.root().join(name.trim_start_matches('/'));
        assert_eq!(std::fs::read_to_string(&host).unwrap(), "inside", "{name}");
        assert!(host.starts_with(world.root()));
        match b.read(&cx(), &path, 0, 10).await.unwrap() {
            ReadResult::Text { lines, .. } => assert_eq!(lines, ["inside"]),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(world.outside_snapshot(), before);
}

#[tokio::test]
async fn absolute_host_paths_mean_paths_inside_the_root() {
    let world = World::new();
    let before = world.outside_snapshot();
    let b = &world.backend;
    let passwd_before = std::fs::read("/etc/passwd").ok();
    // The host's files are not visible under their host paths.
    assert!(matches!(
        b.read(&cx(), &p("/etc/passwd"), 0, 10).await,
        Err(BackendError::NotFound { .. })
    ));
    let canary_host = world.outside().join("canary.txt");
    let as_virtual = p(canary_host.to_str().unwrap());
    assert!(matches!(
        b.read(&cx(), &as_virtual, 0, 10).await,
        Err(BackendError::NotFound { .. })
    ));
    // Writing them creates files inside the root.
    b.write(&cx(), &p("/etc/passwd"), "fake").await.unwrap();
    assert_eq!(
        std::fs::read_to_string(world.root().join("etc/passwd")).unwrap(),
        "fake"
    );
    assert_eq!(std::fs::read("/etc/passwd").ok(), passwd_before);
    b.write(&cx(), &as_virtual, "shadow copy").await.unwrap();
    let inside = world.root().join(canary_host.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read_to_string(inside).unwrap(), "shadow copy");
    assert_eq!(b.delete(&cx(), &as_virtual).await.unwrap().value, 1);
    assert_eq!(world.outside_snapshot(), before);
    // The root's own host path is just a name too.
    let root_as_virtual = p(world.root().to_str().unwrap());
    assert!(matches!(
        b.ls(&cx(), &root_as_virtual).await,
        Err(BackendError::NotFound { .. })
    ));
}

/// A process beside the agent swaps a directory for a symlink to outside while the agent reads
/// and writes through it: the kernel-side resolution must never follow the swapped link out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_a_directory_for_a_symlink_never_escapes() {
    swapping_a_directory_for_a_symlink_never_escapes_in(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_a_directory_for_a_symlink_never_escapes_without_following() {
    swapping_a_directory_for_a_symlink_never_escapes_in(false).await;
}

async fn swapping_a_directory_for_a_symlink_never_escapes_in(follow: bool) {
    let world = World::with(follow);
    let before = world.outside_snapshot();
    let root = world.root().to_path_buf();
    std::fs::create_dir_all(root.join("race")).unwrap();
    std::fs::write(root.join("race/canary.txt"), "inside copy\n").unwrap();
    symlink(world.outside(), root.join("swap")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let root = root.clone();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Atomically exchange the directory and the symlink: `race` alternates.
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    root.join("race"),
                    rustix::fs::CWD,
                    root.join("swap"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let b = &world.backend;
    let mut refused = 0u32;
    for i in 0..600u32 {
        let read = b.read(&cx(), &p("/race/canary.txt"), 0, 10).await;
        assert_no_leak("race read", &read);
        refused += u32::from(read.is_err());
        assert_no_leak("race raw", &b.read_raw(&cx(), &p("/race/canary.txt")).await);
        let _ = b
            .write(&cx(), &p(&format!("/race/w{}.txt", i % 7)), "PWNED")
            .await;
        let _ = b
            .write(&cx(), &p("/race/canary.txt"), "inside copy\n")
            .await;
        let _ = b
            .edit(&cx(), &p("/race/canary.txt"), "CANARY", "PWNED", true)
            .await;
        let _ = b
            .upload_files(&cx(), vec![("/race/up.bin".into(), b"PWNED".to_vec())])
            .await;
        assert_no_leak("race ls", &b.ls(&cx(), &p("/race")).await);
        if i % 10 == 0 {
            let _ = b.delete(&cx(), &p(&format!("/race/w{}.txt", i % 7))).await;
            let _ = b.delete(&cx(), &p("/race/new")).await;
            let globbed = b.glob(&cx(), "*.txt", &p("/race")).await;
            assert_no_leak("race glob", &globbed);
            let globbed = b.glob(&cx(), "**/*", &p("/")).await;
            assert_no_leak("race glob /", &globbed);
            let grepped = b.grep(&cx(), &GrepQuery::literal("CANARY", p("/"))).await;
            assert_no_leak("race grep", &grepped);
            let grepped = b
                .grep(&cx(), &GrepQuery::literal("CANARY", p("/race")))
                .await;
            assert_no_leak("race grep base", &grepped);
        }
        let _ = b.write(&cx(), &p("/race/new/deep.txt"), "PWNED").await;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0);
    // Evidence the race was real: some operations met the symlink and were refused.
    eprintln!("swaps: {swaps}, refused reads: {refused}");
    assert_eq!(world.outside_snapshot(), before, "the outside was modified");
    assert!(!world.outside().join("new").exists());
}

/// A process beside the agent swaps the file the agent writes for a symlink to an outside file
/// (the last path component, which `O_NOFOLLOW` or `RESOLVE_BENEATH` must catch at the moment of
/// the open, not at some check before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_a_file_for_a_symlink_never_escapes() {
    swapping_a_file_for_a_symlink_never_escapes_in(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_a_file_for_a_symlink_never_escapes_without_following() {
    swapping_a_file_for_a_symlink_never_escapes_in(false).await;
}

async fn swapping_a_file_for_a_symlink_never_escapes_in(follow: bool) {
    let world = World::with(follow);
    let before = world.outside_snapshot();
    let root = world.root().to_path_buf();
    std::fs::create_dir_all(root.join("race")).unwrap();
    std::fs::write(root.join("race/target.txt"), "inside copy\n").unwrap();
    // One relative and one absolute link, exchanged with the file in turn.
    symlink("../../outside/canary.txt", root.join("race/rel")).unwrap();
    symlink(world.outside().join("canary.txt"), root.join("race/abs")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let race = root.join("race");
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let link = if swaps % 4 < 2 { "rel" } else { "abs" };
                // Each exchange flips `target.txt` between the regular file and a link.
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    race.join("target.txt"),
                    rustix::fs::CWD,
                    race.join(link),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let b = &world.backend;
    let target = p("/race/target.txt");
    let (mut refused_writes, mut refused_edits) = (0u32, 0u32);
    for _ in 0..600u32 {
        let written = b.write(&cx(), &target, "PWNED inside copy\n").await;
        refused_writes += u32::from(written.is_err());
        // "do-not-leak" and "SECRET" occur only in the canary.
        let edited = b.edit(&cx(), &target, "do-not-leak", "PWNED", true).await;
        assert!(
            edited.is_err(),
            "the inside file never holds the canary's text"
        );
        refused_edits += u32::from(matches!(edited, Err(BackendError::PermissionDenied { .. })));
        let _ = b.edit(&cx(), &target, "SECRET", "PWNED", false).await;
        let _ = b
            .upload_files(&cx(), vec![(target.to_string(), b"PWNED".to_vec())])
            .await;
        assert_no_leak("race read", &b.read(&cx(), &target, 0, 10).await);
        assert_no_leak("race raw", &b.read_raw(&cx(), &target).await);
        assert_no_leak(
            "race download",
            &b.download_files(&cx(), vec![target.to_string()]).await,
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0);
    eprintln!("swaps: {swaps}, refused writes: {refused_writes}, refused edits: {refused_edits}");
    assert_eq!(world.outside_snapshot(), before, "the outside was modified");
    // Whichever way the last exchange left it, the links are still links to the canary and
    // the file is still a file inside the root.
    let canary = std::fs::read_to_string(world.outside().join("canary.txt")).unwrap();
    assert_eq!(canary, CANARY);
    let kinds: Vec<bool> = ["target.txt", "rel", "abs"]
        .iter()
        .map(|name| {
            std::fs::symlink_metadata(root.join("race").join(name))
                .unwrap()
                .file_type()
                .is_symlink()
        })
        .collect();
    assert_eq!(kinds.iter().filter(|link| **link).count(), 2, "{kinds:?}");
}

/// The same refusals hold when the disk backend is a route of a composite: routing strips the
/// prefix but the backend still resolves beneath its own root, and errors name the full path.
#[tokio::test]
async fn escapes_are_refused_through_a_composite_mount() {
    let world = World::new();
    let before = world.outside_snapshot();
    world.plant_links();
    std::fs::write(world.root().join("inside.txt"), "inside needle\n").unwrap();
    let composite = CompositeBackend::new(Arc::new(StateBackend::default()))
        .route("/disk/", Arc::new(world.backend.clone()))
        .unwrap();
    let b: &dyn Backend = &composite;
    for path in [
        "/disk/to_outside_file",
        "/disk/to_outside_abs/canary.txt",
        "/disk/to_sibling/secret.txt",
        "/disk/chain/canary.txt",
        "/disk/sub/up/canary.txt",
        "/disk/deep_escape/canary.txt",
        "/disk/proc_root/etc/passwd",
        "/disk/loop_a",
    ] {
        let read = b.read(&cx(), &p(path), 0, 100).await;
        assert_no_leak(path, &read);
        let error = read.unwrap_err();
        assert!(is_refusal(&error), "{path}: {error:?}");
        assert_eq!(
            crate::conformance::error_path(&error),
            Some(path),
            "the error names the path the agent used"
        );
        assert_no_leak(path, &b.read_raw(&cx(), &p(path)).await);
        assert_no_leak(path, &b.download_files(&cx(), vec![path.into()]).await);
        assert!(b.write(&cx(), &p(path), "PWNED").await.is_err(), "{path}");
        assert!(
            b.edit(&cx(), &p(path), "CANARY", "PWNED", true)
                .await
                .is_err(),
            "{path}"
        );
        let uploaded = b
            .upload_files(&cx(), vec![(path.into(), b"PWNED".to_vec())])
            .await
            .value;
        assert!(uploaded[0].is_err(), "{path}: {uploaded:?}");
        let _ = b.delete(&cx(), &p(&format!("{path}/x"))).await;
        assert_eq!(world.outside_snapshot(), before, "after {path}");
    }
    // `..` never gets as far as the route.
    for raw in ["/disk/../outside/canary.txt", "/disk/.."] {
        let uploaded = b
            .upload_files(&cx(), vec![(raw.into(), b"PWNED".to_vec())])
            .await
            .value;
        assert_eq!(uploaded, [Err(FileOpError::InvalidPath)], "{raw}");
        let downloaded = b.download_files(&cx(), vec![raw.into()]).await;
        assert_eq!(downloaded, [Err(FileOpError::InvalidPath)], "{raw}");
    }
    // Searches from above the mount fan out into the route and still stay inside its root.
    let globbed = b.glob(&cx(), "**/*", &p("/")).await.unwrap();
    assert_no_leak("glob /", &globbed);
    let paths: Vec<&str> = globbed.files.iter().map(|f| f.path.as_str()).collect();
    assert!(paths.contains(&"/disk/inside.txt"), "{paths:?}");
    assert!(
        !paths
            .iter()
            .any(|p| p.contains("canary") || p.contains("secret")),
        "{paths:?}"
    );
    for needle in ["CANARY", "SIBLING", "root:"] {
        let found = b
            .grep(&cx(), &GrepQuery::literal(needle, p("/")))
            .await
            .unwrap();
        assert!(found.matches.is_empty(), "{needle}: {found:?}");
    }
    let found = b
        .grep(&cx(), &GrepQuery::literal("needle", p("/disk")))
        .await
        .unwrap();
    assert_eq!(found.matches.len(), 1);
    assert_eq!(found.matches[0].path, "/disk/inside.txt");
    assert_no_leak("ls", &b.ls(&cx(), &p("/disk")).await);
    assert_eq!(world.outside_snapshot(), before);
}

/// Writes go to a temporary file beside the target and are renamed into place: through a
/// symlinked parent directory that points outside (relative or absolute, directly or through a
/// chain), neither the temporary file nor the rename may land outside, with or without
/// in-root symlinks followed, and nothing is left behind in the root either.
#[tokio::test]
async fn atomic_writes_never_land_outside_through_a_symlinked_parent() {
    for follow in [true, false] {
        let world = World::with(follow);
        let before = world.outside_snapshot();
        let root = world.root().to_path_buf();
        symlink("../outside", root.join("rel_dir")).unwrap();
        symlink(world.outside(), root.join("abs_dir")).unwrap();
        std::fs::create_dir_all(root.join("inner")).unwrap();
        symlink("../rel_dir", root.join("inner/hop")).unwrap();
        let b = &world.backend;
        for dir in ["/rel_dir", "/abs_dir", "/inner/hop"] {
            for name in ["canary.txt", "fresh.txt"] {
                let path = p(&format!("{dir}/{name}"));
                let written = b.write(&cx(), &path, "PWNED").await;
                assert!(
                    matches!(written, Err(ref e) if is_refusal(e)),
                    "{path}: {written:?}"
                );
                let edited = b.edit(&cx(), &path, "CANARY", "PWNED", true).await;
                assert!(edited.is_err(), "{path}: {edited:?}");
                let uploaded = b
                    .upload_files(&cx(), vec![(path.to_string(), b"PWNED".to_vec())])
                    .await
                    .value;
                assert!(uploaded[0].is_err(), "{path}: {uploaded:?}");
                // The snapshot lists the outside directory: a stray temporary file shows too.
                assert_eq!(world.outside_snapshot(), before, "after writing {path}");
            }
        }
        let stray: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .chain(std::fs::read_dir(root.join("inner")).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(stray.is_empty(), "follow={follow}: {stray:?}");
        // The links are still links.
        for link in ["rel_dir", "abs_dir", "inner/hop"] {
            let meta = std::fs::symlink_metadata(root.join(link)).unwrap();
            assert!(meta.file_type().is_symlink(), "{link}");
        }
    }
}

/// The names of the directory the race below swaps in: distinctive, so any trace of them in a
/// result, error or skipped-file note is a leak.
const OUTSIDE_NAMES: [&str; 3] = [
    "OUTSIDE-NAME-file.txt",
    "OUTSIDE-NAME-other.txt",
    "OUTSIDE-NAME-dir",
];

/// A directory inside the root flips, by an atomic rename, between itself and a symlink to a
/// directory outside (`flip -> ../outside-flip`), while ls, glob and grep run over it. Walks list
/// directories through descriptors opened beneath the root, so whatever the timing, no answer may
/// name anything of the outside directory: not in results, errors or grep's skipped files.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn walks_racing_a_flipped_directory_never_name_outside_entries() {
    let tmp = TempDir::new().unwrap();
    let outside = tmp.path().join("outside-flip");
    std::fs::create_dir_all(outside.join("OUTSIDE-NAME-dir")).unwrap();
    for name in &OUTSIDE_NAMES[..2] {
        std::fs::write(outside.join(name), "needle outside\n").unwrap();
    }
    std::fs::write(
        outside.join("OUTSIDE-NAME-dir/OUTSIDE-NAME-deep.txt"),
        "needle\n",
    )
    .unwrap();
    let fs = FilesystemBackend::new(tmp.path().join("root")).unwrap();
    let root = fs.root().to_path_buf();
    std::fs::create_dir_all(root.join("flip/sub")).unwrap();
    for i in 0..20 {
        std::fs::write(root.join(format!("flip/inside-{i}.txt")), "needle inside\n").unwrap();
    }
    std::fs::write(root.join("flip/sub/deep.txt"), "needle\n").unwrap();
    std::fs::write(root.join("top.txt"), "needle\n").unwrap();
    // Relative, as in the report: from the root, `../outside-flip` is the outside directory.
    symlink("../outside-flip", root.join("flip-link")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let root = root.clone();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    root.join("flip"),
                    rustix::fs::CWD,
                    root.join("flip-link"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let shell = deepagents_backends::LocalShellBackend::new(fs.clone());
    let backends: [(&str, &dyn Backend); 2] = [("filesystem", &fs), ("local shell", &shell)];
    let check = |what: &str, shown: String| {
        assert!(
            !shown.contains("OUTSIDE-NAME") && !shown.contains("outside-flip"),
            "{what} named an outside entry: {shown}"
        );
    };
    // Evidence the race was real: walks that found the inside directory, and ones that did not.
    let (mut saw_inside, mut missed_inside) = (0u32, 0u32);
    let started = std::time::Instant::now();
    for (name, b) in backends {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1000);
        let mut rounds = 0u32;
        while rounds < 300 && std::time::Instant::now() < deadline {
            rounds += 1;
            check(name, format!("{:?}", b.ls(&cx(), &p("/flip")).await));
            check(name, format!("{:?}", b.ls(&cx(), &p("/flip/sub")).await));
            check(name, format!("{:?}", b.ls(&cx(), &p("/")).await));
            check(name, format!("{:?}", b.glob(&cx(), "**/*", &p("/")).await));
            check(name, format!("{:?}", b.glob(&cx(), "*", &p("/flip")).await));
            check(
                name,
                format!("{:?}", b.glob(&cx(), "*", &p("/flip-link")).await),
            );
            let grepped = b.grep(&cx(), &GrepQuery::literal("needle", p("/"))).await;
            check(name, format!("{grepped:?}"));
            // The Debug form holds the skipped files' paths and reasons, which the grep tool's
            // "could not search" note is made of.
            if let Ok(grepped) = &grepped {
                let inside = grepped.matches.iter().any(|m| m.path.contains("inside-"));
                saw_inside += u32::from(inside);
                missed_inside += u32::from(!inside);
            }
            for base in ["/flip", "/flip-link", "/flip/sub"] {
                let grepped = b.grep(&cx(), &GrepQuery::literal("needle", p(base))).await;
                check(name, format!("{grepped:?}"));
            }
        }
        eprintln!("{name}: {rounds} rounds");
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!(
        "swaps: {swaps}, greps of / that saw the inside files: {saw_inside}, that did not: \
         {missed_inside}, in {:?}",
        started.elapsed()
    );
    assert!(swaps > 0);
}
