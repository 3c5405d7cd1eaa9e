//! The repository backend against real git repositories on disk.

use std::path::Path;
use std::sync::Arc;

use deepagents_backends::testing::{check_text_backend, check_text_mounted};
use deepagents_backends::{
    Backend, BackendContext, BackendError, FileOpError, GrepQuery, ReadResult, RepoBackend, VPath,
};
use deepagents_test_support::{bare_repo, git, push_files};
use tempfile::TempDir;

fn p(path: &str) -> VPath {
    VPath::parse(path).unwrap()
}

fn cx() -> BackendContext {
    BackendContext::default()
}

/// The file at `path` on `main` of `bare`.
fn show(bare: &Path, path: &str) -> String {
    git(bare, &["show", &format!("main:{path}")])
}

fn log(bare: &Path) -> Vec<String> {
    git(bare, &["log", "--format=%an|%s", "main"])
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn text(backend: &dyn Backend, path: &str) -> String {
    match backend.read(&cx(), &p(path), 0, 1000).await.unwrap() {
        ReadResult::Text { lines, .. } => lines.join("\n"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn conformance_on_a_repository_that_does_not_exist_yet() {
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("agent.git");
    check_text_backend(Arc::new(RepoBackend::new(repo.to_str().unwrap()).unwrap())).await;
    // The suite's first write created the repository; every change is in its history.
    assert!(log(&repo).len() > 10, "{:?}", log(&repo));
}

#[tokio::test]
async fn conformance_mounted_in_a_composite() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "agent", &[]);
    check_text_mounted(Arc::new(RepoBackend::new(repo.to_str().unwrap()).unwrap())).await;
}

#[tokio::test]
async fn the_tree_is_fetched_on_first_use_and_then_read_from_memory() {
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("agent.git");
    // Built before the repository exists: nothing is fetched yet.
    let backend = RepoBackend::new(repo.to_str().unwrap()).unwrap();
    let repo = bare_repo(tmp.path(), "agent", &[("AGENTS.md", "be brief\n")]);
    assert_eq!(text(&backend, "/AGENTS.md").await, "be brief");
    // Another writer's later commit is not seen until the backend must fetch again.
    push_files(&repo, &[("AGENTS.md", "be thorough\n")], "theirs");
    assert_eq!(text(&backend, "/AGENTS.md").await, "be brief");
}

#[tokio::test]
async fn every_change_is_one_commit_with_the_configured_author() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "agent", &[("README.md", "hello\n")]);
    let backend = RepoBackend::builder(repo.to_str().unwrap())
        .author("Review bot", "bot@example.com")
        .message("agent {operation} {path}")
        .build()
        .unwrap();
    backend
        .write(&cx(), &p("/notes/a.md"), "one\n")
        .await
        .unwrap();
    backend
        .edit(&cx(), &p("/notes/a.md"), "one", "two", false)
        .await
        .unwrap();
    let answers = backend
        .upload_files(
            &cx(),
            vec![
                ("/up/x.txt".to_owned(), b"x\n".to_vec()),
                ("/up/y.txt".to_owned(), b"y\n".to_vec()),
            ],
        )
        .await
        .value;
    assert_eq!(answers, [Ok(()), Ok(())]);
    assert_eq!(
        backend.delete(&cx(), &p("/up")).await.unwrap().value,
        2,
        "a directory delete removes its files"
    );
    assert_eq!(
        log(&repo),
        [
            "Review bot|agent delete /up/x.txt and 1 more",
            "Review bot|agent upload /up/x.txt and 1 more",
            "Review bot|agent edit /notes/a.md",
            "Review bot|agent write /notes/a.md",
            "Someone|seed",
        ]
    );
    assert_eq!(show(&repo, "notes/a.md"), "two\n");
    // A write that would replace a file is refused and commits nothing.
    let error = backend
        .write(&cx(), &p("/README.md"), "gone\n")
        .await
        .unwrap_err();
    assert!(
        matches!(error, BackendError::AlreadyExists { .. }),
        "{error}"
    );
    assert_eq!(log(&repo).len(), 5);
    assert_eq!(show(&repo, "README.md"), "hello\n");
}

