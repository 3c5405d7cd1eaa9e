//! `deepagents run` (and `-n`, `--stdin`): one task headless, its progress on stderr, the
//! answer on stdout; approvals asked on the terminal.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, bail};
use deepagents::{Agent, CheckpointError, RunError, RunOptions, RunStatus, RunStream};
use futures::StreamExt as _;

use crate::args::RunArgs;
use crate::exit::{self, error_text};
use crate::session::{Front, Session, prepare};
use crate::{approvals, progress, shutdown};

/// Runs the task (or resumes the thread) to the end; the exit status says how it ended.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let task = match args.task.as_deref() {
        Some("-") => {
            let mut task = String::new();
            let _blocking = shutdown::blocking();
            std::io::stdin()
                .read_to_string(&mut task)
                .context("cannot read the task from stdin")?;
            Some(task)
        }
        other => other.map(str::to_owned),
    };
    if task.as_deref().is_none_or(|t| t.trim().is_empty()) && args.thread.is_none() {
        bail!("the task is empty; pass it as an argument or on stdin with `-`");
    }
    // A signal during start-up drops it: servers already started are killed on the way.
    let Ok(session) = shutdown::or_signal(prepare(&args, Front::Headless, true)).await else {
        return Ok(ExitCode::from(exit::INTERRUPTED));
    };
    let Session {
        agent,
        store,
        grants,
        hooks: front_hooks,
        mcp,
        root,
        ..
    } = session?;

    // A signal cancels the run as Ctrl-C always did: its commands are killed and what it did
    // is checkpointed before `drive` returns. `--timeout` cancels it the same way.
    let options = RunOptions {
        cancel: shutdown::token().child_token(),
        ..RunOptions::default()
    };
    let timed_out = cancel_after(args.timeout, options.cancel.clone());
    let input = task.filter(|t| !t.trim().is_empty());
    let background = Background {
        wait: std::time::Duration::from_secs(args.background_wait),
        cancel: options.cancel.clone(),
    };
    // Async subagents report to a thread: a run without one gets a thread of its own, in
    // memory, gone with the process.
    let scratch = args.thread.is_none() && agent.background_endings().is_some();
    let target = match &args.thread {
        Some(id) => Target::Thread {
            thread: agent.thread(id.as_str())?.with_options(options),
            wait: args.wait,
            background,
        },
        None if scratch => Target::Thread {
            thread: agent
                .thread_in(
                    Arc::new(deepagents::core::InMemoryCheckpointer::new()),
                    "run",
                )?
                .with_options(options),
            wait: false,
            background,
        },
        None => Target::Once(options),
    };
    let session = args.thread.clone().unwrap_or_default();
    // A new message on a thread: what the agent may change is recorded first (`threads
    // rewind`).
    let turn = match (&target, &input) {
        (Target::Thread { thread, .. }, Some(input)) if !scratch => {
            crate::rewind::before_turn(thread, root.as_deref(), input).await
        }
        _ => None,
    };
    let tracer = tracer();
    let outcome = drive(
        &agent,
        &target,
        input,
        Output {
            json: args.json,
            quiet: args.quiet,
        },
        args.auto_approve,
        grants.as_ref(),
        front_hooks.as_ref().map(|hooks| (hooks, session.as_str())),
        tracer.as_deref(),
    )
    .await;
    if let Target::Thread { thread, .. } = &target
        && !scratch
    {
        crate::rewind::after_turn(thread, turn, root.as_deref()).await;
    }
    // The runs' spans go out before the process ends.
    if let Some(tracer) = &tracer {
        tracer.shutdown(std::time::Duration::from_secs(5)).await;
    }
    if let Some(hooks) = &front_hooks {
        hooks
            .notify(
                &session,
                "SessionEnd",
                serde_json::json!({"reason": "exit"}),
            )
            .await;
    }
    // The run has ended, so no call is using them.
    if let Some(mcp) = &mcp {
        mcp.stop();
    }
    // Closing folds SQLite's write-ahead log back into the database instead of leaving it.
    store.close().await;
    Ok(match outcome? {
        Ended::Finished { cut: false } => ExitCode::SUCCESS,
        Ended::Finished { cut: true } => ExitCode::from(exit::CUT),
        Ended::Interrupted => ExitCode::from(exit::INTERRUPTED),
        Ended::Failed(failure)
            if matches!(failure.error, deepagents::RunError::Cancelled)
                && timed_out.load(Ordering::Acquire) =>
        {
            report_timeout(args.timeout.unwrap_or_default(), args.thread.as_deref())
        }
        Ended::Failed(failure) => report_failure(&failure),
    })
}

