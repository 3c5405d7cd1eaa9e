//! A checkpointed conversation of an agent.

use std::sync::Arc;
use std::time::Duration;

use deepagents_core::{
    CheckpointError, CheckpointInfo, Checkpointer, ContentBlock, EventSink, Run,
};

use crate::agent::Agent;
use crate::approval::{Decision, PendingAction};
use crate::background::Completion;
use crate::error::{RunError, RunFailure};
use crate::middleware::async_tasks::takes_message;
use crate::run::{RunOptions, RunOutput};
use crate::stream::RunStream;

/// Why a [`Thread`] could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadError {
    /// The agent has no checkpointer.
    #[error(
        "this agent has no checkpointer, so it cannot keep threads; build it with AgentBuilder::checkpointer"
    )]
    NoCheckpointer,
    /// The thread id cannot be stored.
    #[error(transparent)]
    InvalidId(CheckpointError),
}

/// One conversation of an agent, saved in its checkpointer ([`Agent::thread`]). Every run
/// through the handle loads the thread's latest checkpoint, continues it and checkpoints it
/// after every step, so handles are cheap and need not be kept: two handles on one thread id
/// see the same conversation. A run holds the thread's lease from loading to its end, so runs
/// of one thread never overlap, in one process or across processes: a second one fails with
/// [`CheckpointError::Busy`], or waits ([`with_lease_wait`](Self::with_lease_wait)).
#[derive(Clone)]
pub struct Thread {
    agent: Agent,
    checkpointer: Arc<dyn Checkpointer>,
    id: String,
    options: RunOptions,
    lease_wait: Duration,
    input_key: Option<String>,
    events: EventSink,
}

/// What a run of a [`Thread`] starts from: [`Thread::run`] and [`Thread::stream`] take it.
/// Text converts into it, so `thread.run("hi")` adds a user message and runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Input {
    /// A user message of text.
    Text(String),
    /// A user message of any content: text with images (a front end's attachments),
    /// documents, audio.
    Content(Vec<ContentBlock>),
    /// No input: a run stopped by a crash, a cancellation or an error goes on from its latest
    /// checkpoint (calls in flight at a crash are settled: see
    /// [`Control::in_flight`](deepagents_core::Control::in_flight)); endings of background
    /// tasks waiting for the thread start a new turn, as with [`Wake`](Self::Wake). A paused
    /// run stays paused (it reports the pause again).
    Resume,
    /// Answers whatever pause the thread waits in when the run starts: one decision per
    /// [`pending`](Thread::pending) action, in order (see [`crate::decide`]), then continues
    /// the run. When the decisions were made for a pause someone was shown, use
    /// [`DecidePause`](Self::DecidePause), which refuses them for any other.
    Decide(Vec<Decision>),
    /// Answers the pause `pause` names ([`RunOutput::pause_id`], [`crate::pause_id`] of the
    /// [`state`](Thread::state)); when the thread no longer waits in it (another run decided
    /// it, or the id is not one of this thread's) the run fails with
    /// [`RunError::StalePause`] and changes nothing.
    DecidePause {
        /// The pause the decisions answer.
        pause: String,
        /// One decision per pending action, in order.
        decisions: Vec<Decision>,
    },
    /// The turn that background tasks' endings start: their answers join the conversation as
    /// a message (each announced by a
    /// [`BackgroundTaskFinished`](deepagents_core::EventKind::BackgroundTaskFinished) event)
    /// and the model answers it. With nothing to deliver (see [`Thread::next_wake`]) the run
    /// fails with [`RunError::NothingToWake`] and nothing runs; while another run holds the
    /// thread it fails with [`CheckpointError::Busy`]: that run delivers them.
    Wake,
}

impl Input {
    /// Decisions for the pause `pause` names ([`DecidePause`](Self::DecidePause)), or, with
    /// none named, for whatever pause the thread waits in ([`Decide`](Self::Decide)).
    pub fn decide(pause: Option<String>, decisions: Vec<Decision>) -> Self {
        match pause {
            Some(pause) => Self::DecidePause { pause, decisions },
            None => Self::Decide(decisions),
        }
    }
}

