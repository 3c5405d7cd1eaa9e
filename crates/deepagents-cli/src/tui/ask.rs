//! Questions a run asks while it goes on — a hook's `ask`, an MCP server's elicitation —
//! answered in the TUI: the run's side waits on a reply while the TUI shows the question.

use deepagents::core::ToolCall;
use deepagents::middleware::HookApprover;
use deepagents_mcp::{ElicitationAnswer, ElicitationRequest, Elicitor};
use tokio::sync::{mpsc, oneshot};

/// One question and where its answer goes.
pub enum Question {
    /// May this call run? (a hook asked)
    Approve {
        call: ToolCall,
        reason: String,
        reply: oneshot::Sender<bool>,
    },
    /// A server's question.
    Elicit {
        request: ElicitationRequest,
        reply: oneshot::Sender<ElicitationAnswer>,
    },
}

/// The questions waiting for the TUI.
pub type Questions = mpsc::UnboundedReceiver<Question>;

/// The run's side: sends questions to the TUI and waits. When the TUI is gone, a call is
/// refused and a question declined.
pub struct Asker {
    sender: mpsc::UnboundedSender<Question>,
}

impl Asker {
    /// An asker and the receiving end the TUI reads.
    pub fn channel() -> (Self, Questions) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Self { sender }, receiver)
    }
}

#[async_trait::async_trait]
impl HookApprover for Asker {
    async fn approve(&self, call: &ToolCall, reason: &str) -> bool {
        let (reply, answer) = oneshot::channel();
        let question = Question::Approve {
            call: call.clone(),
            reason: reason.to_owned(),
            reply,
        };
        if self.sender.send(question).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

#[async_trait::async_trait]
impl Elicitor for Asker {
    async fn elicit(&self, request: ElicitationRequest) -> ElicitationAnswer {
        let (reply, answer) = oneshot::channel();
        if self
            .sender
            .send(Question::Elicit { request, reply })
            .is_err()
        {
            return ElicitationAnswer::Decline;
        }
        answer.await.unwrap_or(ElicitationAnswer::Decline)
    }
}