#[tokio::test]
async fn two_writers_on_one_repository_conflict_and_the_retry_lands() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "shared", &[("plan.md", "step 1\n")]);
    let alice = RepoBackend::new(repo.to_str().unwrap()).unwrap();
    let bob = RepoBackend::new(repo.to_str().unwrap()).unwrap();
    assert_eq!(text(&alice, "/plan.md").await, "step 1");
    assert_eq!(text(&bob, "/plan.md").await, "step 1");
    bob.edit(&cx(), &p("/plan.md"), "step 1", "step 1\nstep 2", false)
        .await
        .unwrap();
    // Alice's view is stale: her change is refused, nothing of it is saved.
    let error = alice
        .edit(&cx(), &p("/plan.md"), "step 1", "step one", false)
        .await
        .unwrap_err();
    assert!(matches!(error, BackendError::Conflict { .. }), "{error}");
    assert!(error.to_string().contains("Read the file again"), "{error}");
    assert_eq!(show(&repo, "plan.md"), "step 1\nstep 2\n");
    // The backend fetched again, so she sees Bob's change and her retry lands on top of it.
    assert_eq!(text(&alice, "/plan.md").await, "step 1\nstep 2");
    alice
        .edit(&cx(), &p("/plan.md"), "step 1", "step one", false)
        .await
        .unwrap();
    assert_eq!(show(&repo, "plan.md"), "step one\nstep 2\n");
    assert_eq!(log(&repo).len(), 3, "{:?}", log(&repo));
}

#[tokio::test]
async fn concurrent_writes_of_one_backend_all_land() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "agent", &[]);
    let backend = Arc::new(RepoBackend::new(repo.to_str().unwrap()).unwrap());
    let writes = (0..8).map(|i| {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move {
            backend
                .write(&cx(), &p(&format!("/f{i}.md")), &format!("{i}\n"))
                .await
        })
    });
    for write in futures::future::join_all(writes).await {
        write.unwrap().unwrap();
    }
    assert_eq!(log(&repo).len(), 8);
    assert_eq!(backend.ls(&cx(), &p("/")).await.unwrap().len(), 8);
}

#[tokio::test]
async fn linked_skill_repositories_appear_under_skills() {
    let tmp = TempDir::new().unwrap();
    let review = bare_repo(
        tmp.path(),
        "review-skill",
        &[(
            "SKILL.md",
            "---\nname: review\ndescription: Reviews code\n---\nLook closely.\n",
        )],
    );
    let links = r#"{"skills": {"review": "../review-skill.git"}}"#;
    let agent = bare_repo(
        tmp.path(),
        "agent",
        &[("AGENTS.md", "be brief\n"), ("deepagents.json", links)],
    );
    let backend = RepoBackend::new(agent.to_str().unwrap()).unwrap();
    let root: Vec<String> = backend
        .ls(&cx(), &p("/"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(root, ["/AGENTS.md", "/deepagents.json", "/skills"]);
    assert_eq!(
        text(&backend, "/skills/review/SKILL.md")
            .await
            .lines()
            .last(),
        Some("Look closely.")
    );
    let found = backend
        .grep(&cx(), &GrepQuery::literal("closely", p("/")))
        .await
        .unwrap();
    assert_eq!(found.matches[0].path, "/skills/review/SKILL.md");
    // A change under /skills/review/ is a commit of the skill repository, not the agent's.
    backend
        .edit(
            &cx(),
            &p("/skills/review/SKILL.md"),
            "Look closely.",
            "Look twice.",
            false,
        )
        .await
        .unwrap();
    assert!(show(&review, "SKILL.md").contains("Look twice."));
    assert_eq!(log(&agent).len(), 1);
    let history = backend
        .history(&p("/skills/review/SKILL.md"))
        .await
        .unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].summary, "deepagents: edit /SKILL.md");
}

#[tokio::test]
async fn history_lists_a_files_commits_newest_first() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "agent", &[("a.md", "1\n"), ("b.md", "1\n")]);
    let backend = RepoBackend::builder(repo.to_str().unwrap())
        .author("Bot", "bot@example.com")
        .build()
        .unwrap();
    backend
        .edit(&cx(), &p("/a.md"), "1", "2", false)
        .await
        .unwrap();
    backend
        .edit(&cx(), &p("/b.md"), "1", "2", false)
        .await
        .unwrap();
    let history = backend.history(&p("/a.md")).await.unwrap();
    let summaries: Vec<(&str, &str)> = history
        .iter()
        .map(|c| (c.author.as_str(), c.summary.as_str()))
        .collect();
    assert_eq!(
        summaries,
        [("Bot", "deepagents: edit /a.md"), ("Someone", "seed")]
    );
    assert_eq!(history[0].email, "bot@example.com");
    assert_eq!(history[0].id.len(), 40);
    assert_eq!(backend.history(&p("/")).await.unwrap().len(), 3);
    assert!(backend.history(&p("/never.md")).await.unwrap().is_empty());
}

