//! OpenTelemetry traces of runs, exported with OTLP over HTTP as JSON (behind the `otel`
//! feature).
//!
//! A run is one trace: a `deepagents.run` span, with a `deepagents.model_call` span per model
//! call and a `deepagents.tool_call` span per tool call under it; a subagent's calls sit under
//! the span of the `task` call that started it. The spans are made from the run's events
//! ([`RunTrace::event`]), so the harness knows nothing of them. Names follow the GenAI
//! semantic conventions where they have one (`gen_ai.request.model`,
//! `gen_ai.usage.input_tokens`, `gen_ai.tool.name`, …).
//!
//! Finished spans go through a bounded queue to a background task that POSTs them in batches
//! to `{endpoint}/v1/traces` (`Content-Type: application/json`, the OTLP JSON mapping). A
//! full queue drops the span and counts it; a failed export is logged and counted. Nothing
//! here blocks or fails a run. [`Tracer::shutdown`] sends what is queued.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deepagents::core::{Event, EventKind, ToolStatus};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Where and how traces are exported.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// The URL spans are POSTed to, `…/v1/traces`.
    pub endpoint: String,
    /// Headers sent with every export (an API key of the backend, say).
    pub headers: Vec<(String, String)>,
    /// `service.name` of the resource (default `deepagents`).
    pub service_name: String,
    /// Further resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: Vec<(String, String)>,
    /// How long one export may take (default 10 s).
    pub timeout: Duration,
    /// The most spans one export carries (default 512).
    pub max_batch: usize,
    /// The most spans waiting to be exported; more are dropped and counted (default 2048).
    pub max_queue: usize,
    /// How long a span waits at most before it is exported (default 5 s).
    pub flush_interval: Duration,
}

impl TraceOptions {
    /// Spans POSTed to `endpoint` (the whole URL, `…/v1/traces`), with the defaults.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            headers: Vec::new(),
            service_name: "deepagents".to_owned(),
            resource: Vec::new(),
            timeout: Duration::from_secs(10),
            max_batch: 512,
            max_queue: 2048,
            flush_interval: Duration::from_secs(5),
        }
    }

    /// The options the standard `OTEL_*` variables of this process give; `None` when no
    /// endpoint is set or the SDK is disabled. See [`from_vars`](Self::from_vars).
    pub fn from_env() -> Result<Option<Self>, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The options variables looked up by `var` give: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// (the URL as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended);
    /// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (`k=v,k=v`, values
    /// percent-decoded); `OTEL_SERVICE_NAME`; `OTEL_RESOURCE_ATTRIBUTES`;
    /// `OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT` (ms); `OTEL_BSP_SCHEDULE_DELAY` (ms),
    /// `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`. `None` without an
    /// endpoint, with `OTEL_SDK_DISABLED=true` or with `OTEL_TRACES_EXPORTER=none`. The
    /// error names the variable that cannot be used.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let get = |name: &str| {
            var(name)
                .map(|value| value.trim().to_owned())
                .filter(|value| !value.is_empty())
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(exporters) = get("OTEL_TRACES_EXPORTER") {
            let names: Vec<&str> = exporters.split(',').map(str::trim).collect();
            if !names.contains(&"otlp") {
                if names.contains(&"none") {
                    return Ok(None);
                }
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={exporters}: only `otlp` (or `none`) is supported"
                ));
            }
        }
        let endpoint = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(traces), _) => traces,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        match reqwest::Url::parse(&endpoint) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            _ => {
                return Err(format!(
                    "the OTLP traces endpoint `{endpoint}` is not an http(s) URL (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)"
                ));
            }
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = get(name)
                && protocol == "grpc"
            {
                return Err(format!(
                    "{name}=grpc: traces are exported with OTLP over HTTP (JSON); point the endpoint at the collector's HTTP port (4318) and set http/json"
                ));
            }
        }
        let mut options = Self::new(endpoint);
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            for (key, value) in pairs(name, get(name).as_deref())? {
                options
                    .headers
                    .retain(|(known, _)| !known.eq_ignore_ascii_case(&key));
                options.headers.push((key, value));
            }
        }
        options.resource = pairs(
            "OTEL_RESOURCE_ATTRIBUTES",
            get("OTEL_RESOURCE_ATTRIBUTES").as_deref(),
        )?;
        if let Some(name) = get("OTEL_SERVICE_NAME").or_else(|| {
            options
                .resource
                .iter()
                .find(|(key, _)| key == "service.name")
                .map(|(_, name)| name.clone())
        }) {
            options.service_name = name;
        }
        options.resource.retain(|(key, _)| key != "service.name");
        let number = |name: &str| -> Result<Option<u64>, String> {
            get(name)
                .map(|value| {
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("{name}={value} is not a whole number"))
                })
                .transpose()
        };
        if let Some(ms) = number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")?
            .or(number("OTEL_EXPORTER_OTLP_TIMEOUT")?)
            .filter(|ms| *ms > 0)
        {
            options.timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = number("OTEL_BSP_SCHEDULE_DELAY")?.filter(|ms| *ms > 0) {
            options.flush_interval = Duration::from_millis(ms);
        }
        if let Some(size) = number("OTEL_BSP_MAX_QUEUE_SIZE")?.filter(|n| *n > 0) {
            options.max_queue = size as usize;
        }
        if let Some(size) = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")?.filter(|n| *n > 0) {
            options.max_batch = size as usize;
        }
        Ok(Some(options))
    }
}

