//! A backend chosen per run: one agent, a backend per thread, per tenant or per sandbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use crate::delegate::delegate_backend;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, ExecuteResult, FileOpError, OutputSink, Sandbox,
};

/// Makes the backend of a run from the context of its first call: the thread and assistant
/// ids and the runtime data ([`BackendContext`]).
#[async_trait]
pub trait BackendFactory: Send + Sync + 'static {
    /// The backend for the run `cx` belongs to.
    async fn make(&self, cx: &BackendContext) -> Result<Arc<dyn Backend>, BackendError>;
}

#[async_trait]
impl<F> BackendFactory for F
where
    F: Fn(&BackendContext) -> Result<Arc<dyn Backend>, BackendError> + Send + Sync + 'static,
{
    async fn make(&self, cx: &BackendContext) -> Result<Arc<dyn Backend>, BackendError> {
        self(cx)
    }
}

/// A backend that stands for one made per run by a [`BackendFactory`]: the first call of a
/// run makes it (concurrent first calls wait for the same one), the run's later calls reuse
/// it, and it goes when the run ends. The instance lives in the run's extensions, so runs of
/// one agent never share it unless the factory hands out the same backend.
///
/// Build it with [`executes`](Self::executes) when the factory makes sandboxes, so the agent
/// offers `execute`; each call then runs in the run's own sandbox.
pub struct PerRunBackend {
    factory: Arc<dyn BackendFactory>,
    /// Tells this wrapper's instances apart from another's in the same run.
    key: u64,
    executes: bool,
}

/// One run's instance of one wrapper, made once.
type Instance = Arc<OnceCell<Arc<dyn Backend>>>;

/// The instances made for one run, by wrapper.
#[derive(Default)]
struct Instances(Mutex<HashMap<u64, Instance>>);

impl PerRunBackend {
    /// A backend made per run by `factory`.
    pub fn new(factory: impl BackendFactory) -> Self {
        static NEXT_KEY: AtomicU64 = AtomicU64::new(0);
        Self {
            factory: Arc::new(factory),
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
            executes: false,
        }
    }

    /// Declares that the factory makes sandboxes: `execute` runs in the run's instance, and
    /// fails with a clear error if that instance has no shell after all.
    pub fn executes(mut self) -> Self {
        self.executes = true;
        self
    }

    /// The run's instance, made on first use.
    async fn instance(&self, cx: &BackendContext) -> Result<Arc<dyn Backend>, BackendError> {
        let cell = {
            let instances = cx.extensions.get_or_insert_with(Instances::default);
            let mut map = instances.0.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(map.entry(self.key).or_default())
        };
        cell.get_or_try_init(|| self.factory.make(cx))
            .await
            .cloned()
            .map_err(|error| BackendError::Io {
                operation: "make this run's backend",
                path: "/".to_owned(),
                message: error.to_string(),
            })
    }
}

delegate_backend! {
    impl Backend for PerRunBackend {
        forward [ls, read, read_raw, write, overwrite, edit, delete, glob, grep]
            to |self, cx| self.instance(cx).await?;

        fn name(&self) -> &'static str {
            "per-run"
        }

        async fn upload_files(
            &self,
            cx: &BackendContext,
            files: Vec<(String, Vec<u8>)>,
        ) -> Changed<Vec<Result<(), FileOpError>>> {
            match self.instance(cx).await {
                Ok(backend) => backend.upload_files(cx, files).await,
                Err(_) => Changed::outside_state(
                    files
                        .iter()
                        .map(|_| Err(FileOpError::PermissionDenied))
                        .collect(),
                ),
            }
        }

        async fn download_files(
            &self,
            cx: &BackendContext,
            paths: Vec<String>,
        ) -> Vec<Result<Vec<u8>, FileOpError>> {
            match self.instance(cx).await {
                Ok(backend) => backend.download_files(cx, paths).await,
                Err(_) => paths
                    .iter()
                    .map(|_| Err(FileOpError::PermissionDenied))
                    .collect(),
            }
        }

        fn as_sandbox(&self) -> Option<&dyn Sandbox> {
            self.executes.then_some(self as &dyn Sandbox)
        }
    }
}

#[async_trait]
impl Sandbox for PerRunBackend {
    fn id(&self) -> &str {
        "per-run"
    }

    async fn execute_streaming(
        &self,
        cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
        on_output: &OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError> {
        let backend = self.instance(cx).await?;
        let Some(sandbox) = backend.as_sandbox() else {
            return Err(BackendError::Unsupported {
                operation: "execute",
                backend: backend.name(),
            });
        };
        sandbox
            .execute_streaming(cx, command, timeout, on_output)
            .await
    }
}
