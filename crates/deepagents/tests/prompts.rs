//! Snapshots of what the model is told: system prompts and tool schemas per configuration.

use std::path::Path;
use std::sync::{Arc, Mutex};

use deepagents::backends::{
    CompositeBackend, FilesystemBackend, InMemoryStore, LocalShellBackend, StateBackend,
    StoreBackend,
};
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
    // Keys sorted: a workspace build may write JSON objects in insertion order
    // (serde_json's preserve_order, which a dependency of the binary turns on).
    insta::with_settings!({sort_maps => true}, {
        insta::assert_json_snapshot!(request.tools);
    });
}

/// The prompt with every host directory replaced by a stable name.
fn redacted(prompt: &str, dirs: &[(&Path, &str)]) -> String {
    dirs.iter().fold(prompt.to_owned(), |prompt, (dir, name)| {
        prompt.replace(&dir.canonicalize().unwrap().display().to_string(), name)
    })
}

fn shell(root: &Path) -> LocalShellBackend {
    LocalShellBackend::new(FilesystemBackend::new(root).unwrap())
}

#[tokio::test]
async fn bare_prompt() {
    // No user prompt and no base guidance: only the sections of the tools on offer.
    let request = first_request(|b| b.base_prompt(false)).await;
    insta::assert_snapshot!(request.system_prompt.unwrap());
}

#[tokio::test]
async fn shell_prompt() {
    let root = tempfile::tempdir().unwrap();
    let request = first_request(|b| b.backend(Arc::new(shell(root.path())))).await;
    let prompt = request.system_prompt.unwrap();
    insta::assert_snapshot!(redacted(&prompt, &[(root.path(), "[ROOT]")]));
}

#[tokio::test]
async fn shell_paths_prompt() {
    let root = tempfile::tempdir().unwrap();
    let docs = tempfile::tempdir().unwrap();
    let composite = CompositeBackend::new(Arc::new(shell(root.path())))
        .route(
            "/memories/",
            Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new()))),
        )
        .unwrap()
        .route("/scratch", Arc::new(StateBackend::default()))
        .unwrap()
        .route(
            "/docs",
            Arc::new(FilesystemBackend::new(docs.path()).unwrap()),
        )
        .unwrap()
        .route(
            "/host",
            Arc::new(
                FilesystemBackend::builder(docs.path())
                    .virtual_mode(false)
                    .build()
                    .unwrap(),
            ),
        )
        .unwrap();
    let request = first_request(|b| b.backend(Arc::new(composite))).await;
    let prompt = request.system_prompt.unwrap();
    insta::assert_snapshot!(redacted(
        &prompt,
        &[(root.path(), "[ROOT]"), (docs.path(), "[DOCS]")]
    ));
}

#[tokio::test]
async fn execute_tool_schema() {
    let root = tempfile::tempdir().unwrap();
    let request = first_request(|b| b.backend(Arc::new(shell(root.path())))).await;
    let execute = request.tools.iter().find(|t| t.name == "execute").unwrap();
    insta::with_settings!({sort_maps => true}, {
        insta::assert_json_snapshot!(execute);
    });
}

/// A host directory routed into the tree but hidden by the shell's sandbox is listed as
/// unreachable from the shell, not as a path commands can use.
#[tokio::test]
async fn routes_the_sandbox_hides_are_not_offered_to_the_shell() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let confined = shell(root.path()).with_sandbox(
        deepagents::backends::sandbox::Policy::workspace_write(root.path()),
    );
    let composite = CompositeBackend::new(Arc::new(confined))
        .route(
            "/.skills-1",
            Arc::new(FilesystemBackend::new(outside.path()).unwrap()),
        )
        .unwrap();
    let request = first_request(|b| b.backend(Arc::new(composite))).await;
    let prompt = request.system_prompt.unwrap();
    let hidden = outside.path().canonicalize().unwrap();
    assert!(
        !prompt.contains(&hidden.display().to_string()),
        "a hidden directory offered to the shell: {prompt}"
    );
    assert!(
        prompt.contains(
            "Not reachable from the shell (use the file tools for them):\n- `/.skills-1/`"
        ),
        "{prompt}"
    );
}