#[tokio::test]
async fn uploads_that_are_not_utf8_are_refused_per_path() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "agent", &[]);
    let backend = RepoBackend::new(repo.to_str().unwrap()).unwrap();
    let answers = backend
        .upload_files(
            &cx(),
            vec![
                ("/ok.txt".to_owned(), b"fine\n".to_vec()),
                (
                    "/pixel.png".to_owned(),
                    vec![0x89, b'P', b'N', b'G', 0xff, 0],
                ),
            ],
        )
        .await
        .value;
    assert_eq!(answers, [Ok(()), Err(FileOpError::InvalidPath)]);
    assert_eq!(log(&repo).len(), 1);
    assert_eq!(show(&repo, "ok.txt"), "fine\n");
}

#[tokio::test]
async fn an_empty_repository_reads_as_empty_and_the_first_write_makes_its_branch() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(tmp.path(), "empty", &[]);
    let backend = RepoBackend::builder(repo.to_str().unwrap())
        .branch("agent/notes")
        .build()
        .unwrap();
    assert!(backend.ls(&cx(), &p("/")).await.unwrap().is_empty());
    let missing = backend.read(&cx(), &p("/x.md"), 0, 10).await.unwrap_err();
    assert!(
        matches!(missing, BackendError::NotFound { .. }),
        "{missing}"
    );
    backend.write(&cx(), &p("/x.md"), "x\n").await.unwrap();
    assert_eq!(git(&repo, &["show", "agent/notes:x.md"]), "x\n");
}

#[tokio::test]
async fn the_repositorys_default_branch_is_used_when_none_is_given() {
    let tmp = TempDir::new().unwrap();
    let bare = tmp.path().join("trunk.git");
    git(
        tmp.path(),
        &[
            "init",
            "--bare",
            "--quiet",
            "--initial-branch=trunk",
            bare.to_str().unwrap(),
        ],
    );
    let work = tmp.path().join("work");
    git(
        tmp.path(),
        &["clone", "--quiet", bare.to_str().unwrap(), "work"],
    );
    std::fs::write(work.join("t.md"), "on trunk\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "--quiet", "-m", "t"]);
    git(&work, &["push", "--quiet", "origin", "HEAD:trunk"]);
    let backend = RepoBackend::new(bare.to_str().unwrap()).unwrap();
    assert_eq!(text(&backend, "/t.md").await, "on trunk");
}

#[test]
fn sources_and_branches_git_would_misread_are_refused_when_built() {
    for bad in ["--upload-pack=touch /tmp/x", "", "   "] {
        let error = RepoBackend::new(bad).err().unwrap();
        assert!(
            matches!(error, BackendError::InvalidQuery { .. }),
            "{bad:?}: {error}"
        );
    }
    let error = RepoBackend::builder("/srv/a.git")
        .branch("--force")
        .build()
        .err()
        .unwrap();
    assert!(error.to_string().contains("not a valid branch"), "{error}");
}

#[tokio::test]
async fn a_broken_links_file_is_reported_with_what_to_fix() {
    let tmp = TempDir::new().unwrap();
    let repo = bare_repo(
        tmp.path(),
        "agent",
        &[("deepagents.json", "{\"skills\": [")],
    );
    let backend = RepoBackend::new(repo.to_str().unwrap()).unwrap();
    let error = backend.ls(&cx(), &p("/")).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("/deepagents.json"), "{message}");
    assert!(message.contains("fix it in the repository"), "{message}");
}

#[tokio::test]
async fn a_repository_that_cannot_be_reached_fails_with_gits_reason() {
    let tmp = TempDir::new().unwrap();
    // A directory that exists but is no repository.
    let backend = RepoBackend::new(tmp.path().to_str().unwrap()).unwrap();
    let error = backend.ls(&cx(), &p("/")).await.unwrap_err();
    assert!(matches!(error, BackendError::Io { .. }), "{error}");
    assert!(
        error.to_string().contains(tmp.path().to_str().unwrap()),
        "{error}"
    );
}
