//! The sandbox's protected names (`.git`, `.deepagents`, `.agents`) are read-only for the file
//! tools too: write, overwrite, edit, delete and upload are refused whether the names exist or
//! not, under any spelling and through symlinks inside the root; reads and other paths work.

use std::os::unix::fs::symlink;
use std::path::Path;

use deepagents_backends::sandbox::Policy;
use deepagents_backends::{
    Backend, BackendContext, BackendError, FileOpError, FilesystemBackend, LocalShellBackend, VPath,
};
use tempfile::TempDir;

fn p(path: &str) -> VPath {
    VPath::parse(path).unwrap()
}

fn cx() -> BackendContext {
    BackendContext::default()
}

/// A shell backend over `tmp/root` with the default sandbox policy (nothing runs here, so no
/// sandbox engine is needed).
fn sandboxed() -> (TempDir, LocalShellBackend) {
    let tmp = TempDir::new().unwrap();
    let fs = FilesystemBackend::new(tmp.path().join("root")).unwrap();
    let root = fs.root().to_path_buf();
    (
        tmp,
        LocalShellBackend::new(fs).with_sandbox(Policy::workspace_write(root)),
    )
}

/// Every entry below `root`, with file contents, to compare before and after.
fn snapshot(root: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut seen = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let shown = path.strip_prefix(root).unwrap().display().to_string();
            if meta.is_dir() {
                stack.push(path);
                seen.push((shown, None));
            } else if meta.is_file() {
                seen.push((shown, Some(std::fs::read(&path).unwrap())));
            } else {
                seen.push((shown, None));
            }
        }
    }
    seen.sort();
    seen
}

#[track_caller]
fn assert_protected<T: std::fmt::Debug>(what: &str, result: Result<T, BackendError>) {
    match result {
        Err(BackendError::PermissionDenied { reason, .. }) => {
            assert!(reason.contains("is protected"), "{what}: {reason}");
            assert!(reason.contains("[sandbox]"), "{what}: {reason}");
        }
        other => panic!("{what}: expected a protected-name refusal, got {other:?}"),
    }
}

/// Every change of `path` is refused as protected.
async fn assert_unchangeable(b: &dyn Backend, path: &str) {
    let vpath = p(path);
    assert_protected(path, b.write(&cx(), &vpath, "PWNED").await);
    assert_protected(path, b.overwrite(&cx(), &vpath, "PWNED").await);
    assert_protected(path, b.edit(&cx(), &vpath, "old", "PWNED", true).await);
    assert_protected(path, b.delete(&cx(), &vpath).await);
    let uploaded = b
        .upload_files(&cx(), vec![(path.to_owned(), b"PWNED".to_vec())])
        .await;
    assert_eq!(
        uploaded.value,
        [Err(FileOpError::PermissionDenied)],
        "{path}"
    );
}

/// What creates `path` is refused as protected, and what needs it to exist fails.
async fn assert_uncreatable(b: &dyn Backend, path: &str) {
    let vpath = p(path);
    assert_protected(path, b.write(&cx(), &vpath, "PWNED").await);
    assert_protected(path, b.overwrite(&cx(), &vpath, "PWNED").await);
    let uploaded = b
        .upload_files(&cx(), vec![(path.to_owned(), b"PWNED".to_vec())])
        .await;
    assert_eq!(
        uploaded.value,
        [Err(FileOpError::PermissionDenied)],
        "{path}"
    );
    assert!(b.edit(&cx(), &vpath, "old", "PWNED", true).await.is_err());
    assert!(b.delete(&cx(), &vpath).await.is_err());
}

const TARGETS: [&str; 3] = [
    "/.git/hooks/pre-commit",
    "/.deepagents/AGENTS.md",
    "/.agents/skills/x/SKILL.md",
];

#[tokio::test]
async fn protected_names_that_do_not_exist_cannot_be_created() {
    let (_tmp, sh) = sandboxed();
    let root = sh.filesystem().root().to_path_buf();
    for path in TARGETS {
        assert_unchangeable(&sh, path).await;
    }
    // The names themselves, and other spellings of the same paths.
    for path in [
        "/.git",
        "/.deepagents",
        "/.agents",
        "/./.git/config",
        "//.git//hooks/x",
        "/.agents/",
    ] {
        assert_unchangeable(&sh, path).await;
    }
    assert!(snapshot(&root).is_empty(), "{:?}", snapshot(&root));
    // `..` never gets this far: a path with it is refused before any backend sees it.
    assert!(VPath::parse("/.git/../.git/hooks/x").is_err());
}

