//! Telling text from binary, and naming the media type of binary files.
//!
//! One rule for every backend, the one ripgrep uses plus signatures: bytes are binary when they
//! carry a known binary signature, the file name has a binary extension, or they hold a NUL
//! byte. Everything else is text, **whether or not it is valid UTF-8**: a Latin-1 or
//! Windows-1252 file is text whose invalid bytes read as U+FFFD, grep searches it byte-wise, and
//! an edit keeps the bytes it does not replace. So a file named `/a.svg` is an image even when it
//! was written as text (it reads back as `image/svg+xml` data, cannot be edited as text, and
//! grep skips it), while `caf\xe9\n` under `/menu.txt` is text.

/// What a file's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classified {
    /// UTF-8 text.
    Text(String),
    /// Text that is not valid UTF-8 (a legacy encoding, or a file with a few stray bytes). It
    /// reads with U+FFFD for each invalid sequence and is edited byte-wise.
    NonUtf8Text(Vec<u8>),
    /// Anything else, with its media type.
    Binary {
        /// Detected media type.
        mime_type: String,
    },
}

/// The media type of UTF-8 text files.
pub const TEXT_MIME: &str = "text/plain; charset=utf-8";

/// The media type of text files that are not valid UTF-8 (the charset is unknown).
pub const NON_UTF8_TEXT_MIME: &str = "text/plain";

/// The media type of binary content that matches no known format.
pub const OCTET_STREAM: &str = "application/octet-stream";

const PPT: &str = "application/vnd.ms-powerpoint";
const PPTX: &str = "application/vnd.openxmlformats-officedocument.presentationml.presentation";

/// Classifies `bytes` (named `path`): binary when the content sniffs as a known binary format,
/// the extension names one, or it holds a NUL byte; otherwise UTF-8 text or other text. Never
/// fails.
pub fn classify(path: &str, bytes: Vec<u8>) -> Classified {
    if let Some(mime_type) = binary_type(path, &bytes) {
        return Classified::Binary {
            mime_type: mime_type.to_owned(),
        };
    }
    match String::from_utf8(bytes) {
        Ok(text) => Classified::Text(text),
        Err(e) => Classified::NonUtf8Text(e.into_bytes()),
    }
}

/// The media type of `bytes`, text or not: [`TEXT_MIME`] for UTF-8 text and
/// [`NON_UTF8_TEXT_MIME`] for other text.
pub fn mime_type(path: &str, bytes: &[u8]) -> String {
    match binary_type(path, bytes) {
        Some(mime) => mime.to_owned(),
        None if std::str::from_utf8(bytes).is_ok() => TEXT_MIME.to_owned(),
        None => NON_UTF8_TEXT_MIME.to_owned(),
    }
}

/// The binary media type of `bytes` named `path`, or `None` when they are text (see the module
/// docs). A prefix of a file is enough to tell a signature, not to rule out a later NUL byte.
pub fn binary_type(path: &str, bytes: &[u8]) -> Option<&'static str> {
    detect(path, bytes).or_else(|| bytes.contains(&0).then_some(OCTET_STREAM))
}

/// Whether `mime_type` is one of the two text types this module names.
pub fn is_text_mime(mime_type: &str) -> bool {
    mime_type == TEXT_MIME || mime_type == NON_UTF8_TEXT_MIME
}

/// The binary media type of `text` stored as text under `path`, or `None` when it is text by
/// the rule of [`classify`]. Backends that keep text as strings use it to present such files as
/// the disk backend presents the same bytes.
pub fn binary_type_of_text(path: &str, text: &str) -> Option<&'static str> {
    binary_type(path, text.as_bytes())
}

/// The media type by content, then by extension.
fn detect(path: &str, bytes: &[u8]) -> Option<&'static str> {
    let extension = binary_by_extension(path);
    Some(match sniff(bytes) {
        None => return extension,
        Some(Sniffed::Format(mime)) => mime,
        Some(Sniffed::Container(container)) => match extension {
            // A container holds many formats; an extension naming one of them decides.
            Some(mime) if container.members().contains(&mime) => mime,
            _ => container.inspect(bytes),
        },
    })
}

/// What a signature says.
enum Sniffed {
    /// One format.
    Format(&'static str),
    /// A container format shared by several file types.
    Container(Container),
}

#[derive(Clone, Copy)]
enum Container {
    /// OLE2 compound files: legacy Office documents (ppt, doc, xls) and more.
    Ole2,
    /// Zip archives, including Office Open XML documents (pptx, docx, xlsx).
    Zip,
    /// Advanced Systems Format: wmv, wma, asf.
    Asf,
}

impl Container {
    /// The media types (as named by [`binary_by_extension`]) stored in this container.
    fn members(self) -> &'static [&'static str] {
        match self {
            Self::Ole2 => &[PPT],
            Self::Zip => &[PPTX],
            Self::Asf => &["video/x-ms-wmv"],
        }
    }

    /// The media type by looking inside, when the extension does not say.
    fn inspect(self, bytes: &[u8]) -> &'static str {
        match self {
            // The directory of a PowerPoint file names its main stream (in UTF-16LE).
            Self::Ole2 if contains(bytes, &utf16le("PowerPoint Document")) => PPT,
            Self::Ole2 => "application/x-ole-storage",
            // Every OOXML package has a content-types part; a presentation keeps its parts
            // under `ppt/`. Both names appear uncompressed in the zip's file headers.
            Self::Zip if contains(bytes, b"[Content_Types].xml") && contains(bytes, b"ppt/") => {
                PPTX
            }
            Self::Zip => "application/zip",
            Self::Asf => "video/x-ms-asf",
        }
    }
}

