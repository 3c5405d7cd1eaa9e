//! `deepagents serve`: the agents the flags and `[[assistants]]` describe, over HTTP with the
//! LangGraph Platform API.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};

use crate::args::ServeArgs;
use crate::config;
use crate::session::{Front, Session, prepare_watched};

/// Runs the server until a signal (SIGTERM, Ctrl-C, SIGHUP): the runs in flight are stopped
/// (their commands killed, what they did saved; in a cluster, handed back) before it returns,
/// with success — the signal is how a server is meant to stop.
pub fn main(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Runs of different threads are independent: both cores serve them.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(serve(args));
    // Everything that had to end was awaited; the workers get a moment to drop what tasks
    // are left (with their guards) before the process exits.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

/// The server's logs on stderr, each line with the run and thread it concerns: text on a
/// terminal, JSON lines otherwise (for log collectors).
fn init_logs() {
    let logs = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_writer(std::io::stderr);
    let _ = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        logs.try_init()
    } else {
        logs.json().try_init()
    };
}

/// What serving needs, once started.
struct Started {
    listener: tokio::net::TcpListener,
    options: deepagents_server::ServerOptions,
    /// The flags' agent's session, then the other assistants': dropping them stops their MCP
    /// servers.
    sessions: Vec<Session>,
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logs();
    // A signal while the assistants are built (MCP servers starting) abandons start-up; the
    // sessions built so far are dropped, which stops their servers.
    let Ok(started) = crate::shutdown::or_signal(start(args)).await else {
        return Ok(ExitCode::SUCCESS);
    };
    let Started {
        listener,
        options,
        sessions,
    } = started?;
    deepagents_server::serve(listener, options, async {
        crate::shutdown::signalled().await;
    })
    .await?;
    // The runs have settled: stopped, saved, their commands ended.
    eprintln!("deepagents serve: stopped");
    for session in &sessions {
        if let Some(mcp) = &session.mcp {
            mcp.stop();
        }
        session.store.close().await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds every assistant, joins the cluster and listens.
async fn start(args: ServeArgs) -> anyhow::Result<Started> {
    if args.run.task.is_some() || args.run.thread.is_some() {
        bail!("`serve` takes no task or --thread: clients create threads and runs over the API");
    }
    let config = config::load(args.run.config.as_deref())?;
    let mut api_keys: BTreeMap<String, String> = config.server.api_keys.clone();
    for pair in &args.api_keys {
        let Some((key, tenant)) = pair.split_once('=') else {
            bail!("--api-key takes KEY=TENANT, not `{pair}`");
        };
        api_keys.insert(key.to_owned(), tenant.to_owned());
    }
    let jwt = jwt_options(&args, config.server.auth.as_ref())?;
    // The standard OTEL_* variables; one that cannot be used stops start-up.
    let traces = deepagents_server::otel::TraceOptions::from_env()
        .map_err(anyhow::Error::msg)
        .context("cannot export traces")?;
    let session = prepare_watched(&args.run, Front::Server, true, None).await?;
    let Some(watch) = session.watch.clone() else {
        bail!("the agent keeps no threads, so it cannot be served");
    };
    let store = Arc::clone(&session.store);
    let mut sessions: Vec<Session> = Vec::new();
    let mut assistants = vec![deepagents_server::Assistant::new(
        "agent",
        session.agent.clone(),
    )];
    for entry in &config.assistants {
        let mut run = args.run.clone();
        if let Some(model) = &entry.model {
            run.model = Some(model.clone());
        }
        if let Some(prompt) = &entry.system_prompt {
            run.system_prompt = Some(prompt.clone());
        }
        run.interrupt_on.extend(entry.interrupt_on.iter().cloned());
        if let Some(permissions) = &entry.permissions {
            run.permissions = Some(permissions.clone());
        }
        run.mcp_config.extend(entry.mcp_config.iter().cloned());
        run.agent_dirs.extend(entry.agents.iter().cloned());
        run.skill_dirs.extend(entry.skills.iter().cloned());
        let built = prepare_watched(&run, Front::Server, true, Some(watch.clone()))
            .await
            .with_context(|| format!("assistant `{}` of the config file", entry.name))?;
        let mut assistant = deepagents_server::Assistant::new(&entry.name, built.agent.clone());
        assistant.description.clone_from(&entry.description);
        assistants.push(assistant);
        sessions.push(built);
    }
    let listen = args
        .listen
        .or(config.server.listen)
        .unwrap_or_else(|| "127.0.0.1:2024".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}; pass another --listen ADDRESS"))?;
    let address = listener.local_addr().context("cannot read the address")?;
    let tenants = match (api_keys.is_empty(), &jwt) {
        (true, None) => "no API key asked for".to_owned(),
        (false, None) => format!("{} API keys", api_keys.len()),
        (true, Some(_)) => "bearer JWTs".to_owned(),
        (false, Some(_)) => format!("bearer JWTs and {} API keys", api_keys.len()),
    };
    eprintln!(
        "deepagents serve: listening on http://{address} ({} assistants; {tenants})",
        assistants.len()
    );
    let cors = cors_origins(
        &args.cors,
        config.server.cors.as_deref(),
        address,
        !api_keys.is_empty() || jwt.is_some(),
    )?;
    let mut options = deepagents_server::ServerOptions::new(assistants, store, watch);
    options.api_keys = api_keys;
    options.jwt = jwt;
    options.cors = cors;
    if let Some(max) = config.server.max_connections {
        if max == 0 {
            bail!("max_connections of [server] must be at least 1");
        }
        options.connections.max_connections = max;
    }
    if let Some(secs) = config.server.header_timeout_secs {
        if secs == 0 {
            bail!("header_timeout_secs of [server] must be at least 1");
        }
        options.connections.header_read_timeout = std::time::Duration::from_secs(secs);
    }
    options.webhooks.allowed_hosts = config.server.webhook_allowed_hosts.clone();
    options
        .webhooks
        .allowed_hosts
        .extend(args.webhook_allow.iter().cloned());
    options.webhooks.secret = std::env::var("DEEPAGENTS_WEBHOOK_SECRET")
        .ok()
        .filter(|secret| !secret.is_empty())
        .or_else(|| config.server.webhook_secret.clone());
    options.cluster = cluster(args.jobs).await?;
    if let Some(traces) = &traces {
        eprintln!(
            "deepagents serve: exporting traces to {} (OTLP/HTTP JSON)",
            traces.endpoint
        );
    }
    options.traces = traces;
    sessions.insert(0, session);
    Ok(Started {
        listener,
        options,
        sessions,
    })
}

/// Bearer JWTs as the flags and `[server.auth]` describe them; `None` when neither names a
/// JWKS URL, a public key or a secret.
fn jwt_options(
    args: &ServeArgs,
    configured: Option<&config::AuthConfig>,
) -> anyhow::Result<Option<deepagents_server::JwtOptions>> {
    let default = config::AuthConfig::default();
    let auth = configured.unwrap_or(&default);
    let mut options = deepagents_server::JwtOptions {
        jwks_url: args.jwks_url.clone().or_else(|| auth.jwks_url.clone()),
        issuer: args.jwt_issuer.clone().or_else(|| auth.issuer.clone()),
        audience: if args.jwt_audience.is_empty() {
            auth.audience.clone()
        } else {
            args.jwt_audience.clone()
        },
        ..deepagents_server::JwtOptions::default()
    };
    for path in auth.public_keys.iter().chain(&args.jwt_public_keys) {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the JWT public key {}", path.display()))?;
        options.public_keys.push(pem);
    }
    if let Some(name) = args
        .jwt_secret_env
        .as_ref()
        .or(auth.hs256_secret_env.as_ref())
    {
        match std::env::var(name) {
            Ok(secret) if !secret.is_empty() => options.hs256_secret = Some(secret.into_bytes()),
            _ => bail!(
                "the HS256 secret is to come from ${name} (--jwt-secret-env or hs256_secret_env of [server.auth]), which is not set"
            ),
        }
    }
    if let Some(claim) = &auth.user_claim {
        options.user_claim.clone_from(claim);
    }
    if let Some(secs) = auth.leeway_secs {
        options.leeway = std::time::Duration::from_secs(secs);
    }
    if let Some(secs) = auth.jwks_refetch_secs {
        options.jwks_refetch_interval = std::time::Duration::from_secs(secs);
    }
    let keyed = options.jwks_url.is_some()
        || !options.public_keys.is_empty()
        || options.hs256_secret.is_some();
    if !keyed {
        if configured.is_some() || options.issuer.is_some() || !options.audience.is_empty() {
            bail!(
                "bearer JWTs need keys to verify them: jwks_url, public_keys or hs256_secret_env in [server.auth] (or --jwks-url, --jwt-public-key, --jwt-secret-env)"
            );
        }
        return Ok(None);
    }
    Ok(Some(options))
}

/// The cluster `DEEPAGENTS_DATABASE_URL` (PostgreSQL) and `DEEPAGENTS_REDIS_URL` name: runs
/// queued in the database, their events fanned out through Redis, shared by every server
/// started with the same two.
async fn cluster(
    jobs: Option<usize>,
) -> anyhow::Result<Option<Arc<deepagents_server::cluster::Cluster>>> {
    let database = std::env::var("DEEPAGENTS_DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty());
    let redis = std::env::var("DEEPAGENTS_REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty());
    match (database, redis) {
        (Some(database), Some(redis)) if database.starts_with("postgres") => {
            // Servers of one deployment share runs; another deployment on the same database
            // names itself otherwise.
            let name = std::env::var("DEEPAGENTS_CLUSTER").unwrap_or_else(|_| "default".to_owned());
            let mut cluster =
                deepagents_server::cluster::Cluster::connect(&database, &redis, &name)
                    .await
                    .context("cannot join the cluster")?;
            if let Some(jobs) = jobs {
                cluster = cluster.with_jobs(jobs);
            }
            eprintln!(
                "deepagents serve: sharing runs with other servers (PostgreSQL queue, Redis events)"
            );
            Ok(Some(Arc::new(cluster)))
        }
        (_, Some(_)) => bail!(
            "DEEPAGENTS_REDIS_URL is set, but a cluster also needs DEEPAGENTS_DATABASE_URL=postgres://… (the queue and the threads live there)"
        ),
        _ if jobs.is_some() => bail!(
            "--jobs limits the runs a server of a cluster drives; set DEEPAGENTS_DATABASE_URL and DEEPAGENTS_REDIS_URL to join one (an embedded server runs every run it accepts)"
        ),
        _ => Ok(None),
    }
}

/// Which web pages may call the server: `--cors`, else `cors` of `[server]`, else any page
/// when only this machine can reach the server and no key or token is asked for — a browser UI on
/// another local port then works out of the box, as it does with `langgraph dev` — and none
/// otherwise, where allowing pages is the operator's choice.
fn cors_origins(
    flags: &[String],
    configured: Option<&[String]>,
    address: std::net::SocketAddr,
    authenticated: bool,
) -> anyhow::Result<deepagents_server::CorsOrigins> {
    let chosen = if flags.is_empty() {
        configured
    } else {
        Some(flags)
    };
    match chosen {
        Some([none]) if none == "none" => Ok(deepagents_server::CorsOrigins::None),
        Some(origins) => deepagents_server::CorsOrigins::from_list(origins)
            .context("in --cors or `cors` of [server]"),
        None if address.ip().is_loopback() && !authenticated => {
            Ok(deepagents_server::CorsOrigins::Any)
        }
        None => Ok(deepagents_server::CorsOrigins::None),
    }
}
