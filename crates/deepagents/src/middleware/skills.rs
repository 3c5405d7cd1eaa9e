//! Skills: folders of instructions the model reads when a task calls for them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_backends::{Backend, BackendContext, BackendError, VPath};
use deepagents_core::{
    AgentState, ModelRequest, Reducer, RunContext, StateKey, StateUpdate, ToolCall, ToolContext,
    ToolError, ToolOutput,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Middleware, MiddlewareError, ToolNext};
use crate::frontmatter;

/// The custom state key holding the skill listing.
pub const SKILLS_KEY: &str = "skills";

/// Limits from the skill format; breaking them produces warnings, never failures.
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1_024;
const MAX_COMPATIBILITY: usize = 500;
const MAX_FILE_MB: usize = 10;
const MAX_FILE_BYTES: usize = MAX_FILE_MB * 1024 * 1024;

const PROMPT_HEAD: &str = "\
## Skills
Skills are folders of instructions for specialised tasks. When a task matches a skill, read \
its SKILL.md with read_file before you start and follow it; it may point to more files in its \
folder. Available skills:";

const PROMPT_TOOLS: &str = "\
Some skills bring tools of their own (named after `brings tools:`). Those tools are offered \
only once you have read the skill's SKILL.md with read_file, and stay available for the rest \
of the conversation.";

/// The harness's own tools: never withheld, whatever a skill names. The model needs some to
/// find and read a skill, and Claude skills list the ones they use (`Read`, `Write`, `Bash`)
/// though every agent has them: a skill brings the tools the agent would not offer
/// otherwise (its own, an MCP server's).
const ALWAYS_OFFERED: [&str; 14] = [
    "read_file",
    "ls",
    "glob",
    "grep",
    "write_file",
    "edit_file",
    "delete",
    "execute",
    "write_todos",
    "task",
    "ask_user",
    "web_fetch",
    "compact_conversation",
    "final_answer",
];

/// A skill as listed in the prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillInfo {
    /// Its name.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// Path of its SKILL.md.
    pub path: String,
    /// The tools it brings, from its frontmatter (`tools`, `allowed-tools`,
    /// `metadata.include_tools`): tool names in our spelling, and `SERVER__*` for all the tools
    /// of an MCP server. Those tools are offered only once the skill has been read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

/// SKILL.md frontmatter. Unknown fields are allowed: the format grows.
#[derive(Deserialize)]
struct SkillMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    compatibility: Option<String>,
    /// Ours: a list, or names separated by commas or spaces.
    #[serde(default)]
    tools: Option<Value>,
    /// Claude's: `Read, Grep, Bash(git status:*)`, or a list.
    #[serde(default, rename = "allowed-tools", alias = "allowed_tools")]
    allowed_tools: Option<Value>,
    /// LangChain deepagents': `metadata.include_tools`, names separated by spaces.
    #[serde(default)]
    metadata: Option<Value>,
}

/// The custom state key holding the problems found while loading the skills; absent when
/// there were none. Set once per thread with the listing, so they reach the event stream as
/// part of that state update.
pub const SKILL_WARNINGS_KEY: &str = "skill_warnings";

/// The skills found, typed.
const SKILLS: StateKey<Vec<SkillInfo>> = StateKey::new(SKILLS_KEY);
/// The skills refused, typed.
const SKILL_WARNINGS: StateKey<Vec<SkillWarning>> = StateKey::new(SKILL_WARNINGS_KEY);

/// The custom state key listing the skills the model has read that bring tools, by name,
/// in the order read; their tools are offered from then on. Absent until the first such read.
/// Clear it (set `[]`) to withdraw those tools again.
pub const LOADED_SKILLS_KEY: &str = "skills_loaded";
/// The skills read, typed.
const LOADED_SKILLS: StateKey<Vec<String>> = StateKey::new(LOADED_SKILLS_KEY);

/// A problem with a skill. Breaking a naming or length rule only warns, and the skill is still
/// listed; a skill that cannot be read or has no description is left out (`skipped`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillWarning {
    /// The skill's name, or its folder's when it has no usable name.
    pub skill: String,
    /// Its SKILL.md.
    pub path: String,
    /// The rule broken: `name_length`, `name_format`, `name_mismatch`, `name_missing`,
    /// `description_missing`, `description_length`, `compatibility_length`, `tools`,
    /// `file_size`, `encoding`, `frontmatter` or `unreadable`.
    pub rule: String,
    /// What is wrong, in a sentence.
    pub message: String,
    /// Whether the skill was left out of the listing.
    pub skipped: bool,
}