#[tokio::test]
async fn protected_names_that_exist_cannot_be_changed_but_can_be_read() {
    let (_tmp, sh) = sandboxed();
    let root = sh.filesystem().root().to_path_buf();
    for path in TARGETS {
        let host = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        std::fs::write(&host, "old\n").unwrap();
    }
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    let before = snapshot(&root);
    for path in TARGETS {
        assert_unchangeable(&sh, path).await;
        // A new file beside it, and the directories themselves.
        let sibling = format!("{}/new.txt", path.rsplit_once('/').unwrap().0);
        assert_unchangeable(&sh, &sibling).await;
    }
    for path in ["/.git", "/.git/hooks", "/.deepagents", "/.agents/skills"] {
        assert_protected(path, sh.delete(&cx(), &p(path)).await);
    }
    assert_eq!(snapshot(&root), before);
    // Reads, listings and searches are not changes.
    let read = sh
        .read(&cx(), &p("/.deepagents/AGENTS.md"), 0, 10)
        .await
        .unwrap();
    assert!(format!("{read:?}").contains("old"), "{read:?}");
    assert!(!sh.ls(&cx(), &p("/.git")).await.unwrap().is_empty());
    let found = sh.glob(&cx(), "**/SKILL.md", &p("/.agents")).await.unwrap();
    assert_eq!(found.files.len(), 1, "{found:?}");
}

#[tokio::test]
async fn symlinks_into_protected_names_are_refused() {
    let (_tmp, sh) = sandboxed();
    let root = sh.filesystem().root().to_path_buf();
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    symlink(".git", root.join("link")).unwrap();
    symlink(".git/hooks", root.join("hooks")).unwrap();
    symlink(".git/config", root.join("config")).unwrap();
    symlink(".", root.join("here")).unwrap();
    let before = snapshot(&root);
    if sh.filesystem().follows_symlinks() {
        for path in [
            "/link/config",
            "/link/hooks/pre-commit",
            "/hooks/pre-commit",
            "/here/.git/config",
            "/here/here/.git/hooks/pre-commit",
        ] {
            assert_unchangeable(&sh, path).await;
        }
        // Through a symlink, a file in a directory that does not exist yet is not there to edit
        // or delete (not found); creating it is refused.
        assert_uncreatable(&sh, "/link/new/deep.txt").await;
        assert_uncreatable(&sh, "/here/here/.deepagents/AGENTS.md").await;
        // A symlink to a protected file: the write goes to its target, which is protected.
        assert_protected("/config", sh.overwrite(&cx(), &p("/config"), "PWNED").await);
        assert_protected(
            "/config",
            sh.edit(&cx(), &p("/config"), "core", "PWNED", false).await,
        );
        let uploaded = sh
            .upload_files(&cx(), vec![("/config".into(), b"PWNED".to_vec())])
            .await;
        assert_eq!(uploaded.value, [Err(FileOpError::PermissionDenied)]);
    }
    assert_eq!(snapshot(&root), before);
    // Deleting a symlink removes the link, never what it points to: allowed.
    sh.delete(&cx(), &p("/link")).await.unwrap();
    assert!(root.join(".git/config").is_file());
    // A protected name that does not exist yet, reached through a symlink to the root.
    std::fs::remove_dir_all(root.join(".git")).unwrap();
    assert_uncreatable(&sh, "/here/.git/hooks/x").await;
    assert!(!root.join(".git").exists());
}

#[tokio::test]
async fn other_paths_stay_writable() {
    let (_tmp, sh) = sandboxed();
    let root = sh.filesystem().root().to_path_buf();
    // Names that only start like a protected one, nested `.git` directories (the sandbox
    // protects names relative to the root), and plain files.
    for path in [
        "/src/main.rs",
        "/.gitignore",
        "/.github/workflows/ci.yml",
        "/.agentsrc",
        "/sub/.git/config",
        "/docs/.deepagents/notes.md",
    ] {
        sh.write(&cx(), &p(path), "old\n").await.unwrap();
        sh.edit(&cx(), &p(path), "old", "new", false).await.unwrap();
        sh.overwrite(&cx(), &p(path), "newer\n").await.unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join(path.trim_start_matches('/'))).unwrap(),
            "newer\n"
        );
        sh.delete(&cx(), &p(path)).await.unwrap();
    }
    sh.delete(&cx(), &p("/sub")).await.unwrap();
    // Without a sandbox nothing is protected.
    let plain = LocalShellBackend::new(sh.filesystem().clone().with_protected::<&str>([]));
    plain
        .write(&cx(), &p("/.git/hooks/pre-commit"), "ok")
        .await
        .unwrap();
    let unsandboxed = LocalShellBackend::new(FilesystemBackend::new(&root).unwrap());
    unsandboxed
        .delete(&cx(), &p("/.git/hooks/pre-commit"))
        .await
        .unwrap();
}

