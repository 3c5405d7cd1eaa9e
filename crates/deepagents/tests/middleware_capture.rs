//! A middleware that records every request the model receives.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::middleware::{Middleware, ModelNext};
use deepagents::{ModelError, ModelRequest, ModelResponse};

pub struct Capture {
    pub requests: Arc<Mutex<Vec<ModelRequest>>>,
}

#[async_trait]
impl Middleware for Capture {
    fn name(&self) -> &str {
        "capture"
    }
    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        next.call(request).await
    }
}