/// Lists the skills found in source directories (each skill a folder with a `SKILL.md`) in the
/// system prompt: name, description and path only; the model reads a skill when it needs it.
/// A later source overrides an earlier one's skill of the same name. Problems with a skill
/// become [`SkillWarning`]s in the state ([`SKILL_WARNINGS_KEY`]) and never stop the run. Its
/// name is `skills`.
///
/// A skill can bring tools ([`SkillInfo::tools`]): the agent's tools it names are withheld
/// from the model until it reads that skill's SKILL.md with `read_file`; the read is recorded
/// in the state ([`LOADED_SKILLS_KEY`]), so they stay offered for the rest of the thread,
/// across resumes and compaction. A call to a withheld tool is refused with a message naming
/// the skill to read. The harness's own tools (file tools, `execute`, `write_todos`, `task`,
/// …) are never withheld.
pub struct SkillsMiddleware {
    backend: Arc<dyn Backend>,
    sources: Vec<VPath>,
}

impl SkillsMiddleware {
    /// Skills from `sources` (backend directories), lowest precedence first.
    pub fn new(backend: Arc<dyn Backend>, sources: Vec<VPath>) -> Self {
        Self { backend, sources }
    }

    async fn load(&self, cx: &BackendContext) -> (Vec<SkillInfo>, Vec<SkillWarning>) {
        let mut skills: BTreeMap<String, SkillInfo> = BTreeMap::new();
        let mut warnings = Vec::new();
        for source in &self.sources {
            // A missing source directory is normal: most locations are optional.
            let Ok(entries) = self.backend.ls(cx, source).await else {
                continue;
            };
            for dir in entries.into_iter().filter(|e| e.is_dir) {
                let Ok(dir_path) = VPath::parse(&dir.path) else {
                    continue;
                };
                let Ok(skill_file) = dir_path.join("SKILL.md") else {
                    continue;
                };
                let folder = dir_path.file_name().unwrap_or_default().to_owned();
                let raw = match self.backend.read_raw(cx, &skill_file).await {
                    Ok(raw) => raw,
                    // A folder without SKILL.md is not a skill (shared scripts, assets).
                    Err(BackendError::NotFound { .. } | BackendError::IsDirectory { .. }) => {
                        continue;
                    }
                    // The backend's own limit (the disk backend's) can be below the format's.
                    Err(BackendError::TooLarge { size, max, .. }) => {
                        warnings.push(warning(
                            &folder,
                            &skill_file,
                            "file_size",
                            format!("SKILL.md is {size} bytes, over the {max}-byte limit; skipped"),
                            true,
                        ));
                        continue;
                    }
                    Err(error) => {
                        warnings.push(warning(
                            &folder,
                            &skill_file,
                            "unreadable",
                            format!("SKILL.md cannot be read ({error}); skipped"),
                            true,
                        ));
                        continue;
                    }
                };
                if let Some(skill) = parse_skill(&folder, &skill_file, &raw.data, &mut warnings) {
                    skills.insert(skill.name.clone(), skill);
                }
            }
        }
        (skills.into_values().collect(), warnings)
    }
}

fn warning(skill: &str, file: &VPath, rule: &str, message: String, skipped: bool) -> SkillWarning {
    SkillWarning {
        skill: skill.to_owned(),
        path: file.to_string(),
        rule: rule.to_owned(),
        message,
        skipped,
    }
}