/// `--timeout`: cancels the run `cancel` belongs to after `seconds`; the flag says whether
/// it did, so that the cancellation is reported as the timeout it is.
fn cancel_after(
    seconds: Option<u64>,
    cancel: tokio_util::sync::CancellationToken,
) -> Arc<AtomicBool> {
    let timed_out = Arc::new(AtomicBool::new(false));
    if let Some(seconds) = seconds {
        let timed_out = timed_out.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
            timed_out.store(true, Ordering::Release);
            cancel.cancel();
        });
    }
    timed_out
}

/// Says that the run timed out, and that its thread, if it has one, keeps what it did.
fn report_timeout(seconds: u64, thread: Option<&str>) -> ExitCode {
    match thread {
        Some(id) => eprintln!(
            "error: the run timed out after {seconds} s (--timeout); thread `{id}` keeps what it did (resume it with --thread {id})"
        ),
        None => eprintln!("error: the run timed out after {seconds} s (--timeout)"),
    }
    ExitCode::from(exit::TIMEOUT)
}

/// How [`drive`] ended; what a failure means is for its caller to say, which knows what
/// cancelled the run.
enum Ended {
    /// The answer is printed; `cut`: it was cut at the model's output limit.
    Finished { cut: bool },
    /// A signal came before the run started (while waiting for the thread).
    Interrupted,
    /// The run failed, or was cancelled (a signal, `--timeout`).
    Failed(deepagents::RunFailure),
}

/// What the CLI runs: a conversation thread, or one run that is not saved.
enum Target {
    /// `wait`: wait for another run of the thread to end (`--wait`) rather than fail.
    Thread {
        thread: deepagents::Thread,
        wait: bool,
        background: Background,
    },
    /// A run of its own, with these options.
    Once(RunOptions),
}

/// Starts the first run: the task (on a thread, appended to it), or the thread's resume.
async fn first_stream(
    agent: &Agent,
    target: &Target,
    input: Option<String>,
) -> anyhow::Result<RunStream> {
    let (thread, wait) = match target {
        Target::Once(options) => {
            let run = deepagents::Run::from_task(input.unwrap_or_default());
            return Ok(agent.stream_run(run, options.clone()));
        }
        Target::Thread { thread, wait, .. } => (thread, *wait),
    };
    if input.is_none() && thread.state().await?.is_none() {
        bail!(
            "thread `{}` does not exist yet; start it with a task",
            thread.id()
        );
    }
    let start = async |thread: &deepagents::Thread| match &input {
        Some(input) => thread.stream(input.clone()).await,
        None => thread.stream(deepagents::Input::Resume).await,
    };
    match start(thread).await {
        Ok(stream) => Ok(stream),
        Err(failure) => match failure.error {
            RunError::Checkpoint(error @ CheckpointError::Busy { .. }) if wait => {
                eprintln!("waiting: {error}");
                let waiting = thread.clone().with_lease_wait(std::time::Duration::MAX);
                Ok(start(&waiting).await?)
            }
            RunError::Checkpoint(error @ CheckpointError::Busy { .. }) => {
                bail!("{error}; pass --wait to wait for it")
            }
            error => Err(error.into()),
        },
    }
}

/// How `run` prints.
#[derive(Clone, Copy)]
struct Output {
    /// Every event as a JSON line.
    json: bool,
    /// Only the answer.
    quiet: bool,
}

