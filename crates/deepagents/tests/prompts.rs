//! Snapshots of what the model is told: system prompts and tool schemas per configuration.

use std::sync::{Arc, Mutex};

use deepagents::{Agent, AgentBuilder, ModelRequest};
use serde_json::json;

use crate::middleware_capture::Capture;
use crate::support::scripted;

async fn first_request(configure: impl FnOnce(AgentBuilder) -> AgentBuilder) -> ModelRequest {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let builder = Agent::builder(scripted(json!([{"text": "ok"}]))).middleware(Capture {
        requests: requests.clone(),
    });
    configure(builder)
        .build()
        .unwrap()
        .invoke("hi")
        .await
        .unwrap();
    requests.lock().unwrap().remove(0)
}

#[tokio::test]
async fn default_prompt() {
    let request = first_request(|b| b).await;
    insta::assert_snapshot!(request.system_prompt.unwrap());
}

#[tokio::test]
async fn prompt_with_user_prompt_and_planning() {
    let request =
        first_request(|b| b.system_prompt("You are a release manager.").todos(true)).await;
    insta::assert_snapshot!(request.system_prompt.unwrap());
}

#[tokio::test]
async fn bare_prompt_without_file_tools() {
    let request = first_request(|b| {
        b.system_prompt("Only this.")
            .base_prompt(false)
            .file_tools(false)
            .general_purpose_subagent(false)
    })
    .await;
    assert_eq!(request.system_prompt.as_deref(), Some("Only this."));
    assert!(request.tools.is_empty());
}

#[tokio::test]
async fn tool_schemas() {
    let request = first_request(|b| b.todos(true)).await;
    insta::assert_json_snapshot!(request.tools);
}

#[tokio::test]
async fn shell_and_routed_paths_are_explained() {
    use deepagents::backends::{
        CompositeBackend, FilesystemBackend, InMemoryStore, LocalShellBackend, StoreBackend,
    };
    let root = tempfile::tempdir().unwrap();
    let docs = tempfile::tempdir().unwrap();
    let shell = LocalShellBackend::new(FilesystemBackend::new(root.path()).unwrap());
    let composite = CompositeBackend::new(Arc::new(shell))
        .route(
            "/memories/",
            Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new()))),
        )
        .unwrap()
        .route(
            "/docs",
            Arc::new(FilesystemBackend::new(docs.path()).unwrap()),
        )
        .unwrap();
    let request = first_request(|b| b.backend(Arc::new(composite))).await;
    let prompt = request.system_prompt.unwrap();
    let root_host = root.path().canonicalize().unwrap();
    let docs_host = docs.path().canonicalize().unwrap();
    assert!(
        prompt.contains("## Shell\nexecute runs shell commands"),
        "{prompt}"
    );
    assert!(
        prompt.contains(&format!("- `/` is `{}` in the shell", root_host.display())),
        "{prompt}"
    );
    assert!(
        prompt.contains(&format!(
            "- `/docs/` is `{}` in the shell",
            docs_host.display()
        )),
        "{prompt}"
    );
    assert!(
        prompt.contains("- `/memories/` is not on the shell's disk; use the file tools for it"),
        "{prompt}"
    );
    assert!(request.tools.iter().any(|t| t.name == "execute"));

    // A plain shell backend needs no explanation.
    let plain = LocalShellBackend::new(FilesystemBackend::new(root.path()).unwrap());
    let request = first_request(|b| b.backend(Arc::new(plain))).await;
    assert!(
        !request
            .system_prompt
            .unwrap()
            .contains("Shell paths vs file paths")
    );
}