/// Whether `name` is lowercase letters and digits joined by single hyphens.
fn well_formed(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn clip(text: &str, max: usize) -> String {
    crate::tools::output::truncate_chars(text, max).to_owned()
}

/// Reads one skill; `None` (with a warning) when it cannot be listed.
fn parse_skill(
    folder: &str,
    file: &VPath,
    data: &[u8],
    warnings: &mut Vec<SkillWarning>,
) -> Option<SkillInfo> {
    let mut warn = |skill: &str, rule: &str, message: String, skipped: bool| {
        warnings.push(warning(skill, file, rule, message, skipped));
    };
    if data.len() > MAX_FILE_BYTES {
        warn(
            folder,
            "file_size",
            format!("SKILL.md is over the {MAX_FILE_MB} MB limit; skipped"),
            true,
        );
        return None;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        warn(
            folder,
            "encoding",
            "SKILL.md is not UTF-8 text; skipped".to_owned(),
            true,
        );
        return None;
    };
    let meta: SkillMeta = match frontmatter::parse(file.as_str(), text) {
        Ok((meta, _body)) => meta,
        Err(error) => {
            warn(
                folder,
                "frontmatter",
                format!("{}; skipped", error.message),
                true,
            );
            return None;
        }
    };
    let name = match meta.name.filter(|n| !n.trim().is_empty()) {
        Some(name) => name,
        None => {
            warn(
                folder,
                "name_missing",
                format!("no name; the folder name `{folder}` is used"),
                false,
            );
            folder.to_owned()
        }
    };
    let Some(description) = meta.description.filter(|d| !d.trim().is_empty()) else {
        warn(
            &name,
            "description_missing",
            "no description, so the model could not tell when to use it; skipped".to_owned(),
            true,
        );
        return None;
    };
    if name.chars().count() > MAX_NAME {
        warn(
            &name,
            "name_length",
            format!("the name is over {MAX_NAME} characters; it is cut in the listing"),
            false,
        );
    }
    if !well_formed(&name) {
        warn(
            &name,
            "name_format",
            format!("the name `{name}` should be lowercase letters, digits and single hyphens"),
            false,
        );
    }
    if name != folder {
        warn(
            &name,
            "name_mismatch",
            format!("the name `{name}` differs from its folder `{folder}`"),
            false,
        );
    }
    if description.chars().count() > MAX_DESCRIPTION {
        warn(
            &name,
            "description_length",
            format!(
                "the description is over {MAX_DESCRIPTION} characters; it is cut in the listing"
            ),
            false,
        );
    }
    if meta
        .compatibility
        .is_some_and(|c| c.chars().count() > MAX_COMPATIBILITY)
    {
        warn(
            &name,
            "compatibility_length",
            format!("compatibility is over {MAX_COMPATIBILITY} characters"),
            false,
        );
    }
    let mut tools = Vec::new();
    let include = meta
        .metadata
        .as_ref()
        .and_then(|m| m.get("include_tools"))
        .cloned();
    for (key, value) in [
        ("tools", meta.tools),
        ("allowed-tools", meta.allowed_tools),
        ("metadata.include_tools", include),
    ] {
        let Some(value) = value else { continue };
        let Some(entries) = tool_entries(&value) else {
            warn(
                &name,
                "tools",
                format!("`{key}` should be a list of tool names or one string of them; ignored"),
                false,
            );
            continue;
        };
        for entry in entries {
            match normalize_tool(&entry) {
                Some(tool) => {
                    if !ALWAYS_OFFERED.contains(&tool.as_str()) && !tools.contains(&tool) {
                        tools.push(tool);
                    }
                }
                None => warn(
                    &name,
                    "tools",
                    format!("`{entry}` in `{key}` is not a tool name; ignored"),
                    false,
                ),
            }
        }
    }
    Some(SkillInfo {
        name: clip(&name, MAX_NAME),
        description: clip(description.trim(), MAX_DESCRIPTION),
        path: file.to_string(),
        tools,
    })
}

/// The entries of a tool list: a YAML list of strings, or one string of names separated by
/// commas or whitespace (a `(…)` specifier, as in `Bash(git status:*)`, stays with its name).
/// `None` when it is neither.
fn tool_entries(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::Null => Some(Vec::new()),
        Value::String(text) => Some(split_tools(text)),
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(split_tools))
            .collect::<Option<Vec<_>>>()
            .map(|lists| lists.into_iter().flatten().collect()),
        _ => None,
    }
}

