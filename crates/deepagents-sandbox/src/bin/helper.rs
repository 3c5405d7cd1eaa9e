//! The sandbox's helper as a program of its own, for callers that do not dispatch it from
//! their own `main` (set [`Policy::helper`](deepagents_sandbox::Policy::helper) to it).

fn main() {
    deepagents_sandbox::helper::dispatch();
    eprintln!(
        "deepagents-sandbox-helper is started by the sandbox (first argument {}), not by hand",
        deepagents_sandbox::helper::ARG
    );
    std::process::exit(2);
}