#[tokio::test]
async fn shell_and_routed_paths_are_explained() {
    let root = tempfile::tempdir().unwrap();
    let docs = tempfile::tempdir().unwrap();
    let composite = CompositeBackend::new(Arc::new(shell(root.path())))
        .route(
            "/memories/",
            Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new()))),
        )
        .unwrap()
        .route(
            "/docs",
            Arc::new(FilesystemBackend::new(docs.path()).unwrap()),
        )
        .unwrap()
        .route(
            "/host",
            Arc::new(
                FilesystemBackend::builder(docs.path())
                    .virtual_mode(false)
                    .build()
                    .unwrap(),
            ),
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
        prompt.contains(&format!(
            "`/` is `{}`, the shell's working directory",
            root_host.display()
        )),
        "{prompt}"
    );
    assert!(
        prompt.contains(&format!(
            "- `/docs/` → `{0}/` (`/docs/dir/x.py` → `{0}/dir/x.py`)",
            docs_host.display()
        )),
        "{prompt}"
    );
    assert!(
        prompt.contains("- `/host/` → `/` (`/host/dir/x.py` → `/dir/x.py`)"),
        "{prompt}"
    );
    assert!(
        prompt.contains(
            "Not reachable from the shell (use the file tools for them):\n- `/memories/`"
        ),
        "{prompt}"
    );
    assert!(request.tools.iter().any(|t| t.name == "execute"));

    // A shell confined to a directory: its `/` is not the file tools' `/`.
    let request = first_request(|b| b.backend(Arc::new(shell(root.path())))).await;
    let prompt = request.system_prompt.unwrap();
    assert!(
        prompt.contains(&format!(
            "the file tools' `/src/main.rs` is `{}/src/main.rs`, or `src/main.rs`, in a command",
            root_host.display()
        )),
        "{prompt}"
    );

    // A shell over the host's own tree needs no explanation.
    let host = LocalShellBackend::new(
        FilesystemBackend::builder(root.path())
            .virtual_mode(false)
            .build()
            .unwrap(),
    );
    let request = first_request(|b| b.backend(Arc::new(host))).await;
    let prompt = request.system_prompt.unwrap();
    assert!(prompt.contains("## Shell\n"), "{prompt}");
    assert!(!prompt.contains("Shell paths vs file paths"), "{prompt}");

    // Without a shell there is neither section, whatever the routes.
    let plain = CompositeBackend::new(Arc::new(StateBackend::default()))
        .route(
            "/docs",
            Arc::new(FilesystemBackend::new(docs.path()).unwrap()),
        )
        .unwrap();
    let request = first_request(|b| b.backend(Arc::new(plain))).await;
    let prompt = request.system_prompt.unwrap();
    assert!(!prompt.contains("## Shell"), "{prompt}");
    assert!(!request.tools.iter().any(|t| t.name == "execute"));
}

#[tokio::test]
async fn approval_prompt_names_the_gated_tools_last() {
    let request = first_request(|b| {
        b.base_prompt(false)
            .general_purpose_subagent(false)
            .interrupt_on("write_file", deepagents::InterruptConfig::default())
            .interrupt_on("edit_file", deepagents::InterruptConfig::default())
            .ask_user(true)
    })
    .await;
    let prompt = request.system_prompt.unwrap();
    let section = prompt
        .rfind("## Approval")
        .map(|at| &prompt[at..])
        .expect("an approval section");
    assert!(!section[3..].contains("\n## "), "it is the last section");
    assert!(!section.contains("ask_user"), "questions are not approvals");
    insta::assert_snapshot!(section);

    // Without interrupts (ask_user alone is a question), there is none.
    let request = first_request(|b| b.ask_user(true)).await;
    assert!(!request.system_prompt.unwrap().contains("## Approval"));
}