fn utf16le(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Media types by magic number.
fn sniff(bytes: &[u8]) -> Option<Sniffed> {
    let starts = |magic: &[u8]| bytes.starts_with(magic);
    let at = |offset: usize, tag: &[u8]| bytes.get(offset..offset + tag.len()) == Some(tag);
    let riff = |kind: &[u8]| starts(b"RIFF") && at(8, kind);
    let brand = at(4, b"ftyp").then(|| bytes.get(8..12)).flatten();
    let format = match () {
        () if starts(b"\x89PNG\r\n\x1a\n") => "image/png",
        () if starts(b"\xff\xd8\xff") => "image/jpeg",
        () if starts(b"GIF87a") || starts(b"GIF89a") => "image/gif",
        () if riff(b"WEBP") => "image/webp",
        () if riff(b"WAVE") => "audio/wav",
        () if riff(b"AVI ") => "video/x-msvideo",
        () if starts(b"%PDF-") => "application/pdf",
        () if starts(b"OggS") => "audio/ogg",
        () if starts(b"fLaC") => "audio/flac",
        () if id3v2(bytes) => "audio/mpeg",
        () if starts(b"FORM") && (at(8, b"AIFF") || at(8, b"AIFC")) => "audio/aiff",
        () if starts(b"\x1a\x45\xdf\xa3") => "video/webm",
        () if starts(b"\x00\x00\x01\xba") || starts(b"\x00\x00\x01\xb3") => "video/mpeg",
        () if starts(b"FLV\x01") => "video/x-flv",
        () if starts(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1") => {
            return Some(Sniffed::Container(Container::Ole2));
        }
        () if starts(b"PK\x03\x04") => return Some(Sniffed::Container(Container::Zip)),
        () if starts(b"\x30\x26\xb2\x75\x8e\x66\xcf\x11\xa6\xd9\x00\xaa\x00\x62\xce\x6c") => {
            return Some(Sniffed::Container(Container::Asf));
        }
        () => match brand {
            Some(brand) => iso_media(brand),
            None => frame_sync(bytes)?,
        },
    };
    Some(Sniffed::Format(format))
}

/// An ID3v2 tag: `ID3`, a major version 2 to 4 and a revision below 0xFF. The version byte
/// keeps text that merely starts with "ID3" from passing as audio.
fn id3v2(bytes: &[u8]) -> bool {
    matches!(bytes, [b'I', b'D', b'3', 2..=4, revision, ..] if *revision != 0xff)
}

/// ISO base media files (`ftyp` box) by major brand.
fn iso_media(brand: &[u8]) -> &'static str {
    match brand {
        b"heic" | b"heix" | b"hevc" | b"hevx" | b"heim" | b"heis" | b"hevm" | b"hevs" => {
            "image/heic"
        }
        b"mif1" | b"msf1" | b"mif2" => "image/heif",
        b"avif" | b"avis" => "image/avif",
        b"qt  " => "video/quicktime",
        b"M4A " | b"M4B " => "audio/mp4",
        [b'3', b'g', b'2', _] => "video/3gpp2",
        [b'3', b'g', _, _] => "video/3gpp",
        _ => "video/mp4",
    }
}

/// Raw MPEG audio streams start with a frame header instead of a container: an 11-bit sync,
/// then version and layer. Layer bits `00` under a 12-bit sync are an AAC ADTS header.
fn frame_sync(bytes: &[u8]) -> Option<&'static str> {
    let [0xff, second, third, ..] = *bytes else {
        return None;
    };
    let layer = (second >> 1) & 0b11;
    if second & 0xf0 == 0xf0 && layer == 0 {
        // ADTS: the sampling frequency index must name one of the 13 defined rates.
        return ((third >> 2) & 0x0f < 13).then_some("audio/aac");
    }
    let version = (second >> 3) & 0b11;
    let bitrate = third >> 4;
    let rate = (third >> 2) & 0b11;
    // Reserved version, layer, bitrate and rate values mean it is not a frame header.
    let frame = second & 0xe0 == 0xe0 && version != 0b01 && layer != 0 && bitrate != 0x0f;
    (frame && rate != 0b11).then_some("audio/mpeg")
}

/// Media types of binary formats by extension (for content that does not sniff, such as SVG,
/// which is text but is returned to models as an image).
fn binary_by_extension(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let extension = name.rsplit_once('.')?.1.to_ascii_lowercase();
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
        "aif" | "aiff" | "aifc" => "audio/aiff",
        "aac" => "audio/aac",
        "ogg" => "audio/ogg",
        "flac" => "audio/flac",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mpeg" | "mpg" => "video/mpeg",
        "mov" => "video/quicktime",
        "avi" => "video/x-msvideo",
        "flv" => "video/x-flv",
        "wmv" => "video/x-ms-wmv",
        "3gp" | "3gpp" => "video/3gpp",
        "pdf" => "application/pdf",
        "ppt" => PPT,
        "pptx" => PPTX,
        _ => return None,
    })
}
