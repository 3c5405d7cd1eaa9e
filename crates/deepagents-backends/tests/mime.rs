//! Media types: every multimodal type by extension and by signature, text look-alikes, and
//! the rule that text is told from binary by NUL bytes and signatures, not by UTF-8 validity.

use deepagents_backends::mime::{
    Classified, NON_UTF8_TEXT_MIME, TEXT_MIME, binary_type, binary_type_of_text, classify,
    mime_type,
};
use proptest::prelude::*;

use deepagents_backends::testing::{ASF, OLE2, PPT, PPTX, ole2_with, signatures, zip_with};

#[test]
fn every_signature_is_sniffed_whatever_the_name() {
    for (what, bytes, expected) in signatures() {
        // No extension, a text extension, and an extension naming another format: the
        // signature decides each time.
        for path in ["/blob", "/notes.txt", "/dir.v2/README", "/photo.jpg"] {
            assert_eq!(mime_type(path, &bytes), expected, "{what} at {path}");
            assert_eq!(
                classify(path, bytes.clone()),
                Classified::Binary {
                    mime_type: expected.to_owned()
                },
                "{what} at {path}"
            );
        }
    }
}

#[test]
fn every_extension_names_its_type() {
    let cases = [
        ("png", "image/png"),
        ("jpg", "image/jpeg"),
        ("jpeg", "image/jpeg"),
        ("gif", "image/gif"),
        ("webp", "image/webp"),
        ("svg", "image/svg+xml"),
        ("heic", "image/heic"),
        ("heif", "image/heif"),
        ("wav", "audio/wav"),
        ("mp3", "audio/mpeg"),
        ("aif", "audio/aiff"),
        ("aiff", "audio/aiff"),
        ("aac", "audio/aac"),
        ("ogg", "audio/ogg"),
        ("flac", "audio/flac"),
        ("mp4", "video/mp4"),
        ("webm", "video/webm"),
        ("mpeg", "video/mpeg"),
        ("mpg", "video/mpeg"),
        ("mov", "video/quicktime"),
        ("avi", "video/x-msvideo"),
        ("flv", "video/x-flv"),
        ("wmv", "video/x-ms-wmv"),
        ("3gp", "video/3gpp"),
        ("3gpp", "video/3gpp"),
        ("pdf", "application/pdf"),
        ("ppt", PPT),
        ("pptx", PPTX),
    ];
    for (extension, expected) in cases {
        for name in [
            format!("/media/file.{extension}"),
            format!("/media/FILE.{}", extension.to_uppercase()),
        ] {
            // Content without a signature (here, plain text) is typed by its name.
            for bytes in [&b"no signature here"[..], &[0x00, 0x9f, 0x00][..], &[][..]] {
                assert_eq!(mime_type(&name, bytes), expected, "{name}");
                assert!(
                    matches!(classify(&name, bytes.to_vec()), Classified::Binary { mime_type } if mime_type == expected),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn containers_are_told_apart_by_extension_or_content() {
    // An extension naming a format of the container decides without looking inside.
    assert_eq!(mime_type("/deck.ppt", OLE2), PPT);
    assert_eq!(mime_type("/deck.pptx", &zip_with(&["a.xml"])), PPTX);
    assert_eq!(mime_type("/clip.wmv", ASF), "video/x-ms-wmv");
    // Otherwise the content does, and unknown members stay generic (but binary).
    assert_eq!(mime_type("/deck", &ole2_with("PowerPoint Document")), PPT);
    assert_eq!(
        mime_type("/letter", &ole2_with("WordDocument")),
        "application/x-ole-storage"
    );
    assert_eq!(mime_type("/letter.txt", OLE2), "application/x-ole-storage");
    let docx = zip_with(&["[Content_Types].xml", "word/document.xml"]);
    assert_eq!(mime_type("/letter", &docx), "application/zip");
    // `ppt/` without a content-types part is just a zip that has such a folder.
    assert_eq!(
        mime_type("/x", &zip_with(&["ppt/slide.xml"])),
        "application/zip"
    );
    assert_eq!(
        mime_type("/archive.zip", &zip_with(&["a"])),
        "application/zip"
    );
}

#[test]
fn text_that_resembles_a_signature_stays_text() {
    for text in [
        "ID3 tags explained\n",
        "ID3\n",
        "FORMAT: json\n",
        "RIFF raff\n",
        "PK is a prefix\n",
        "GIF is a format\n",
        "ftyp\n",
        "1234ftyp\n",
        "",
        "<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n",
    ] {
        assert_eq!(mime_type("/notes", text.as_bytes()), TEXT_MIME, "{text:?}");
        assert_eq!(
            classify("/notes.md", text.as_bytes().to_vec()),
            Classified::Text(text.to_owned())
        );
        assert_eq!(binary_type_of_text("/notes.md", text), None, "{text:?}");
    }
}

#[test]
fn frame_sync_needs_a_valid_header() {
    // 0xFF then garbage: not audio (binary when it holds a NUL, text otherwise).
    for (bytes, expected) in [
        (&b"\xff\x00\x00"[..], "application/octet-stream"),
        (b"\xff\xfb\xf0\x00", "application/octet-stream"), // bitrate index 15 is reserved
        (b"\xff\xfb\x9c\x00", "application/octet-stream"), // sample rate index 3 is reserved
        (b"\xff\xeb\x90\x00", "application/octet-stream"), // MPEG version 01 is reserved
        (b"\xff\xf1\x3c\x80", NON_UTF8_TEXT_MIME),         // ADTS sampling index 15 is not a rate
        (b"\xff\xfb", NON_UTF8_TEXT_MIME),                 // too short to hold a header
    ] {
        assert_eq!(mime_type("/x", bytes), expected, "{bytes:?}");
    }
}

/// As ripgrep tells them: invalid UTF-8 (Latin-1, stray bytes) under a text name is text; a
/// NUL byte makes anything binary.
#[test]
fn invalid_utf8_under_a_text_extension_is_text_but_nul_is_binary() {
    for path in ["/a.txt", "/src/main.rs", "/README.md", "/noext"] {
        for bytes in [
            &b"caf\xe9 cr\xe8me\nneedle here\n"[..],
            b"\xc3",
            b"\xed\xa0\x80",     // an encoded surrogate
            b"\xf4\x90\x80\x80", // past U+10FFFF
        ] {
            assert_eq!(
                classify(path, bytes.to_vec()),
                Classified::NonUtf8Text(bytes.to_vec()),
                "{path} {bytes:?}"
            );
            assert_eq!(mime_type(path, bytes), NON_UTF8_TEXT_MIME);
            assert_eq!(binary_type(path, bytes), None);
        }
        for bytes in [&b"ok\0nul"[..], b"caf\xe9\0"] {
            assert_eq!(
                classify(path, bytes.to_vec()),
                Classified::Binary {
                    mime_type: "application/octet-stream".into()
                },
                "{path} {bytes:?}"
            );
            assert_eq!(mime_type(path, bytes), "application/octet-stream");
        }
    }
}

#[test]
fn text_kept_as_a_string_is_binary_by_the_same_rule() {
    assert_eq!(
        binary_type_of_text("/a.svg", "<svg/>"),
        Some("image/svg+xml")
    );
    assert_eq!(
        binary_type_of_text("/doc.txt", "%PDF-1.4\n"),
        Some("application/pdf")
    );
    assert_eq!(
        binary_type_of_text("/a.txt", "a\0b"),
        Some("application/octet-stream")
    );
    assert_eq!(binary_type_of_text("/a.txt", "plain"), None);
}

fn any_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/a.txt".to_owned()),
        Just("/a.svg".to_owned()),
        Just("/a".to_owned()),
        Just("/a.PPT".to_owned()),
        Just("/.mp3".to_owned()),
        "/[a-z.]{0,8}",
    ]
}

fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    let prefixes: Vec<Vec<u8>> = signatures().into_iter().map(|(_, b, _)| b).collect();
    (
        proptest::sample::select(prefixes),
        0..24usize,
        proptest::collection::vec(any::<u8>(), 0..48),
        any::<bool>(),
    )
        .prop_map(|(prefix, cut, tail, keep)| {
            // Whole signatures, truncated ones, and plain noise.
            let mut bytes = if keep {
                prefix[..cut.min(prefix.len())].to_vec()
            } else {
                Vec::new()
            };
            bytes.extend(tail);
            bytes
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Never panics, and the entry points agree: text exactly when `mime_type` says so, and
    /// then the text is the bytes.
    #[test]
    fn classification_is_total_and_consistent(path in any_path(), bytes in any_bytes()) {
        let mime = mime_type(&path, &bytes);
        prop_assert_eq!(binary_type(&path, &bytes).is_none(), mime.starts_with("text/plain"));
        match classify(&path, bytes.clone()) {
            Classified::Text(text) => {
                prop_assert_eq!(&mime, TEXT_MIME);
                prop_assert_eq!(text.as_bytes(), &bytes[..]);
                prop_assert_eq!(binary_type_of_text(&path, &text), None);
            }
            Classified::NonUtf8Text(kept) => {
                prop_assert_eq!(&mime, NON_UTF8_TEXT_MIME);
                prop_assert_eq!(&kept, &bytes);
                prop_assert!(std::str::from_utf8(&bytes).is_err());
                prop_assert!(!bytes.contains(&0));
            }
            Classified::Binary { mime_type } => {
                prop_assert_eq!(&mime_type, &mime);
                prop_assert_ne!(&mime, TEXT_MIME);
                prop_assert_ne!(&mime, NON_UTF8_TEXT_MIME);
                if let Ok(text) = std::str::from_utf8(&bytes) {
                    prop_assert_eq!(binary_type_of_text(&path, text), Some(mime.as_str()));
                }
            }
        }
    }

    #[test]
    fn text_under_text_names_is_text(text in "[^\0]{0,64}") {
        let sniffs = mime_type("/x", text.as_bytes()) != TEXT_MIME;
        prop_assume!(!sniffs);
        prop_assert_eq!(classify("/x.txt", text.clone().into_bytes()), Classified::Text(text));
    }
}