impl From<&str> for Input {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl From<String> for Input {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<Vec<ContentBlock>> for Input {
    fn from(content: Vec<ContentBlock>) -> Self {
        Self::Content(content)
    }
}

impl std::fmt::Debug for Thread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Thread")
            .field("agent", &self.agent.name())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A run that could not start because its thread did not load.
fn not_loaded(error: CheckpointError) -> RunFailure {
    RunFailure {
        error: RunError::Checkpoint(error),
        run: Box::default(),
    }
}

impl Thread {
    /// A handle on thread `id` of `agent`, saved in `checkpointer`.
    pub(crate) fn new(agent: Agent, checkpointer: Arc<dyn Checkpointer>, id: String) -> Self {
        Self {
            agent,
            checkpointer,
            id,
            options: RunOptions::default(),
            lease_wait: Duration::ZERO,
            input_key: None,
            events: EventSink::discard(),
        }
    }

    /// The thread id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Options for the runs of this handle: runtime context, cancellation, grace period
    /// (default [`RunOptions::default`]). Their `checkpoint` is replaced by this thread's.
    /// Every run of the handle shares the cancellation token, so once cancelled it stops them
    /// all; give the handle new options to run again.
    pub fn with_options(mut self, options: RunOptions) -> Self {
        self.options = options;
        self
    }

    /// How long a run of this handle waits for another run of the thread to end before it
    /// fails with [`CheckpointError::Busy`] (default: it does not wait).
    pub fn with_lease_wait(mut self, wait: Duration) -> Self {
        self.lease_wait = wait;
        self
    }

    /// Makes the runs of this handle take their input or decisions once per `key`: a run
    /// started again with a key the thread already took (the same request delivered twice,
    /// as a queue does after a crash) continues the thread from its latest checkpoint instead
    /// of adding the input again or deciding a pause twice. The key is stored with the first
    /// checkpoint that holds what the run took, so a crash before it leaves nothing taken.
    /// Use a key per request, such as its id.
    pub fn with_input_key(mut self, key: impl Into<String>) -> Self {
        self.input_key = Some(key.into());
        self
    }

    /// Whether `run` already took this handle's input or decisions (see
    /// [`with_input_key`](Self::with_input_key)).
    fn took_input(&self, run: &Run) -> bool {
        self.input_key.is_some() && run.control.input_key == self.input_key
    }

    /// Takes the thread's lease and loads it: what a run of this handle will start from,
    /// seen before the run starts ([`OpenThread::state`]) and under the lease, so no other run
    /// of the thread changes it in between. The lease is held until the run that
    /// [`OpenThread::run`] or [`OpenThread::stream`] starts ends, or the `OpenThread` is
    /// dropped. Fails like [`run`](Self::run) when the thread cannot be loaded or is busy.
    ///
    /// ```no_run
    /// # async fn demo(thread: deepagents::Thread) -> Result<(), deepagents::RunFailure> {
    /// let open = thread.open().await?;
    /// let messages = open.state().map_or(0, |run| run.state.messages.len());
    /// println!("continuing after {messages} messages");
    /// let output = open.run("Go on").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(&self) -> Result<OpenThread, RunFailure> {
        let (run, checkpoint) = crate::journal::lease_and_load(
            Arc::clone(&self.checkpointer),
            &self.id,
            self.lease_wait,
        )
        .await
        .map_err(not_loaded)?;
        if let (Some(background), Some(run)) = (&self.agent.inner.background, &run) {
            // Endings of this thread's tasks that a restart left undelivered, found again.
            background
                .recover(&self.checkpointer, &self.id, &run.state)
                .await;
        }
        let options = RunOptions {
            checkpoint: Some(checkpoint),
            ..self.options.clone()
        };
        Ok(OpenThread {
            thread: self.clone(),
            run,
            options,
        })
    }