#[tokio::test]
async fn middleware_can_write_prompt_sections_from_the_runtime_context() {
    struct Tenant(&'static str);
    struct ForTenant;
    #[async_trait::async_trait]
    impl deepagents::middleware::Middleware for ForTenant {
        fn name(&self) -> &str {
            "for_tenant"
        }
        async fn before_model(
            &self,
            ctx: &deepagents::RunContext,
            request: &mut ModelRequest,
            _state: &deepagents::AgentState,
        ) -> Result<(), deepagents::middleware::MiddlewareError> {
            if let Some(Tenant(name)) = ctx.runtime.get::<Tenant>() {
                request.push_system_section(&format!("## Tenant\nYou work for {name}."));
            }
            Ok(())
        }
    }
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([{"text": "ok"}])))
        .middleware(ForTenant)
        .middleware(Capture {
            requests: requests.clone(),
        })
        .build()
        .unwrap();
    let options = deepagents::RunOptions {
        runtime: deepagents::RuntimeContext::new(Tenant("ACME")),
        ..deepagents::RunOptions::default()
    };
    agent
        .run(
            deepagents::Run::from_task("hi"),
            options,
            deepagents::EventSink::discard(),
        )
        .await
        .unwrap();
    let prompt = requests.lock().unwrap()[0].system_prompt.clone().unwrap();
    assert!(
        prompt.ends_with("## Tenant\nYou work for ACME."),
        "{prompt}"
    );
}

/// A default backend whose shell runs elsewhere (a sandbox) maps no route to the host, not
/// even a local disk route: the shell cannot see this machine's directories.
#[tokio::test]
async fn a_sandboxed_default_maps_no_route_to_the_host() {
    let docs = tempfile::tempdir().unwrap();
    let sandbox =
        deepagents::backends::PerRunBackend::new(|_: &deepagents::backends::BackendContext| {
            Ok(Arc::new(StateBackend::default()) as Arc<dyn deepagents::backends::Backend>)
        })
        .executes();
    let composite = CompositeBackend::new(Arc::new(sandbox))
        .route(
            "/docs",
            Arc::new(FilesystemBackend::new(docs.path()).unwrap()),
        )
        .unwrap()
        .route("/notes/", Arc::new(StateBackend::default()))
        .unwrap();
    let request = first_request(|b| b.backend(Arc::new(composite))).await;
    let prompt = request.system_prompt.unwrap();
    let section = prompt
        .find("## Shell paths vs file paths")
        .map(|at| &prompt[at..])
        .expect("a shell paths section");
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    assert!(!section.contains('→'), "{section}");
    insta::assert_snapshot!(section);
}

/// Routes of a composite mounted inside another are listed with their full prefix.
#[tokio::test]
async fn nested_routes_are_listed_with_their_full_prefix() {
    let root = tempfile::tempdir().unwrap();
    let inner_dir = tempfile::tempdir().unwrap();
    let inner = CompositeBackend::new(Arc::new(StateBackend::default()))
        .route(
            "/disk",
            Arc::new(FilesystemBackend::new(inner_dir.path()).unwrap()),
        )
        .unwrap();
    let composite = CompositeBackend::new(Arc::new(shell(root.path())))
        .route("/outer", Arc::new(inner))
        .unwrap();
    let request = first_request(|b| b.backend(Arc::new(composite))).await;
    let prompt = request.system_prompt.unwrap();
    let host = inner_dir.path().canonicalize().unwrap();
    assert!(
        prompt.contains(&format!("- `/outer/disk/` → `{}/`", host.display())),
        "{prompt}"
    );
    assert!(
        prompt.contains("Not reachable from the shell (use the file tools for them):\n- `/outer/`"),
        "{prompt}"
    );
}