/// `k=v,k=v` as pairs, keys trimmed, values trimmed and percent-decoded (W3C Baggage
/// style, as the OTLP exporter variables are written).
fn pairs(name: &str, text: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for (index, entry) in text.split(',').enumerate() {
        if entry.trim().is_empty() {
            continue;
        }
        // The value may be a secret: the error says where, not what.
        let Some((key, value)) = entry.split_once('=') else {
            return Err(format!(
                "{name}: entry {} is not key=value (entries are separated by commas)",
                index + 1
            ));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("{name}: entry {} has no key", index + 1));
        }
        found.push((key.to_owned(), percent_decoded(value.trim())));
    }
    Ok(found)
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(byte) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A span attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// A list of strings.
    Strings(Vec<String>),
}

impl From<&str> for AttributeValue {
    fn from(value: &str) -> Self {
        Self::String(value.to_owned())
    }
}

impl From<String> for AttributeValue {
    fn from(value: String) -> Self {
        Self::String(value)
    }
}

impl From<i64> for AttributeValue {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<bool> for AttributeValue {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl AttributeValue {
    /// The OTLP JSON `AnyValue`.
    fn otlp(&self) -> Value {
        match self {
            Self::String(text) => json!({"stringValue": text}),
            // int64 is a string in the protobuf JSON mapping.
            Self::Int(n) => json!({"intValue": n.to_string()}),
            Self::Double(x) => json!({"doubleValue": x}),
            Self::Bool(b) => json!({"boolValue": b}),
            Self::Strings(list) => json!({"arrayValue": {
                "values": list.iter().map(|text| json!({"stringValue": text})).collect::<Vec<_>>()
            }}),
        }
    }
}

fn attributes(list: &[(String, AttributeValue)]) -> Value {
    Value::Array(
        list.iter()
            .map(|(key, value)| json!({"key": key, "value": value.otlp()}))
            .collect(),
    )
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

fn random_hex(bytes: usize) -> String {
    let id = uuid::Uuid::new_v4();
    id.simple().to_string()[..bytes * 2].to_owned()
}

/// `SPAN_KIND_INTERNAL`.
const INTERNAL: u8 = 1;
/// `SPAN_KIND_CLIENT`.
const CLIENT: u8 = 3;

/// A span begun, not yet ended.
struct Open {
    span_id: String,
    parent: String,
    name: &'static str,
    kind: u8,
    start: u64,
    attributes: Vec<(String, AttributeValue)>,
}

/// What the exporter task and every run's trace share.
struct Queue {
    sender: mpsc::Sender<Value>,
    dropped: AtomicU64,
    failed: AtomicU64,
}

impl Queue {
    fn push(&self, span: Value) {
        if self.sender.try_send(span).is_err() {
            let before = self.dropped.fetch_add(1, Ordering::Relaxed);
            if before.is_power_of_two() || before == 0 {
                tracing::warn!(
                    dropped = before + 1,
                    "trace spans dropped: the export queue is full"
                );
            }
        }
    }
}

/// The exporter: a bounded queue and the task that sends its spans in batches.
pub struct Tracer {
    queue: Arc<Queue>,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    endpoint: String,
}

impl Tracer {
    /// Starts exporting as `options` say (within a Tokio runtime: the exporter is a task).
    pub fn start(options: TraceOptions) -> Result<Arc<Self>, String> {
        let mut headers = HeaderMap::new();
        for (key, value) in &options.headers {
            let name = HeaderName::from_bytes(key.as_bytes())
                .map_err(|_| format!("`{key}` is not an HTTP header name (OTLP headers)"))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of OTLP header `{key}` is not a header value"))?;
            headers.insert(name, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let client = deepagents_models::http_client()
            .timeout(options.timeout)
            .default_headers(headers)
            .user_agent(concat!("deepagents-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("cannot make the OTLP client: {error}"))?;
        let (sender, receiver) = mpsc::channel(options.max_queue.max(1));
        let queue = Arc::new(Queue {
            sender,
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        let mut resource = vec![
            (
                "service.name".to_owned(),
                AttributeValue::from(options.service_name.as_str()),
            ),
            (
                "service.version".to_owned(),
                AttributeValue::from(env!("CARGO_PKG_VERSION")),
            ),
            (
                "telemetry.sdk.name".to_owned(),
                AttributeValue::from("deepagents"),
            ),
            (
                "telemetry.sdk.language".to_owned(),
                AttributeValue::from("rust"),
            ),
        ];
        for (key, value) in &options.resource {
            resource.retain(|(known, _)| known != key);
            resource.push((key.clone(), AttributeValue::from(value.as_str())));
        }
        let exporter = Exporter {
            client,
            endpoint: options.endpoint.clone(),
            resource: attributes(&resource),
            max_batch: options.max_batch.max(1),
            queue: Arc::clone(&queue),
        };
        let task = tokio::spawn(exporter.run(receiver, options.flush_interval, stop.clone()));
        Ok(Arc::new(Self {
            queue,
            stop,
            task: Mutex::new(Some(task)),
            endpoint: options.endpoint,
        }))
    }

    /// Where spans go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A trace for one run, its root span begun now with `attributes` (the run's id, thread
    /// id and agent come from its `run_started` event when not among them).
    pub fn run(&self, attributes: Vec<(String, AttributeValue)>) -> RunTrace {
        RunTrace::new(Arc::clone(&self.queue), attributes)
    }

    /// Spans dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.queue.dropped.load(Ordering::Relaxed)
    }

    /// Spans whose export failed.
    pub fn failed(&self) -> u64 {
        self.queue.failed.load(Ordering::Relaxed)
    }

    /// The counters in Prometheus' text format, for `/metrics`.
    pub fn render_metrics(&self) -> String {
        format!(
            "# HELP deepagents_trace_spans_dropped_total Trace spans dropped: the export queue was full.\n# TYPE deepagents_trace_spans_dropped_total counter\ndeepagents_trace_spans_dropped_total {}\n# HELP deepagents_trace_spans_failed_total Trace spans whose export failed.\n# TYPE deepagents_trace_spans_failed_total counter\ndeepagents_trace_spans_failed_total {}\n",
            self.dropped(),
            self.failed()
        )
    }

    /// Exports what is queued and stops, within `within`.
    pub async fn shutdown(&self, within: Duration) {
        self.stop.cancel();
        let task = crate::lock(&self.task).take();
        if let Some(mut task) = task
            && tokio::time::timeout(within, &mut task).await.is_err()
        {
            task.abort();
            tracing::warn!("trace spans still queued at shutdown were not exported");
        }
    }
}

/// The background task's side.
struct Exporter {
    client: reqwest::Client,
    endpoint: String,
    resource: Value,
    max_batch: usize,
    queue: Arc<Queue>,
}

impl Exporter {
    async fn run(
        self,
        mut receiver: mpsc::Receiver<Value>,
        every: Duration,
        stop: CancellationToken,
    ) {
        let mut batch = Vec::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => {
                    receiver.close();
                    while let Some(span) = receiver.recv().await {
                        batch.push(span);
                    }
                    break;
                }
                span = receiver.recv() => match span {
                    Some(span) => {
                        batch.push(span);
                        if batch.len() >= self.max_batch {
                            self.export(std::mem::take(&mut batch)).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if !batch.is_empty() {
                        self.export(std::mem::take(&mut batch)).await;
                    }
                }
            }
        }
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(self.max_batch));
            self.export(std::mem::replace(&mut batch, rest)).await;
        }
    }

    /// POSTs `spans`, trying again after 1 and 2 s when the collector is unreachable or
    /// asks for it (429, 502, 503, 504).
    async fn export(&self, spans: Vec<Value>) {
        let count = spans.len() as u64;
        let body = json!({"resourceSpans": [{
            "resource": {"attributes": self.resource},
            "scopeSpans": [{
                "scope": {"name": "deepagents", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }]});
        let body = match serde_json::to_vec(&body) {
            Ok(body) => body,
            Err(error) => {
                tracing::warn!(%error, "trace spans cannot be written");
                return;
            }
        };
        let mut delay = Duration::from_secs(1);
        for attempt in 1..=3 {
            let again = match self
                .client
                .post(&self.endpoint)
                .body(body.clone())
                .send()
                .await
            {
                Ok(response) if response.status().is_success() => return,
                Ok(response) => {
                    let status = response.status().as_u16();
                    tracing::warn!(status, attempt, "trace spans refused by the OTLP endpoint");
                    matches!(status, 429 | 502 | 503 | 504)
                }
                Err(error) => {
                    tracing::warn!(attempt, error = %error.without_url(), "trace spans not exported");
                    true
                }
            };
            if !again || attempt == 3 {
                break;
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        self.queue.failed.fetch_add(count, Ordering::Relaxed);
    }
}

/// The spans of one run, made from its events: begun as the events start them, queued for
/// export as they end.
pub struct RunTrace {
    queue: Arc<Queue>,
    trace_id: String,
    run: Option<Open>,
    /// Each agent's model, by the call ids of its path.
    models: HashMap<Vec<String>, String>,
    /// The model call going on in each agent.
    model_calls: HashMap<Vec<String>, Open>,
    /// Tool calls going on, by their agent's path and call id.
    tool_calls: HashMap<(Vec<String>, String), Open>,
}

impl RunTrace {
    fn new(queue: Arc<Queue>, attributes: Vec<(String, AttributeValue)>) -> Self {
        Self {
            queue,
            trace_id: random_hex(16),
            run: Some(Open {
                span_id: random_hex(8),
                parent: String::new(),
                name: "deepagents.run",
                kind: INTERNAL,
                start: now_nanos(),
                attributes,
            }),
            models: HashMap::new(),
            model_calls: HashMap::new(),
            tool_calls: HashMap::new(),
        }
    }

    /// The trace's id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// Adds an attribute to the run's span.
    pub fn set(&mut self, key: &str, value: impl Into<AttributeValue>) {
        if let Some(run) = &mut self.run {
            run.attributes.retain(|(known, _)| known != key);
            run.attributes.push((key.to_owned(), value.into()));
        }
    }

    /// The span an agent's calls belong under: the run's for the main agent, the call that
    /// started it for a subagent (the run's when that call is not known).
    fn parent_of(&self, path: &[String]) -> String {
        let run = self
            .run
            .as_ref()
            .map(|run| run.span_id.clone())
            .unwrap_or_default();
        let Some((call, above)) = path.split_last() else {
            return run;
        };
        self.tool_calls
            .get(&(above.to_vec(), call.clone()))
            .map_or(run, |open| open.span_id.clone())
    }

    /// Follows one event of the run.
    pub fn event(&mut self, event: &Event) {
        let path: Vec<String> = event
            .path
            .iter()
            .map(|segment| segment.call_id.clone())
            .collect();
        let agent = event.path.last().map(|segment| segment.name.clone());
        match &event.kind {
            EventKind::RunStarted {
                model,
                agent,
                thread_id,
                ..
            } => {
                if path.is_empty() {
                    self.set("gen_ai.request.model", model.as_str());
                    // What the caller did not say, the run does.
                    let unset = |trace: &Self, key: &str| {
                        trace.run.as_ref().is_some_and(|run| {
                            !run.attributes.iter().any(|(known, _)| known == key)
                        })
                    };
                    if unset(self, "deepagents.run_id") {
                        self.set("deepagents.run_id", event.run_id.as_str());
                    }
                    if unset(self, "gen_ai.agent.name") {
                        self.set("gen_ai.agent.name", agent.as_str());
                    }
                    if let Some(thread_id) = thread_id
                        && unset(self, "deepagents.thread_id")
                    {
                        self.set("deepagents.thread_id", thread_id.as_str());
                        self.set("gen_ai.conversation.id", thread_id.as_str());
                    }
                }
                self.models.insert(path, model.clone());
            }
            EventKind::ModelCallStarted { step } => {
                let mut attributes = vec![
                    ("gen_ai.operation.name".to_owned(), "chat".into()),
                    ("deepagents.step".to_owned(), i64::from(*step).into()),
                ];
                if let Some(model) = self.models.get(&path) {
                    attributes.push(("gen_ai.request.model".to_owned(), model.as_str().into()));
                }
                if let Some(agent) = agent {
                    attributes.push(("deepagents.agent".to_owned(), agent.into()));
                }
                let open = Open {
                    span_id: random_hex(8),
                    parent: self.parent_of(&path),
                    name: "deepagents.model_call",
                    kind: CLIENT,
                    start: now_nanos(),
                    attributes,
                };
                if let Some(unended) = self.model_calls.insert(path, open) {
                    self.end(unended, Some("the model call did not finish"));
                }
            }
            EventKind::ModelCallFinished {
                usage,
                stop_reason,
                tool_calls,
                ..
            } => {
                let Some(mut open) = self.model_calls.remove(&path) else {
                    return;
                };
                let reason = serde_json::to_value(stop_reason)
                    .ok()
                    .and_then(|reason| reason.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "other".to_owned());
                let count = |n: u64| AttributeValue::Int(i64::try_from(n).unwrap_or(i64::MAX));
                open.attributes.extend([
                    (
                        "gen_ai.usage.input_tokens".to_owned(),
                        count(usage.input_tokens),
                    ),
                    (
                        "gen_ai.usage.output_tokens".to_owned(),
                        count(usage.output_tokens),
                    ),
                    (
                        "deepagents.usage.cached_input_tokens".to_owned(),
                        count(usage.cached_input_tokens),
                    ),
                    (
                        "gen_ai.response.finish_reasons".to_owned(),
                        AttributeValue::Strings(vec![reason.clone()]),
                    ),
                    ("deepagents.stop_reason".to_owned(), reason.into()),
                    (
                        "deepagents.tool_calls".to_owned(),
                        count(*tool_calls as u64),
                    ),
                ]);
                if usage.cache_write_input_tokens > 0 {
                    open.attributes.push((
                        "deepagents.usage.cache_write_input_tokens".to_owned(),
                        count(usage.cache_write_input_tokens),
                    ));
                }
                self.end(open, None);
            }
            EventKind::ToolCallStarted { call_id, name, .. } => {
                let mut attributes = vec![
                    ("gen_ai.operation.name".to_owned(), "execute_tool".into()),
                    ("gen_ai.tool.name".to_owned(), name.as_str().into()),
                    ("gen_ai.tool.call.id".to_owned(), call_id.as_str().into()),
                ];
                if let Some(agent) = agent {
                    attributes.push(("deepagents.agent".to_owned(), agent.into()));
                }
                let open = Open {
                    span_id: random_hex(8),
                    parent: self.parent_of(&path),
                    name: "deepagents.tool_call",
                    kind: INTERNAL,
                    start: now_nanos(),
                    attributes,
                };
                self.tool_calls.insert((path, call_id.clone()), open);
            }
            EventKind::ToolCallFinished {
                call_id,
                status,
                content,
                ..
            } => {
                let Some(mut open) = self.tool_calls.remove(&(path, call_id.clone())) else {
                    return;
                };
                let failed = *status == ToolStatus::Error;
                open.attributes.push((
                    "deepagents.tool.status".to_owned(),
                    if failed { "error" } else { "ok" }.into(),
                ));
                // The model sees why it failed; the span says so, briefly.
                let message = failed.then(|| {
                    let text: String = content
                        .iter()
                        .filter_map(|block| match block {
                            deepagents::core::ContentBlock::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    text.chars().take(512).collect::<String>()
                });
                self.end(open, message.as_deref().or(failed.then_some("")));
            }
            EventKind::Interrupted { actions } if path.is_empty() => {
                self.set(
                    "deepagents.run.pending_actions",
                    i64::try_from(actions.len()).unwrap_or(i64::MAX),
                );
            }
            EventKind::Final { spent, steps, .. } if path.is_empty() => {
                let count = |n: u64| AttributeValue::Int(i64::try_from(n).unwrap_or(i64::MAX));
                self.set("gen_ai.usage.input_tokens", count(spent.usage.input_tokens));
                self.set(
                    "gen_ai.usage.output_tokens",
                    count(spent.usage.output_tokens),
                );
                self.set("deepagents.steps", i64::from(*steps));
                self.set(
                    "deepagents.cost_usd",
                    AttributeValue::Double(spent.cost_usd),
                );
            }
            EventKind::Error { kind, .. } if path.is_empty() => {
                if let Some(kind) = serde_json::to_value(kind)
                    .ok()
                    .and_then(|kind| kind.as_str().map(str::to_owned))
                {
                    self.set("deepagents.error.kind", kind);
                }
            }
            _ => {}
        }
    }

    /// Ends the run's span with `status` (`deepagents.run.status`): an error when `error`
    /// says why it failed, ok otherwise. Calls still going end with it, as errors.
    pub fn finish(&mut self, status: &str, error: Option<&str>) {
        let Some(mut run) = self.run.take() else {
            return;
        };
        let unended: Vec<Open> = self
            .model_calls
            .drain()
            .map(|(_, open)| open)
            .chain(self.tool_calls.drain().map(|(_, open)| open))
            .collect();
        for open in unended {
            self.end(open, Some("unfinished when the run ended"));
        }
        run.attributes
            .push(("deepagents.run.status".to_owned(), status.into()));
        self.end(run, error);
    }

    /// Queues `open` ended now: an error with `error` as its message when given.
    fn end(&self, open: Open, error: Option<&str>) {
        let status = match error {
            Some(message) => json!({"code": 2, "message": message}),
            None => json!({"code": 1}),
        };
        let mut span = json!({
            "traceId": self.trace_id,
            "spanId": open.span_id,
            "name": open.name,
            "kind": open.kind,
            "startTimeUnixNano": open.start.to_string(),
            "endTimeUnixNano": now_nanos().max(open.start).to_string(),
            "attributes": attributes(&open.attributes),
            "status": status,
        });
        if !open.parent.is_empty() {
            span["parentSpanId"] = Value::String(open.parent);
        }
        self.queue.push(span);
    }
}

impl Drop for RunTrace {
    /// A run whose drive ended without an outcome (its task was dropped) still has a span.
    fn drop(&mut self) {
        self.finish(
            "abandoned",
            Some("the run's drive ended without an outcome"),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn vars(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = list
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn options_come_from_the_standard_variables() {
        assert!(TraceOptions::from_vars(vars(&[])).unwrap().is_none());
        let options = TraceOptions::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-api-key=abc%3D%3D, x-team = core",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Team=agents"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
            ("OTEL_BSP_SCHEDULE_DELAY", "250"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(options.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(
            options.headers,
            vec![
                ("x-api-key".to_owned(), "abc==".to_owned()),
                ("X-Team".to_owned(), "agents".to_owned()),
            ]
        );
        assert_eq!(options.service_name, "deepagents");
        assert_eq!(
            options.resource,
            vec![("deployment.environment".to_owned(), "prod".to_owned())]
        );
        assert_eq!(options.flush_interval, Duration::from_millis(250));
        // The traces endpoint is taken as is, and beats the base one.
        let options = TraceOptions::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://otlp.example.com/api/traces",
            ),
            ("OTEL_SERVICE_NAME", "agents"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=other"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(options.endpoint, "https://otlp.example.com/api/traces");
        assert_eq!(options.service_name, "agents");
        assert!(options.resource.is_empty());
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            let set = vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off]);
            assert!(TraceOptions::from_vars(set).unwrap().is_none(), "{off:?}");
        }
        for (bad, named) in [
            (("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), "grpc"),
            (("OTEL_EXPORTER_OTLP_HEADERS", "secret"), "entry 1"),
            (
                ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
                "OTEL_BSP_SCHEDULE_DELAY",
            ),
            (("OTEL_TRACES_EXPORTER", "zipkin"), "zipkin"),
        ] {
            let set = vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), bad]);
            let error = TraceOptions::from_vars(set).err().unwrap();
            assert!(error.contains(named), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
        let error =
            TraceOptions::from_vars(vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]))
                .err()
                .unwrap();
        assert!(error.contains("not an http(s) URL"), "{error}");
    }

    #[test]
    fn ids_are_random_hex_of_the_otlp_lengths() {
        let trace = random_hex(16);
        let span = random_hex(8);
        assert_eq!(trace.len(), 32);
        assert_eq!(span.len(), 16);
        assert!(trace.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(random_hex(8), span);
    }

    #[tokio::test]
    async fn a_full_queue_drops_spans_and_counts_them() {
        let mut options = TraceOptions::new("http://127.0.0.1:9/v1/traces");
        options.max_queue = 1;
        options.flush_interval = Duration::from_secs(3600);
        options.max_batch = 1000;
        let tracer = Tracer::start(options).unwrap();
        // Nothing reads the queue meanwhile (the exporter task has not run on this thread).
        for _ in 0..3 {
            tracer.run(Vec::new()).finish("success", None);
        }
        assert_eq!(tracer.dropped(), 2);
        assert!(
            tracer
                .render_metrics()
                .contains("deepagents_trace_spans_dropped_total 2")
        );
        tracer.stop.cancel();
        if let Some(task) = crate::lock(&tracer.task).take() {
            task.abort();
        }
    }
}