    /// Starts a run of the thread from `input` and waits for its end: the final answer, or
    /// the pause it waits in ([`RunStatus::Interrupted`](crate::RunStatus::Interrupted)).
    /// Events go to the handle's sink ([`with_events`](Self::with_events)). Decisions that do
    /// not fit the pause fail with [`RunError::InvalidDecision`], for another pause with
    /// [`RunError::StalePause`], both before anything runs or changes; a thread another run
    /// holds fails with [`RunError::Checkpoint`] ([`CheckpointError::Busy`]).
    ///
    /// ```no_run
    /// # async fn demo(thread: deepagents::Thread) -> Result<(), deepagents::RunFailure> {
    /// let output = thread.run("Summarize README.md").await?;
    /// println!("{}", output.text);
    /// # Ok(()) }
    /// ```
    pub async fn run(&self, input: impl Into<Input>) -> Result<RunOutput, RunFailure> {
        self.open().await?.run(input).await
    }

    /// Like [`run`](Self::run), on a background task: the stream yields the run's events and
    /// then its outcome. Fails like `run` before the run starts.
    pub async fn stream(&self, input: impl Into<Input>) -> Result<RunStream, RunFailure> {
        self.open().await?.stream(input)
    }

    /// Sends the events of this handle's [`run`](Self::run)s to `events` (default: none are
    /// kept). [`stream`](Self::stream) yields them instead.
    pub fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    /// Appends `input` as the user's message, recording the handle's input key with it.
    fn take_user_input(&self, run: &mut Run, input: Vec<ContentBlock>) {
        run.push_user_input(input);
        self.record_input_key(run);
    }

    /// Records that `run` took this handle's input or decisions (with its key, when it has
    /// one), so the checkpoint that holds them says so.
    fn record_input_key(&self, run: &mut Run) {
        if self.input_key.is_some() {
            run.control.input_key.clone_from(&self.input_key);
        }
    }

    /// How many background tasks of this thread (async subagents started with
    /// `start_async_task`) run now in this process.
    pub fn background_running(&self) -> usize {
        self.agent
            .inner
            .background
            .as_ref()
            .map_or(0, |b| b.running_for(&self.id))
    }

    /// Waits until background tasks of this thread have ended and the thread can take their
    /// answers (it is not paused), and returns those endings; then a run of
    /// [`Input::Wake`] (or [`Input::Resume`]) runs the turn they start. `None` when nothing is
    /// left to wait for: no task of the thread runs, none waits for delivery. A task that
    /// ended while this process was down is found again here (its ending is read from its
    /// child thread, or it runs on), as by every run of the thread. The endings are not taken
    /// by this call: a run of the thread that starts first delivers them instead (then this
    /// call waits on).
    pub async fn next_wake(&self) -> Result<Option<Vec<Completion>>, CheckpointError> {
        let Some(background) = self.agent.inner.background.as_ref() else {
            return Ok(None);
        };
        loop {
            // Subscribed before looking, so an ending between the look and the wait is seen.
            let mut ended = background.subscribe();
            if let Some(endings) = self.pending_wake().await? {
                return Ok(Some(endings));
            }
            if background.running_for(&self.id) == 0 {
                return Ok(None);
            }
            loop {
                match ended.recv().await {
                    Ok(thread) if thread == self.id => break,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(None),
                }
            }
        }
    }

    /// Like [`next_wake`](Self::next_wake) without waiting: the endings the thread could take
    /// now, if any (`None` also while it is paused).
    pub async fn pending_wake(&self) -> Result<Option<Vec<Completion>>, CheckpointError> {
        let Some(background) = self.agent.inner.background.as_ref() else {
            return Ok(None);
        };
        let Some(run) = self.state().await? else {
            return Ok(None);
        };
        background
            .recover(&self.checkpointer, &self.id, &run.state)
            .await;
        if !takes_message(&run.state) {
            return Ok(None);
        }
        Ok(background
            .deliveries(&self.id, &run.state)
            .map(|(_, endings)| endings))
    }

    /// The actions the thread's run waits on (empty when it is not paused or does not exist).
    pub async fn pending(&self) -> Result<Vec<PendingAction>, CheckpointError> {
        Ok(self
            .state()
            .await?
            .map(|run| crate::approval::pending_actions(&run))
            .unwrap_or_default())
    }

    /// The thread's latest run; `None` when it does not exist yet.
    pub async fn state(&self) -> Result<Option<Run>, CheckpointError> {
        upgraded(self.checkpointer.load(&self.id, None).await?)
    }

