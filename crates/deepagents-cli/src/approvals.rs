//! Asking the person at the terminal to approve tool calls.

use std::io::{BufRead, IsTerminal as _, Write};
use std::sync::Arc;

use deepagents::backends::sandbox::SharedPolicy;
use deepagents::{ASK_USER, Decision, DecisionKind, InterruptConfig, PendingAction};

/// What may be decided about a command: everything.
const EVERY_DECISION: [DecisionKind; 4] = [
    DecisionKind::Approve,
    DecisionKind::Edit,
    DecisionKind::Reject,
    DecisionKind::Respond,
];

/// Shell commands ask first, but for those `allowed` names (see
/// [`crate::sandbox::shell_allowed`]).
pub fn execute_config(allowed: Vec<String>) -> InterruptConfig {
    let predicate: Option<Arc<deepagents::approval::ApprovalPredicate>> = (!allowed.is_empty())
        .then(|| {
            Arc::new(move |args: &serde_json::Value| {
                let command = args["command"].as_str().unwrap_or_default();
                !crate::sandbox::shell_allowed(command, &allowed)
            }) as Arc<deepagents::approval::ApprovalPredicate>
        });
    InterruptConfig {
        allowed: EVERY_DECISION.to_vec(),
        description: Some("A shell command wants to run.".to_owned()),
        predicate,
        reason: None,
    }
}

/// Confined commands that name paths or hosts outside the sandbox ask, with what they name;
/// approving one gives every later command of the session access to it ([`grant_approved`]).
pub fn outside_config(policy: SharedPolicy) -> InterruptConfig {
    InterruptConfig {
        allowed: EVERY_DECISION.to_vec(),
        reason: Some(Arc::new(move |args: &serde_json::Value| {
            let outside = policy.outside(args["command"].as_str().unwrap_or_default());
            (!outside.is_empty()).then(|| {
                let names = outside
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(
                    "This command needs {names}, outside the sandbox. Approve to give commands access to it for the rest of the session; reject to keep the sandbox as it is."
                )
            })
        })),
        ..InterruptConfig::default()
    }
}

/// Whether the TUI asks before every change (`/manual`) or only before what leaves the
/// sandbox (`/auto`); read by the interrupt rules at every call, so a switch applies at once.
#[derive(Clone, Debug, Default)]
pub struct ManualSwitch(Arc<std::sync::atomic::AtomicBool>);

impl ManualSwitch {
    /// Asks before every change from now on, or not.
    pub fn set(&self, manual: bool) {
        self.0.store(manual, std::sync::atomic::Ordering::Relaxed);
    }

    fn is_on(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The file tools that change the root and ask in `/manual`.
pub const FILE_CHANGES: [&str; 3] = ["write_file", "edit_file", "delete"];

/// A file change asks while `manual` is on.
pub fn manual_file_config(manual: ManualSwitch) -> InterruptConfig {
    InterruptConfig {
        description: Some(
            "Manual mode: every file change asks first (/auto stops asking).".to_owned(),
        ),
        predicate: Some(Arc::new(move |_: &serde_json::Value| manual.is_on())),
        ..InterruptConfig::default()
    }
}

/// A fetch of a web page asks while `manual` is on.
pub fn manual_fetch_config(manual: ManualSwitch) -> InterruptConfig {
    InterruptConfig {
        description: Some(
            "Manual mode: every web fetch asks first (/auto stops asking).".to_owned(),
        ),
        predicate: Some(Arc::new(move |_: &serde_json::Value| manual.is_on())),
        ..InterruptConfig::default()
    }
}

/// A confined command asks while `manual` is on, and whenever it names something outside
/// the sandbox (see [`outside_config`]).
pub fn manual_execute_config(
    manual: ManualSwitch,
    policy: Option<SharedPolicy>,
) -> InterruptConfig {
    let outside = policy.map(outside_config);
    InterruptConfig {
        allowed: EVERY_DECISION.to_vec(),
        reason: Some(Arc::new(move |args: &serde_json::Value| {
            let outside = outside
                .as_ref()
                .and_then(|config| config.reason.as_ref())
                .and_then(|reason| reason(args));
            outside.or_else(|| {
                manual.is_on().then(|| {
                    "Manual mode: every command asks first; it would run in the sandbox (/auto stops asking).".to_owned()
                })
            })
        })),
        ..InterruptConfig::default()
    }
}

/// Widens `policy` with what the approved (or edited) `execute` calls among `actions` name.
pub fn grant_approved(policy: &SharedPolicy, actions: &[PendingAction], decisions: &[Decision]) {
    for (action, decision) in actions.iter().zip(decisions) {
        let arguments = match decision {
            _ if action.name != "execute" => continue,
            Decision::Approve => &action.arguments,
            Decision::Edit { arguments } => arguments,
            _ => continue,
        };
        let outside = policy.outside(arguments["command"].as_str().unwrap_or_default());
        policy.grant(&outside);
    }
}

const NOT_INTERACTIVE: &str = "This call needs approval and nobody can approve it here (the run is not interactive). Do without it, or ask the user to rerun interactively or with --auto-approve.";

const NOT_APPROVABLE: &str =
    "This call may not be approved (its approval rule does not allow it), so it did not run.";

/// One decision per action: asked on the terminal, or refused when stdin is not a terminal.
pub fn ask(actions: &[PendingAction]) -> anyhow::Result<Vec<Decision>> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Ok(actions.iter().map(nobody_answers).collect());
    }
    Ok(prompt(actions, &mut stdin.lock(), &mut std::io::stderr())?)
}

