//! Telling text from binary, and naming the media type of binary files.

/// What a file's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classified {
    /// UTF-8 text.
    Text(String),
    /// Anything else, with its media type.
    Binary {
        /// Detected media type.
        mime_type: String,
    },
}

/// The media type of text files.
pub const TEXT_MIME: &str = "text/plain; charset=utf-8";

/// Classifies `bytes` (named `path`): binary when the content sniffs as a known binary format,
/// the extension names one, it holds a NUL byte, or it is not valid UTF-8. Never fails.
pub fn classify(path: &str, bytes: Vec<u8>) -> Classified {
    if let Some(mime) = sniff(&bytes).or_else(|| binary_by_extension(path)) {
        return Classified::Binary {
            mime_type: mime.to_owned(),
        };
    }
    if bytes.contains(&0) {
        return Classified::Binary {
            mime_type: "application/octet-stream".to_owned(),
        };
    }
    match String::from_utf8(bytes) {
        Ok(text) => Classified::Text(text),
        Err(_) => Classified::Binary {
            mime_type: "application/octet-stream".to_owned(),
        },
    }
}

/// The media type of `bytes`, text or not.
pub fn mime_type(path: &str, bytes: &[u8]) -> String {
    match sniff(bytes).or_else(|| binary_by_extension(path)) {
        Some(mime) => mime.to_owned(),
        None if !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok() => TEXT_MIME.to_owned(),
        None => "application/octet-stream".to_owned(),
    }
}

/// Media types by magic number.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    let starts = |magic: &[u8]| bytes.starts_with(magic);
    let riff = |kind: &[u8]| bytes.len() >= 12 && starts(b"RIFF") && &bytes[8..12] == kind;
    let ftyp = bytes.len() >= 12 && &bytes[4..8] == b"ftyp";
    Some(match () {
        () if starts(b"\x89PNG\r\n\x1a\n") => "image/png",
        () if starts(b"\xff\xd8\xff") => "image/jpeg",
        () if starts(b"GIF87a") || starts(b"GIF89a") => "image/gif",
        () if riff(b"WEBP") => "image/webp",
        () if riff(b"WAVE") => "audio/wav",
        () if riff(b"AVI ") => "video/x-msvideo",
        () if starts(b"%PDF-") => "application/pdf",
        () if starts(b"OggS") => "audio/ogg",
        () if starts(b"fLaC") => "audio/flac",
        () if starts(b"ID3") => "audio/mpeg",
        () if starts(b"FORM") && bytes.len() >= 12 && &bytes[8..12] == b"AIFF" => "audio/aiff",
        () if starts(b"\x1a\x45\xdf\xa3") => "video/webm",
        () if starts(b"\x00\x00\x01\xba") || starts(b"\x00\x00\x01\xb3") => "video/mpeg",
        () if ftyp && (bytes[8..12] == *b"heic" || bytes[8..12] == *b"heix") => "image/heic",
        () if ftyp && (bytes[8..12] == *b"mif1" || bytes[8..12] == *b"msf1") => "image/heif",
        () if ftyp && bytes[8..12] == *b"qt  " => "video/quicktime",
        () if ftyp => "video/mp4",
        _ => return None,
    })
}

/// Media types of binary formats by extension (for content that does not sniff, such as SVG,
/// which is text but is returned to models as an image).
fn binary_by_extension(path: &str) -> Option<&'static str> {
    let extension = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "aif" | "aiff" => "audio/aiff",
        "aac" => "audio/aac",
        "ogg" => "audio/ogg",
        "flac" => "audio/flac",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mpeg" | "mpg" => "video/mpeg",
        "mov" => "video/quicktime",
        "avi" => "video/x-msvideo",
        "pdf" => "application/pdf",
        "ppt" => "application/vnd.ms-powerpoint",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        _ => return None,
    })
}