    /// The thread's checkpoints, oldest first; load one with [`state_at`](Self::state_at).
    pub async fn history(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        self.checkpointer.checkpoints(&self.id).await
    }

    /// The run at checkpoint `checkpoint`; `None` for an unknown thread.
    pub async fn state_at(&self, checkpoint: u64) -> Result<Option<Run>, CheckpointError> {
        upgraded(self.checkpointer.load(&self.id, Some(checkpoint)).await?)
    }
}

/// A thread loaded under its lease, before its run starts ([`Thread::open`]): the run takes
/// its input here and starts from exactly this state.
pub struct OpenThread {
    thread: Thread,
    run: Option<Run>,
    options: RunOptions,
}

impl std::fmt::Debug for OpenThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenThread")
            .field("thread", &self.thread)
            .field("checkpointed", &self.run.is_some())
            .finish_non_exhaustive()
    }
}

impl OpenThread {
    /// The thread's latest run as loaded; `None` when it has no checkpoint yet.
    pub fn state(&self) -> Option<&Run> {
        self.run.as_ref()
    }

    /// Runs the thread from `input` and waits for its end, as [`Thread::run`] does.
    pub async fn run(self, input: impl Into<Input>) -> Result<RunOutput, RunFailure> {
        let agent = self.thread.agent.clone();
        let events = self.thread.events.clone();
        let (run, options) = self.take(input.into())?;
        agent.run(run, options, events).await
    }

    /// Runs the thread from `input` on a background task, as [`Thread::stream`] does.
    pub fn stream(self, input: impl Into<Input>) -> Result<RunStream, RunFailure> {
        let agent = self.thread.agent.clone();
        let (run, options) = self.take(input.into())?;
        Ok(agent.stream_run(run, options))
    }

    /// The run to start: the loaded one with `input` taken in, unless the handle's input key
    /// says the thread took it already.
    fn take(self, input: Input) -> Result<(Run, RunOptions), RunFailure> {
        let Self {
            thread,
            run,
            options,
        } = self;
        let mut run = run.unwrap_or_default();
        let taken = thread.took_input(&run);
        let deliverable = |run: &Run| {
            takes_message(&run.state)
                && thread
                    .agent
                    .inner
                    .background
                    .as_ref()
                    .is_some_and(|background| {
                        background.deliveries(&thread.id, &run.state).is_some()
                    })
        };
        let taken_in = match input {
            Input::Text(_) | Input::Content(_) | Input::Decide(_) | Input::DecidePause { .. }
                if taken =>
            {
                Ok(())
            }
            Input::Text(text) => {
                thread.take_user_input(&mut run, vec![ContentBlock::text(text)]);
                Ok(())
            }
            Input::Content(content) => {
                thread.take_user_input(&mut run, content);
                Ok(())
            }
            Input::Resume => {
                if deliverable(&run) {
                    new_turn(&mut run);
                }
                Ok(())
            }
            Input::Decide(decisions) => crate::approval::decide(&mut run, decisions)
                .map(|()| thread.record_input_key(&mut run)),
            Input::DecidePause { pause, decisions } => {
                crate::approval::decide_pause(&mut run, &pause, decisions)
                    .map(|()| thread.record_input_key(&mut run))
            }
            Input::Wake if deliverable(&run) => {
                new_turn(&mut run);
                Ok(())
            }
            Input::Wake => Err(RunError::NothingToWake),
        };
        match taken_in {
            Ok(()) => Ok((run, options)),
            Err(error) => Err(RunFailure {
                error,
                run: Box::new(run),
            }),
        }
    }
}

/// Starts a new turn without user input (background tasks' endings are its input): its steps,
/// tokens and spending count from here, as after user input.
fn new_turn(run: &mut Run) {
    run.steps = 0;
    run.usage = deepagents_core::Usage::default();
    run.spent = deepagents_core::Spent::default();
}

/// A run as loaded, in this version's format (a thread of the earlier format is upgraded in
/// the store when a run next opens it; reads upgrade their copy).
fn upgraded(run: Option<Run>) -> Result<Option<Run>, CheckpointError> {
    run.map(|mut run| {
        deepagents_core::upgrade_legacy_control(&mut run)?;
        Ok(run)
    })
    .transpose()
}