/// The exporter of the runs' traces when the `OTEL_*` variables name an endpoint; a setting
/// that cannot be used is a warning, not a failed run.
fn tracer() -> Option<Arc<deepagents_server::otel::Tracer>> {
    let started = deepagents_server::otel::TraceOptions::from_env().and_then(|options| {
        options
            .map(deepagents_server::otel::Tracer::start)
            .transpose()
    });
    started.unwrap_or_else(|why| {
        eprintln!("warning: no traces are exported: {why}");
        None
    })
}

/// Runs to the end, answering pauses, and prints the events and the answer; each run (the
/// first, then each after answering a pause) is a trace when `tracer` is given.
#[allow(clippy::too_many_arguments)]
async fn drive(
    agent: &Agent,
    target: &Target,
    input: Option<String>,
    print: Output,
    auto_approve: bool,
    grants: Option<&deepagents::backends::sandbox::SharedPolicy>,
    hooks: Option<(&deepagents::middleware::Hooks, &str)>,
    tracer: Option<&deepagents_server::otel::Tracer>,
) -> anyhow::Result<Ended> {
    // Waiting for another run of the thread (`--wait`) ends with a signal.
    let Ok(first) = shutdown::or_signal(first_stream(agent, target, input)).await else {
        return Ok(Ended::Interrupted);
    };
    let mut stream = first?;
    let mut stdout = std::io::stdout().lock();
    let mut progress = progress::Progress::default();
    // When waiting for background tasks must end (`--background-wait`), from the first wait.
    let mut deadline = None;
    loop {
        let mut trace = tracer.map(|tracer| tracer.run(Vec::new()));
        while let Some(event) = stream.next().await {
            if let Some(trace) = &mut trace {
                trace.event(&event);
            }
            if print.json {
                serde_json::to_writer(&mut stdout, &event)?;
                stdout.write_all(b"\n")?;
                stdout.flush()?;
            } else if !print.quiet {
                progress.show(&event);
            }
        }
        let output = match stream.outcome().await {
            Ok(output) => output,
            Err(failure) => {
                if let Some(trace) = &mut trace {
                    match &failure.error {
                        deepagents::RunError::Cancelled => trace.finish("interrupted", None),
                        error => trace.finish("error", Some(&error.to_string())),
                    }
                }
                return Ok(Ended::Failed(failure));
            }
        };
        if let Some(trace) = &mut trace {
            trace.finish("success", None);
        }
        if output.status == RunStatus::Finished {
            if !print.json {
                writeln!(stdout, "{}", output.text)?;
                if output.run.spent.tokens() > 0 && !print.quiet {
                    eprintln!("{}", spent_line(&output.run.spent, &output.run.total_spent));
                }
            }
            if output.cut() {
                // Said even with --json and -q: the exit status alone would not say why.
                eprintln!(
                    "warning: the answer was cut at the model's output limit and is not complete; raise max_output_tokens in config.toml, or ask for less (exit status {})",
                    exit::CUT
                );
            }
            if let Target::Thread {
                thread, background, ..
            } = target
                && let Some(next) = woken(thread, background, &mut deadline, print).await?
            {
                stream = next;
                continue;
            }
            return Ok(Ended::Finished { cut: output.cut() });
        }
        let decisions = if auto_approve {
            approvals::approve_all(&output.pending)
        } else {
            if let Some((hooks, session)) = hooks {
                let names: Vec<&str> = output.pending.iter().map(|a| a.name.as_str()).collect();
                hooks
                    .notify(
                        session,
                        "Notification",
                        serde_json::json!({
                            "message": format!("deepagents needs your approval for {}", names.join(", ")),
                            "notification_type": "permission_prompt",
                        }),
                    )
                    .await;
            }
            // Paused, the run is saved: a signal while the person answers exits at once.
            let _blocking = shutdown::blocking();
            approvals::ask(&output.pending)?
        };
        if let Some(policy) = grants {
            approvals::grant_approved(policy, &output.pending, &decisions);
        }
        stream = match target {
            // The thread continues from what its store holds, so nothing is written twice.
            // Recorded for the pause that was shown: if another process answered it while
            // the person decided, this fails instead of deciding the next pause.
            Target::Thread { thread, .. } => {
                let started = thread
                    .stream(deepagents::Input::decide(output.pause_id(), decisions))
                    .await;
                match started {
                    Ok(stream) => stream,
                    Err(failure) => return Ok(Ended::Failed(failure)),
                }
            }
            Target::Once(options) => {
                let mut run = output.run;
                deepagents::decide(&mut run, decisions)?;
                agent.stream_run(run, options.clone())
            }
        };
    }
}

