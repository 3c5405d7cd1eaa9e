//! Markdown files with YAML frontmatter (subagent definitions, skills).

use serde::de::DeserializeOwned;

/// A markdown file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {message}")]
pub struct FrontmatterError {
    /// The file (or other source) it came from.
    pub source_name: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Splits `text` into its frontmatter, parsed as `T`, and the body after it.
///
/// The file must start with a line `---`, and the frontmatter ends at the next line `---`.
pub fn parse<T: DeserializeOwned>(
    source_name: &str,
    text: &str,
) -> Result<(T, String), FrontmatterError> {
    let error = |message: String| FrontmatterError {
        source_name: source_name.to_owned(),
        message,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return Err(error(
            "the file must start with YAML frontmatter between `---` lines".to_owned(),
        ));
    };
    let mut offset = 0;
    let mut end = None;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            end = Some((offset, offset + line.len()));
            break;
        }
        offset += line.len();
    }
    let Some((yaml_end, body_start)) = end else {
        return Err(error(
            "the frontmatter is not closed; end it with a line `---`".to_owned(),
        ));
    };
    let meta = serde_saphyr::from_str(&rest[..yaml_end])
        .map_err(|e| error(format!("invalid frontmatter: {e}")))?;
    Ok((meta, rest[body_start..].trim().to_owned()))
}