/// `--auto-approve`: every action approved, whatever paused it (the shell, a permission rule
/// in `interrupt` mode, a subagent's call). An action whose rule does not allow approval is
/// rejected with a note, as nobody is there to choose otherwise.
pub fn approve_all(actions: &[PendingAction]) -> Vec<Decision> {
    actions
        .iter()
        .map(|action| {
            if action.name == ASK_USER || action.request.is_some() {
                nobody_answers(action)
            } else if action.allowed.contains(&DecisionKind::Approve) {
                Decision::Approve
            } else {
                Decision::Reject {
                    message: Some(NOT_APPROVABLE.to_owned()),
                }
            }
        })
        .collect()
}

fn not_interactive() -> Decision {
    Decision::Reject {
        message: Some(NOT_INTERACTIVE.to_owned()),
    }
}

const NO_ANSWER: &str = "Nobody can answer questions in this run (it is not interactive): decide yourself and say what you assumed.";

/// The decision when nobody is there: a refusal, worded for a question or for an approval.
fn nobody_answers(action: &PendingAction) -> Decision {
    // A tool's question (ask_user, an MCP server's) is not an approval.
    if action.name == ASK_USER || action.request.is_some() {
        Decision::Reject {
            message: Some(NO_ANSWER.to_owned()),
        }
    } else {
        not_interactive()
    }
}

