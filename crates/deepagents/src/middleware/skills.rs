//! Skills: folders of instructions the model reads when a task calls for them.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_backends::{Backend, BackendContext, VPath};
use deepagents_core::{AgentState, ModelRequest, Reducer, StateUpdate};
use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError};
use crate::frontmatter;

/// The custom state key holding the skill listing.
pub const SKILLS_KEY: &str = "skills";

/// Limits from the skill format; breaking them produces warnings, never failures.
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1_024;
const MAX_COMPATIBILITY: usize = 500;
const MAX_FILE_BYTES: usize = 10 * 1024 * 1024;

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

/// Lists the skills found in source directories (each skill a folder with a `SKILL.md`) in the
/// system prompt: name, description and path only; the model reads a skill when it needs it.
/// A later source overrides an earlier one's skill of the same name. Problems with a skill are
/// logged as warnings and never stop the run. Its name is `skills`.
pub struct SkillsMiddleware {
    backend: Arc<dyn Backend>,
    sources: Vec<VPath>,
}

impl SkillsMiddleware {
    /// Skills from `sources` (backend directories), lowest precedence first.
    pub fn new(backend: Arc<dyn Backend>, sources: Vec<VPath>) -> Self {
        Self { backend, sources }
    }

    async fn load(&self, cx: &BackendContext) -> (Vec<SkillInfo>, Vec<String>) {
        let mut skills: BTreeMap<String, SkillInfo> = BTreeMap::new();
        let mut warnings = Vec::new();
        for source in &self.sources {
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
                let Ok(raw) = self.backend.read_raw(cx, &skill_file).await else {
                    continue;
                };
                match parse_skill(&dir_path, &skill_file, &raw.data, &mut warnings) {
                    Some(skill) => {
                        skills.insert(skill.name.clone(), skill);
                    }
                    None => continue,
                }
            }
        }
        (skills.into_values().collect(), warnings)
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
    dir: &VPath,
    file: &VPath,
    data: &[u8],
    warnings: &mut Vec<String>,
) -> Option<SkillInfo> {
    let folder = dir.file_name().unwrap_or_default().to_owned();
    if data.len() > MAX_FILE_BYTES {
        warnings.push(format!("{file} is larger than 10 MB; skipped"));
        return None;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        warnings.push(format!("{file} is not UTF-8 text; skipped"));
        return None;
    };
    let meta: SkillMeta = match frontmatter::parse(file.as_str(), text) {
        Ok((meta, _body)) => meta,
        Err(error) => {
            warnings.push(format!("{error}; skipped"));
            return None;
        }
    };
    let Some(description) = meta.description.filter(|d| !d.trim().is_empty()) else {
        warnings.push(format!("{file} has no description; skipped"));
        return None;
    };
    let name = match meta.name.filter(|n| !n.trim().is_empty()) {
        Some(name) => name,
        None => {
            warnings.push(format!(
                "{file} has no name; using the folder name `{folder}`"
            ));
            folder.clone()
        }
    };
    if name.chars().count() > MAX_NAME {
        warnings.push(format!("{file}: the name is over {MAX_NAME} characters"));
    }
    if !well_formed(&name) {
        warnings.push(format!(
            "{file}: the name `{name}` should be lowercase letters, digits and single hyphens"
        ));
    }
    if name != folder {
        warnings.push(format!(
            "{file}: the name `{name}` differs from its folder `{folder}`"
        ));
    }
    if description.chars().count() > MAX_DESCRIPTION {
        warnings.push(format!(
            "{file}: the description is over {MAX_DESCRIPTION} characters; it is cut in the listing"
        ));
    }
    if meta
        .compatibility
        .is_some_and(|c| c.chars().count() > MAX_COMPATIBILITY)
    {
        warnings.push(format!(
            "{file}: compatibility is over {MAX_COMPATIBILITY} characters"
        ));
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
        vec![(SKILLS_KEY.to_owned(), Reducer::Replace)]
    }

    async fn before_run(&self, state: &AgentState) -> Result<StateUpdate, MiddlewareError> {
        if state.custom.contains_key(SKILLS_KEY) {
            return Ok(StateUpdate::default());
        }
        let cx = BackendContext::with_state(Arc::new(state.clone()));
        let (skills, warnings) = self.load(&cx).await;
        for warning in warnings {
            tracing::warn!(target: "deepagents::skills", "{warning}");
        }
        let value = serde_json::to_value(&skills).map_err(|e| MiddlewareError(e.to_string()))?;
        Ok(StateUpdate::default().with_custom(SKILLS_KEY, value))
    }

    async fn before_model(
        &self,
        request: &mut ModelRequest,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let skills: Vec<SkillInfo> = state
            .custom
            .get(SKILLS_KEY)
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| MiddlewareError(format!("corrupt skills state: {e}")))?
            .unwrap_or_default();
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
