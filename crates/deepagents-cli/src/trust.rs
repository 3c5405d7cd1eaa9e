//! Whether the project's own configuration that runs commands — `.deepagents/hooks.json`,
//! `.mcp.json`, `.deepagents/.mcp.json` — may run: with `--trust-project`, or once the person
//! at the terminal said yes for these files as they are now. The answer is remembered per
//! project in the data directory, tied to the files' contents: a changed file asks again.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

/// The project files that run commands, relative to the root.
const FILES: [&str; 3] = [
    ".deepagents/hooks.json",
    ".mcp.json",
    ".deepagents/.mcp.json",
];

/// Whether the project in `root` is trusted; asks on a terminal when it has such files and
/// has not been trusted as they are.
pub fn project(root: &Path, flag: bool, may_ask: bool) -> anyhow::Result<bool> {
    if flag {
        return Ok(true);
    }
    let present: Vec<PathBuf> = FILES
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.is_file())
        .collect();
    if present.is_empty() {
        return Ok(false);
    }
    let key = root
        .canonicalize()
        .unwrap_or_else(|_| root.to_owned())
        .display()
        .to_string();
    let print = fingerprint(&present);
    let store = crate::workspace::data_dir()?.join("trusted-projects.json");
    let mut trusted: BTreeMap<String, String> = std::fs::read_to_string(&store)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    if trusted.get(&key) == Some(&print) {
        return Ok(true);
    }
    if !may_ask || !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    let names: Vec<String> = present.iter().map(|p| p.display().to_string()).collect();
    let mut err = std::io::stderr();
    write!(
        err,
        "The project at {key} configures commands to run ({}). Trust them? [y/N] ",
        names.join(", ")
    )?;
    err.flush()?;
    let mut answer = String::new();
    {
        // Nothing has started yet: a signal while the question waits exits at once.
        let _blocking = crate::shutdown::blocking();
        std::io::stdin().lock().read_line(&mut answer)?;
    }
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        return Ok(false);
    }
    trusted.insert(key, print);
    if let Some(dir) = store.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&store, serde_json::to_string_pretty(&trusted)?)?;
    Ok(true)
}

/// A hash of the files' names and contents (FNV-1a, 64 bits): enough to notice a change.
fn fingerprint(files: &[PathBuf]) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for file in files {
        let bytes = std::fs::read(file).unwrap_or_default();
        for byte in file
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .chain([0u8].iter())
            .chain(&bytes)
        {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}
