//! The shared text operations: byte-wise edits of text that is not UTF-8, and paging in chunks.

use deepagents_backends::text::{Pager, page, page_bytes, replace, replace_bytes};
use deepagents_backends::{BackendError, ReadResult};
use proptest::prelude::*;

#[test]
fn byte_wise_edits_keep_the_bytes_they_do_not_replace() {
    let latin1 = b"caf\xe9 cr\xe8me\nneedle here\n";
    let edit = |old: &str, new: &str| replace_bytes("/m.txt", latin1, old, new, false);
    assert_eq!(
        edit("here", "there").unwrap(),
        (b"caf\xe9 cr\xe8me\nneedle there\n".to_vec(), 1)
    );
    // U+FFFD in `old` matches the invalid byte; kept where `new` keeps it.
    assert_eq!(
        edit("caf\u{FFFD} cr", "caf\u{FFFD} cr\u{E8}").unwrap().0,
        b"caf\xe9 cr\xc3\xa8\xe8me\nneedle here\n"
    );
    // Replacing an invalid byte with text is allowed: the model asked for exactly that span.
    assert_eq!(
        edit("\u{FFFD} cr\u{FFFD}", "\u{E9} cr\u{E8}").unwrap().0,
        "caf\u{E9} cr\u{E8}me\nneedle here\n".as_bytes()
    );
    // U+FFFD where invalid bytes are rewritten would lose them: refused.
    assert!(matches!(
        edit("f\u{FFFD} c", "f \u{FFFD}c"),
        Err(BackendError::NotUtf8 { .. })
    ));
    assert!(matches!(
        edit("absent", "x"),
        Err(BackendError::StringNotFound { .. })
    ));
    assert!(matches!(
        replace_bytes("/m.txt", b"\xff a \xff a", "a", "b", false),
        Err(BackendError::NotUnique { count: 2, .. })
    ));
    assert_eq!(
        replace_bytes("/m.txt", b"\xff a \xff a\xfe", "a", "b", true).unwrap(),
        (b"\xff b \xff b\xfe".to_vec(), 2)
    );
    // A match that ends the text right after a U+FFFD.
    assert_eq!(
        replace_bytes("/m.txt", b"x\xff", "x\u{FFFD}", "x\u{FFFD}!", false)
            .unwrap()
            .0,
        b"x\xff!"
    );
}

#[test]
fn the_pager_splits_lines_like_the_whole_text() {
    let text = "a\r\nb\n\nc\r";
    let mut pager = Pager::new(1, 2, usize::MAX);
    for byte in text.as_bytes() {
        pager.feed(std::slice::from_ref(byte));
    }
    assert_eq!(
        pager.finish(),
        ReadResult::Text {
            lines: vec!["b".into(), String::new()],
            offset: 1,
            total_lines: 4,
        }
    );
    assert_eq!(
        page_bytes(b"caf\xe9\n", 0, 5),
        ReadResult::Text {
            lines: vec!["caf\u{FFFD}".into()],
            offset: 0,
            total_lines: 1,
        }
    );
}

proptest! {
    /// On UTF-8 text the byte-wise edit is the string edit.
    #[test]
    fn byte_wise_edits_agree_with_string_edits_on_utf8(
        text in "[ab\u{e9}\n]{0,24}",
        old in "[ab\u{e9}]{1,3}",
        new in "[ab\u{e9}]{0,3}",
        all in any::<bool>(),
    ) {
        let by_string = replace("/t", &text, &old, &new, all).map(|(s, n)| (s.into_bytes(), n));
        let by_bytes = replace_bytes("/t", text.as_bytes(), &old, &new, all);
        prop_assert_eq!(by_string, by_bytes);
    }

    /// Edits of text with invalid bytes change only what they replace: decoding the result
    /// gives the string edit of the decoded text, and the invalid bytes outside the matches
    /// are still there.
    #[test]
    fn byte_wise_edits_agree_with_the_decoded_text(
        bytes in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'\n'), Just(0xe9u8), Just(0xffu8)], 0..24),
        old in "[ab]{1,3}",
        new in "[ab]{0,3}",
        all in any::<bool>(),
    ) {
        let decoded = String::from_utf8_lossy(&bytes).into_owned();
        let by_string = replace("/t", &decoded, &old, &new, all);
        let by_bytes = replace_bytes("/t", &bytes, &old, &new, all);
        match (by_string, by_bytes) {
            (Ok((text, n)), Ok((out, m))) => {
                prop_assert_eq!(n, m);
                prop_assert_eq!(String::from_utf8_lossy(&out).into_owned(), text);
                let invalid = |b: &[u8]| b.iter().filter(|&&x| x >= 0x80).count();
                prop_assert_eq!(invalid(&out), invalid(&bytes));
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "{:?} vs {:?}", a, b),
        }
    }

    /// Feeding the text in any chunks pages it as the whole text is paged.
    #[test]
    fn paging_in_chunks_is_paging_the_whole(
        text in "[ab\r\n]{0,40}",
        cuts in proptest::collection::vec(0..40usize, 0..6),
        offset in 0..12usize,
        limit in 0..12usize,
    ) {
        let mut pager = Pager::new(offset, limit, usize::MAX);
        let bytes = text.as_bytes();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        cuts.sort_unstable();
        let mut from = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            pager.feed(&bytes[from..cut]);
            from = cut;
        }
        prop_assert_eq!(pager.finish(), page(&text, offset, limit));
        let expected: Vec<&str> = deepagents_backends::text::lines(&text).collect();
        match page(&text, offset, limit) {
            ReadResult::Text { lines, total_lines, .. } => {
                prop_assert_eq!(total_lines, expected.len());
                let want: Vec<&str> = expected.iter().skip(offset).take(limit).copied().collect();
                prop_assert_eq!(lines, want);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