/// How `run` waits for a thread's background tasks after an answer (`--background-wait`).
struct Background {
    /// How long in all.
    wait: std::time::Duration,
    /// The run's token: a signal or `--timeout` ends the wait too.
    cancel: tokio_util::sync::CancellationToken,
}

/// After an answer on `thread`: waits for the next ending of its background tasks (until
/// `deadline`, set at the first wait) and starts the turn that ending wakes; `None` when no
/// task is left, the time is up (a warning says what is left) or the run was cancelled.
async fn woken(
    thread: &deepagents::Thread,
    background: &Background,
    deadline: &mut Option<tokio::time::Instant>,
    print: Output,
) -> anyhow::Result<Option<RunStream>> {
    if background.wait.is_zero() {
        return Ok(None);
    }
    let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + background.wait);
    loop {
        let running = thread.background_running();
        if running > 0 && !print.quiet && !print.json {
            eprintln!(
                "waiting for {running} background task{} (--background-wait)",
                if running == 1 { "" } else { "s" }
            );
        }
        let wake = tokio::select! {
            wake = thread.next_wake() => wake?,
            () = tokio::time::sleep_until(until) => {
                eprintln!(
                    "warning: {} background task(s) still running after {} s (--background-wait); their answers come the next time thread `{}` runs (never for a run without --thread)",
                    thread.background_running(),
                    background.wait.as_secs(),
                    thread.id()
                );
                return Ok(None);
            }
            () = background.cancel.cancelled() => return Ok(None),
        };
        if wake.is_none() {
            return Ok(None);
        }
        match thread.stream(deepagents::Input::Wake).await {
            Ok(stream) => return Ok(Some(stream)),
            Err(failure) if matches!(failure.error, RunError::NothingToWake) => {}
            Err(failure) => return Err(failure.error.into()),
        }
        // Another run of the thread took the endings first: wait for the next.
    }
}

/// One line on what a run spent: `spent $0.0123 · 1,234 tokens (1,100 in, 800 cached, 134
/// out)`, and the conversation's total when it is more.
fn spent_line(spent: &deepagents::core::Spent, total: &deepagents::core::Spent) -> String {
    let mut line = format!("spent {}", progress::spent_summary(spent));
    if spent.unpriced_tokens > 0 {
        line.push_str(&format!(
            "; {} tokens of models without known prices are not in the cost",
            spent.unpriced_tokens
        ));
    }
    if total.tokens() > spent.tokens() {
        line.push_str(&format!(
            " · this conversation: ${:.4}, {} tokens",
            total.cost_usd,
            total.tokens()
        ));
    }
    line
}

/// Prints why a run failed; the exit status for it.
fn report_failure(failure: &deepagents::RunFailure) -> ExitCode {
    let hint = exit::flag_hint(&failure.error);
    eprintln!("error: {}{hint}", error_text(&failure.error.to_string()));
    if matches!(failure.error, deepagents::RunError::Cancelled) {
        ExitCode::from(exit::INTERRUPTED)
    } else if matches!(failure.error, deepagents::RunError::SpendCap(_)) {
        ExitCode::from(exit::SPEND_CAP)
    } else {
        ExitCode::FAILURE
    }
}