/// Asks something on the terminal while the run goes on (a server's question, a hook's
/// approval), one question at a time: `ask` gets stdin and stderr to itself.
pub async fn ask_on_terminal<T: Send + 'static>(
    ask: impl FnOnce(&mut dyn BufRead, &mut dyn Write) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    tokio::task::spawn_blocking(move || {
        let _turn = TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ask(&mut std::io::stdin().lock(), &mut std::io::stderr())
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A line from `input` without its line ending; `None` at the end of input.
fn read_line(input: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    Ok(Some(line.trim_end_matches(['\r', '\n']).to_owned()))
}

/// Asks about each action on `out`, reading the answers from `input`: approve, edit (the
/// arguments as one line of JSON), reject (with an optional reason) or respond (an answer in
/// place of the call), offering only what the action allows. The end of input rejects the
/// actions still open.
pub fn prompt(
    actions: &[PendingAction],
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> std::io::Result<Vec<Decision>> {
    let mut decisions = Vec::with_capacity(actions.len());
    for action in actions {
        if action.name == ASK_USER {
            match answer(action, input, out)? {
                Some(decision) => decisions.push(decision),
                None => break,
            }
            continue;
        }
        let shown = describe(action);
        writeln!(out, "\n{}{}: {shown}", origin(action), action.name)?;
        if let Some(description) = &action.description {
            writeln!(out, "  {description}")?;
        }
        match decide_one(action, input, out)? {
            Some(decision) => decisions.push(decision),
            None => break,
        }
    }
    // Input ended: nobody is left to answer.
    for action in &actions[decisions.len()..] {
        decisions.push(nobody_answers(action));
    }
    Ok(decisions)
}

/// The person's answer to an `ask_user` question (an empty line declines); `None` when the
/// input ended first.
fn answer(
    action: &PendingAction,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> std::io::Result<Option<Decision>> {
    let question = action.arguments["question"]
        .as_str()
        .unwrap_or("(no question)");
    writeln!(out, "\n{}? {question}", origin(action))?;
    if let Some(options) = action.arguments["options"]
        .as_array()
        .filter(|o| !o.is_empty())
    {
        let options: Vec<&str> = options.iter().filter_map(|o| o.as_str()).collect();
        writeln!(out, "  (e.g. {})", options.join(" / "))?;
    }
    write!(out, "  answer: ")?;
    out.flush()?;
    let Some(line) = read_line(input)? else {
        return Ok(None);
    };
    Ok(Some(if line.trim().is_empty() {
        Decision::Reject {
            message: Some("The user declined to answer; decide yourself.".to_owned()),
        }
    } else {
        Decision::Respond { message: line }
    }))
}

/// The decision about one action; `None` when the input ended first.
fn decide_one(
    action: &PendingAction,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> std::io::Result<Option<Decision>> {
    let allows = |kind| action.allowed.contains(&kind);
    let choices: Vec<&str> = [
        (DecisionKind::Approve, "[y]es"),
        (DecisionKind::Edit, "[e]dit"),
        (DecisionKind::Reject, "[n]o"),
        (DecisionKind::Respond, "[r]espond instead"),
    ]
    .into_iter()
    .filter(|(kind, _)| allows(*kind))
    .map(|(_, label)| label)
    .collect();
    if choices.is_empty() {
        // A rule that allows nothing: the run reports it when the decision is applied.
        return Ok(Some(Decision::Reject { message: None }));
    }
    loop {
        write!(out, "  approve? {}: ", choices.join(" / "))?;
        out.flush()?;
        let Some(line) = read_line(input)? else {
            return Ok(None);
        };
        let kind = match line.trim() {
            "y" | "yes" | "" => DecisionKind::Approve,
            "e" | "edit" => DecisionKind::Edit,
            "n" | "no" => DecisionKind::Reject,
            "r" | "respond" => DecisionKind::Respond,
            _ => continue,
        };
        if !allows(kind) {
            writeln!(out, "  not allowed for this call")?;
            continue;
        }
        let decision = match kind {
            DecisionKind::Approve => Some(Decision::Approve),
            DecisionKind::Edit => match edit(action, input, out)? {
                Edited::Arguments(arguments) => Some(Decision::Edit { arguments }),
                Edited::Cancelled => continue,
                Edited::EndOfInput => None,
            },
            DecisionKind::Reject => {
                write!(out, "  reason (optional): ")?;
                out.flush()?;
                let reason = read_line(input)?.unwrap_or_default();
                let reason = reason.trim();
                Some(Decision::Reject {
                    message: (!reason.is_empty()).then(|| reason.to_owned()),
                })
            }
            DecisionKind::Respond => loop {
                write!(out, "  answer for the agent: ")?;
                out.flush()?;
                match read_line(input)? {
                    None => break None,
                    Some(answer) if answer.trim().is_empty() => continue,
                    Some(answer) => {
                        break Some(Decision::Respond {
                            message: answer.trim().to_owned(),
                        });
                    }
                }
            },
        };
        return Ok(decision);
    }
}

enum Edited {
    Arguments(serde_json::Value),
    /// An empty line: back to the choice.
    Cancelled,
    EndOfInput,
}

/// Shows the call's arguments as one line of JSON and reads their replacement, asking again
/// until it is a valid JSON object.
fn edit(
    action: &PendingAction,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> std::io::Result<Edited> {
    writeln!(out, "  arguments: {}", action.arguments)?;
    loop {
        write!(
            out,
            "  new arguments (one line of JSON; empty to go back): "
        )?;
        out.flush()?;
        let Some(line) = read_line(input)? else {
            return Ok(Edited::EndOfInput);
        };
        if line.trim().is_empty() {
            return Ok(Edited::Cancelled);
        }
        match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(arguments) if arguments.is_object() => return Ok(Edited::Arguments(arguments)),
            Ok(_) => writeln!(
                out,
                "  the arguments must be a JSON object, like {{\"command\": \"ls\"}}; try again"
            )?,
            Err(error) => writeln!(out, "  not valid JSON ({error}); try again")?,
        }
    }
}

/// Which subagent asks, for calls made inside one: "[general-purpose] ", nested ones joined
/// with " › ".
fn origin(action: &PendingAction) -> String {
    let names: Vec<&str> = action.agents().iter().map(|s| s.name.as_str()).collect();
    if names.is_empty() {
        String::new()
    } else {
        format!("[{}] ", names.join(" › "))
    }
}

/// What the person should see: the command for `execute`, a diff for edits, the content for
/// writes, the arguments otherwise.
fn describe(action: &PendingAction) -> String {
    let arg = |name: &str| action.arguments.get(name).and_then(|v| v.as_str());
    match action.name.as_str() {
        "execute" => format!("$ {}", arg("command").unwrap_or_default()),
        "edit_file" => {
            let mut out = format!("{}\n", arg("file_path").unwrap_or_default());
            for line in arg("old_string").unwrap_or_default().lines() {
                out.push_str(&format!("  - {line}\n"));
            }
            for line in arg("new_string").unwrap_or_default().lines() {
                out.push_str(&format!("  + {line}\n"));
            }
            out
        }
        "write_file" => {
            let content = arg("content").unwrap_or_default();
            let mut out = format!(
                "{} ({} lines)\n",
                arg("file_path").unwrap_or_default(),
                content.lines().count()
            );
            for line in content.lines().take(20) {
                out.push_str(&format!("  + {line}\n"));
            }
            out
        }
        _ => action.arguments.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn action(allowed: &[DecisionKind]) -> PendingAction {
        PendingAction {
            call_id: "c1".into(),
            name: "execute".into(),
            arguments: json!({"command": "rm -rf build"}),
            description: Some("A shell command wants to run.".into()),
            allowed: allowed.to_vec(),
            request: None,
            path: vec![],
        }
    }

    fn all() -> PendingAction {
        action(&execute_config(Vec::new()).allowed)
    }

    /// The decisions for `actions` given the typed `input`, and what the prompt printed.
    fn run(actions: &[PendingAction], input: &str) -> (Vec<Decision>, String) {
        let mut out = Vec::new();
        let decisions = prompt(actions, &mut input.as_bytes(), &mut out).unwrap();
        (decisions, String::from_utf8(out).unwrap())
    }

    #[test]
    fn approve_with_y_or_enter() {
        let (decisions, out) = run(&[all(), all()], "y\n\n");
        assert_eq!(decisions, [Decision::Approve, Decision::Approve]);
        assert!(out.contains("$ rm -rf build"), "{out}");
        assert!(
            out.contains("[y]es / [e]dit / [n]o / [r]espond instead"),
            "{out}"
        );
    }

    #[test]
    fn edit_takes_a_json_line_and_asks_again_until_it_is_a_valid_object() {
        let (decisions, out) = run(
            &[all()],
            "e\n{\"command\": \"rm -rf build\n[1, 2]\n{\"command\": \"rm -rf build/tmp\"}\n",
        );
        assert_eq!(
            decisions,
            [Decision::Edit {
                arguments: json!({"command": "rm -rf build/tmp"})
            }]
        );
        assert!(
            out.contains(r#"arguments: {"command":"rm -rf build"}"#),
            "shows the arguments as JSON: {out}"
        );
        assert!(out.contains("not valid JSON"), "{out}");
        assert!(out.contains("must be a JSON object"), "{out}");
        assert_eq!(out.matches("new arguments").count(), 3, "{out}");
    }

    #[test]
    fn an_empty_edit_goes_back_to_the_choice() {
        let (decisions, _) = run(&[all()], "e\n\nn\n\n");
        assert_eq!(decisions, [Decision::Reject { message: None }]);
    }

    #[test]
    fn reject_with_and_without_a_reason() {
        let (decisions, _) = run(&[all(), all()], "n\ntoo risky\nno\n\n");
        assert_eq!(
            decisions,
            [
                Decision::Reject {
                    message: Some("too risky".into())
                },
                Decision::Reject { message: None }
            ]
        );
    }

    #[test]
    fn respond_answers_in_place_of_the_call_and_needs_an_answer() {
        let (decisions, out) = run(&[all()], "r\n\nuse the file tools instead\n");
        assert_eq!(
            decisions,
            [Decision::Respond {
                message: "use the file tools instead".into()
            }]
        );
        assert_eq!(out.matches("answer for the agent").count(), 2, "{out}");
    }

    #[test]
    fn unknown_and_disallowed_answers_ask_again() {
        let limited = action(&[DecisionKind::Approve, DecisionKind::Reject]);
        let (decisions, out) = run(&[limited], "maybe\ne\nr\ny\n");
        assert_eq!(decisions, [Decision::Approve]);
        assert!(out.contains("approve? [y]es / [n]o: "), "{out}");
        assert_eq!(out.matches("not allowed for this call").count(), 2, "{out}");
        assert_eq!(out.matches("approve?").count(), 4, "{out}");
    }

    #[test]
    fn the_end_of_input_rejects_what_is_still_open() {
        let (decisions, _) = run(&[all(), all(), all()], "y\ne\n");
        assert_eq!(decisions[0], Decision::Approve);
        for decision in &decisions[1..] {
            let Decision::Reject {
                message: Some(message),
            } = decision
            else {
                panic!("{decision:?}");
            };
            assert!(message.contains("nobody can approve it"), "{message}");
        }
        assert_eq!(decisions.len(), 3);
    }

    #[test]
    fn auto_approve_approves_everything_it_may() {
        let decisions = approve_all(&[all(), action(&[DecisionKind::Reject])]);
        assert_eq!(decisions[0], Decision::Approve);
        assert!(
            matches!(&decisions[1], Decision::Reject { message: Some(m) } if m.contains("may not be approved"))
        );
    }
}
