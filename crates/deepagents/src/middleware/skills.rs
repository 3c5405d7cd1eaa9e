//! Skills: folders of instructions the model reads when a task calls for them.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_backends::{Backend, BackendContext, BackendError, VPath};
use deepagents_core::{AgentState, ModelRequest, Reducer, RunContext, StateKey, StateUpdate};
use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError};
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

/// A skill as listed in the prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillInfo {
    /// Its name.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// Path of its SKILL.md.
    pub path: String,
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
}

/// The custom state key holding the problems found while loading the skills; absent when
/// there were none. Set once per thread with the listing, so they reach the event stream as
/// part of that state update.
pub const SKILL_WARNINGS_KEY: &str = "skill_warnings";

/// The skills found, typed.
const SKILLS: StateKey<Vec<SkillInfo>> = StateKey::new(SKILLS_KEY);
/// The skills refused, typed.
const SKILL_WARNINGS: StateKey<Vec<SkillWarning>> = StateKey::new(SKILL_WARNINGS_KEY);

/// A problem with a skill. Breaking a naming or length rule only warns, and the skill is still
/// listed; a skill that cannot be read or has no description is left out (`skipped`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillWarning {
    /// The skill's name, or its folder's when it has no usable name.
    pub skill: String,
    /// Its SKILL.md.
    pub path: String,
    /// The rule broken: `name_length`, `name_format`, `name_mismatch`, `name_missing`,
    /// `description_missing`, `description_length`, `compatibility_length`, `file_size`,
    /// `encoding`, `frontmatter` or `unreadable`.
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
    Some(SkillInfo {
        name: clip(&name, MAX_NAME),
        description: clip(description.trim(), MAX_DESCRIPTION),
        path: file.to_string(),
    })
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
        let mut section = PROMPT_HEAD.to_owned();
        for skill in skills {
            section.push_str(&format!(
                "\n- {}: {} ({})",
                skill.name, skill.description, skill.path
            ));
        }
        request.push_system_section(&section);
        Ok(())
    }
}