#[tokio::test]
async fn protected_names_can_be_configured_and_a_file_kept_editable() {
    let tmp = TempDir::new().unwrap();
    let fs = FilesystemBackend::new(tmp.path().join("root")).unwrap();
    let root = fs.root().to_path_buf();
    std::fs::create_dir_all(root.join("docs/secret")).unwrap();
    std::fs::create_dir_all(root.join(".deepagents/skills")).unwrap();
    std::fs::write(root.join(".deepagents/AGENTS.md"), "old\n").unwrap();
    // A multi-segment name, an absolute host path inside the root, and one outside (ignored).
    let b = fs
        .with_protected([
            Path::new("docs/./secret"),
            &root.join(".deepagents"),
            &tmp.path().join("elsewhere"),
        ])
        .with_editable(".deepagents/AGENTS.md");
    assert_unchangeable(&b, "/docs/secret/x.md").await;
    // Deleting a directory that holds a protected name would delete it too.
    assert_protected("/docs", b.delete(&cx(), &p("/docs")).await);
    b.write(&cx(), &p("/docs/readme.md"), "ok").await.unwrap();
    // The editable file, and only it.
    b.edit(&cx(), &p("/.deepagents/AGENTS.md"), "old", "new", false)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join(".deepagents/AGENTS.md")).unwrap(),
        "new\n"
    );
    assert_unchangeable(&b, "/.deepagents/skills/x/SKILL.md").await;
    assert_unchangeable(&b, "/.deepagents/hooks.json").await;
    // `.git` is no longer protected: the list replaces the default one.
    b.write(&cx(), &p("/.git/config"), "ok").await.unwrap();
}

#[tokio::test]
async fn protected_names_hold_in_non_virtual_mode() {
    let tmp = TempDir::new().unwrap();
    let fs = FilesystemBackend::builder(tmp.path().join("root"))
        .virtual_mode(false)
        .build()
        .unwrap();
    let root = fs.root().to_path_buf();
    let sh = LocalShellBackend::new(fs).with_sandbox(Policy::workspace_write(&root));
    let host = |rel: &str| format!("{}/{rel}", root.display());
    assert_unchangeable(&sh, &host(".git/hooks/pre-commit")).await;
    assert!(!root.join(".git").exists());
    sh.write(&cx(), &p(&host("src/lib.rs")), "ok")
        .await
        .unwrap();
}

async fn host(
    fs: &FilesystemBackend,
    path: &str,
    change: bool,
) -> Result<std::path::PathBuf, BackendError> {
    fs.host_path(&p(path), change).await
}

#[tokio::test]
async fn host_path_checks_as_reads_and_writes_do() {
    let (tmp, shell) = sandboxed();
    let fs = shell.filesystem();
    let root = fs.root().to_path_buf();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::fs::create_dir(root.join(".git")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]").unwrap();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join("src/lib.rs"), "fn main() {}").unwrap();
    symlink("src/lib.rs", root.join("alias.rs")).unwrap();
    symlink(outside.join("secret.txt"), root.join("escape.txt")).unwrap();
    symlink(".git", root.join("git-link")).unwrap();

    // Reads: existing regular files, where they really are.
    let read = |path: &'static str| host(fs, path, false);
    assert_eq!(read("/src/lib.rs").await.unwrap(), root.join("src/lib.rs"));
    assert_eq!(read("/alias.rs").await.unwrap(), root.join("src/lib.rs"));
    assert_eq!(
        read("/.git/config").await.unwrap(),
        root.join(".git/config")
    );
    assert!(matches!(
        read("/escape.txt").await,
        Err(BackendError::PermissionDenied { .. })
    ));
    assert!(matches!(
        read("/missing.txt").await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(matches!(
        read("/src").await,
        Err(BackendError::IsDirectory { .. })
    ));

    // Changes: where the write would land, new parents included; nothing is created.
    let change = |path: &'static str| host(fs, path, true);
    assert_eq!(change("/alias.rs").await.unwrap(), root.join("src/lib.rs"));
    assert_eq!(
        change("/new/dir/file.md").await.unwrap(),
        root.join("new/dir/file.md")
    );
    assert!(!root.join("new").exists());
    for refused in [
        "/escape.txt",
        "/.git/config",
        "/.git/new",
        "/git-link/config",
        "/.agents/skills/x.md",
    ] {
        let error = change(refused).await.unwrap_err();
        assert!(
            matches!(error, BackendError::PermissionDenied { .. }),
            "{refused}: {error}"
        );
    }
    assert!(matches!(
        change("/src").await,
        Err(BackendError::IsDirectory { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "secret"
    );
}