/// Splits at commas and whitespace outside parentheses.
fn split_tools(text: &str) -> Vec<String> {
    let mut entries = Vec::new();
    let mut current = String::new();
    let mut depth = 0_usize;
    for c in text.chars() {
        match c {
            '(' => {
                depth += 1;
                current.push(c);
            }
            ')' => {
                depth = depth.saturating_sub(1);
                current.push(c);
            }
            c if depth == 0 && (c == ',' || c.is_whitespace()) => {
                if !current.is_empty() {
                    entries.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        entries.push(current);
    }
    entries
}

/// Claude Code's names of our tools.
const CLAUDE_NAMES: [(&str, &str); 11] = [
    ("Read", "read_file"),
    ("Write", "write_file"),
    ("Edit", "edit_file"),
    ("MultiEdit", "edit_file"),
    ("Bash", "execute"),
    ("Glob", "glob"),
    ("Grep", "grep"),
    ("LS", "ls"),
    ("WebFetch", "web_fetch"),
    ("Task", "task"),
    ("TodoWrite", "write_todos"),
];

/// Replaces what a provider refuses in a tool name, as MCP tool names are made.
fn clean_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One entry of a skill's tool list in our spelling: a tool name, or `SERVER__*` for every tool
/// of an MCP server. Claude's permission specifier (`Bash(git status:*)`) is dropped: the skill
/// brings the whole tool. `None` when nothing usable is left.
fn normalize_tool(entry: &str) -> Option<String> {
    let name = entry.split('(').next().unwrap_or_default().trim();
    if let Some((_, ours)) = CLAUDE_NAMES.iter().find(|(claude, _)| *claude == name) {
        return Some((*ours).to_owned());
    }
    if let Some(rest) = name.strip_prefix("mcp__") {
        // `mcp__SERVER`, `mcp__SERVER__*`, or one tool `mcp__SERVER__TOOL`.
        let (server, tool) = rest.split_once("__").unwrap_or((rest, "*"));
        let server = clean_name(server);
        if server.is_empty() {
            return None;
        }
        return Some(match tool {
            "" | "*" => format!("{server}__*"),
            tool => format!("{server}__{}", clean_name(tool)),
        });
    }
    let wildcard = name.strip_suffix('*');
    let base = wildcard.unwrap_or(name).trim_end_matches('_');
    if base.is_empty()
        || !base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return None;
    }
    Some(match wildcard {
        Some(_) => format!("{base}__*"),
        None => name.to_owned(),
    })
}

/// Whether `tool` is one that `entry` (a [`SkillInfo::tools`] entry) brings: the tool of that
/// name, or, for a server's name (`SERVER` or `SERVER__*`), each of its tools (`SERVER__…`).
fn brings(entry: &str, tool: &str) -> bool {
    let server = entry.strip_suffix("__*").unwrap_or(entry);
    tool == entry
        || tool
            .strip_prefix(server)
            .is_some_and(|rest| rest.starts_with("__") && rest.len() > 2)
}

impl SkillInfo {
    /// Whether this skill brings `tool`.
    fn brings(&self, tool: &str) -> bool {
        !ALWAYS_OFFERED.contains(&tool) && self.tools.iter().any(|entry| brings(entry, tool))
    }
}

/// The path a `read_file` call reads, normalized as the tool does.
fn read_path(call: &ToolCall) -> Option<String> {
    let args = match &call.arguments {
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?,
        other => other.clone(),
    };
    let path = VPath::parse(args.get("file_path")?.as_str()?).ok()?;
    Some(path.to_string())
}

#[async_trait]
impl Middleware for SkillsMiddleware {
    fn name(&self) -> &str {
        "skills"
    }

    fn state_values(&self) -> Vec<(String, Reducer)> {
        vec![
            (SKILLS_KEY.to_owned(), Reducer::Replace),
            (SKILL_WARNINGS_KEY.to_owned(), Reducer::Replace),
            (LOADED_SKILLS_KEY.to_owned(), Reducer::Append),
        ]
    }

    async fn before_run(
        &self,
        ctx: &RunContext,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        if state.custom.contains_key(SKILLS_KEY) {
            return Ok(StateUpdate::default());
        }
        let cx = BackendContext::for_run(ctx, Arc::new(state.clone()));
        let (skills, warnings) = self.load(&cx).await;
        let mut update = SKILLS.update(&skills)?;
        if !warnings.is_empty() {
            SKILL_WARNINGS.set(&mut update, &warnings)?;
        }
        Ok(update)
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let skills = SKILLS.get(state)?.unwrap_or_default();
        if skills.is_empty() {
            return Ok(());
        }
        let loaded = LOADED_SKILLS.get(state)?.unwrap_or_default();
        let mut section = PROMPT_HEAD.to_owned();
        let mut withheld = BTreeSet::new();
        let mut unlocked = BTreeSet::new();
        for skill in &skills {
            section.push_str(&format!(
                "\n- {}: {} ({})",
                skill.name, skill.description, skill.path
            ));
            // Only the tools the agent has: a name no tool answers to is not mentioned.
            let tools: Vec<&str> = request
                .tools
                .iter()
                .map(|t| t.name.as_str())
                .filter(|name| skill.brings(name))
                .collect();
            if tools.is_empty() {
                continue;
            }
            section.push_str(&format!(" — brings tools: {}", tools.join(", ")));
            if loaded.contains(&skill.name) {
                unlocked.extend(tools);
            } else {
                withheld.extend(tools);
            }
        }
        if !withheld.is_empty() || !unlocked.is_empty() {
            section.push_str("\n\n");
            section.push_str(PROMPT_TOOLS);
        }
        let withheld: BTreeSet<String> = withheld
            .difference(&unlocked)
            .map(|name| (*name).to_owned())
            .collect();
        request.push_system_section(&section);
        request.tools.retain(|tool| !withheld.contains(&tool.name));
        Ok(())
    }

    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        let skills = SKILLS.get(&ctx.state).ok().flatten().unwrap_or_default();
        if skills.iter().all(|skill| skill.tools.is_empty()) {
            return next.call(call, ctx).await;
        }
        let loaded = LOADED_SKILLS
            .get(&ctx.state)
            .ok()
            .flatten()
            .unwrap_or_default();
        let owners: Vec<&SkillInfo> = skills.iter().filter(|s| s.brings(&call.name)).collect();
        if !owners.is_empty() && !owners.iter().any(|s| loaded.contains(&s.name)) {
            let reads: Vec<String> = owners
                .iter()
                .map(|s| format!("`{}` ({})", s.name, s.path))
                .collect();
            return Err(ToolError::RespondToModel(format!(
                "`{}` is not available yet: it comes with the skill {}. Read that SKILL.md \
                 with read_file and follow it; the tool is offered from your next step on.",
                call.name,
                reads.join(" or ")
            )));
        }
        // A read of the SKILL.md of a skill that brings tools loads it.
        let read = (call.name == "read_file")
            .then(|| read_path(&call))
            .flatten()
            .and_then(|path| {
                skills
                    .iter()
                    .find(|s| s.path == path && !s.tools.is_empty() && !loaded.contains(&s.name))
            })
            .map(|s| s.name.clone());
        let mut output = next.call(call, ctx).await?;
        if let Some(name) = read
            && !output.is_error
        {
            LOADED_SKILLS
                .set(&mut output.update, &vec![name])
                .map_err(|e| ToolError::Fatal(e.to_string()))?;
        }
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools_of(frontmatter: &str) -> (Vec<String>, Vec<String>) {
        let file = VPath::parse("/skills/s/SKILL.md").unwrap();
        let text = format!("---\nname: s\ndescription: d\n{frontmatter}\n---\nbody\n");
        let mut warnings = Vec::new();
        let skill = parse_skill("s", &file, text.as_bytes(), &mut warnings).unwrap();
        let rules = warnings.into_iter().map(|w| w.message).collect();
        (skill.tools, rules)
    }

    #[test]
    fn claude_allowed_tools_become_our_names() {
        // Claude's names are the harness's own tools, never withheld: only the rest is brought.
        let (tools, warnings) = tools_of(
            "allowed-tools: Read, Grep, Bash(git status:*), Bash(git diff:*) Edit WebFetch lint_report",
        );
        assert_eq!(tools, ["lint_report"]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let (tools, _) = tools_of("allowed-tools:\n  - Write\n  - mcp__github__create_issue");
        assert_eq!(tools, ["github__create_issue"]);
    }

    #[test]
    fn our_tools_key_and_include_tools_and_servers() {
        let (tools, _) =
            tools_of("tools: [my_tool, mcp__linear]\nmetadata:\n  include_tools: other mcp__fs__*");
        assert_eq!(tools, ["my_tool", "linear__*", "other", "fs__*"]);
        assert!(brings("linear__*", "linear__list"));
        assert!(brings("linear", "linear__list"));
        assert!(!brings("linear__*", "linearx__list"));
        assert!(!brings("linear__*", "linear__"));
        assert!(brings("my_tool", "my_tool") && !brings("my_tool", "my_tool2"));
    }

    #[test]
    fn unusable_tool_lists_warn_and_keep_the_skill() {
        let (tools, warnings) = tools_of("tools: 5\nallowed-tools: \"Bash, @@\"");
        assert!(tools.is_empty(), "{tools:?}");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("`tools` should be a list"));
        assert!(warnings[1].contains("`@@`"));
    }
}
