//! What the TUI remembers about threads beyond their conversation: a title, the approval
//! mode and plan mode, in `tui-threads.json` of the data directory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One thread's notes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// Given with `/rename`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The approval mode when it was last used.
    #[serde(default)]
    pub mode: super::app::Mode,
    /// Whether plan mode was on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plan: bool,
}

/// The notes of every thread.
pub struct Notes {
    path: Option<PathBuf>,
    notes: BTreeMap<String, Note>,
}

impl Notes {
    /// The notes in the data directory (none when it cannot be read).
    pub fn load() -> Self {
        let path = crate::workspace::data_dir()
            .ok()
            .map(|dir| dir.join("tui-threads.json"));
        let notes = path
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Self { path, notes }
    }

    /// Thread `id`'s notes.
    pub fn get(&self, id: &str) -> Note {
        self.notes.get(id).cloned().unwrap_or_default()
    }

    /// Changes thread `id`'s notes and writes them down (best effort: a read-only data
    /// directory loses them, nothing else).
    pub fn update(&mut self, id: &str, change: impl FnOnce(&mut Note)) {
        change(self.notes.entry(id.to_owned()).or_default());
        if let (Some(path), Ok(text)) = (&self.path, serde_json::to_string_pretty(&self.notes)) {
            let _ = std::fs::write(path, text);
        }
    }
}

/// `2026-12-02 16:37` (UTC) for milliseconds since the Unix epoch.
pub fn date(ms: u64) -> String {
    let stamp = deepagents::core::event::rfc3339_ms(ms);
    stamp.get(..16).unwrap_or(&stamp).replacen('T', " ", 1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(super::date(0), "1970-01-01 00:00");
        assert_eq!(super::date(1_796_228_784_421), "2026-12-02 16:26");
        assert_eq!(super::date(951_782_400_000), "2000-02-29 00:00");
    }
}
