//! How text that lockrun did not write (names, labels and errors from a
//! server, a lock directory's file names) is shown: on one line, with
//! nothing that hides itself or changes how the rest looks.

use std::borrow::Cow;

/// Characters that change how text looks without showing themselves:
/// Unicode's default-ignorable code points (bidirectional controls,
/// zero-width characters, fillers, variation selectors, tags), line and
/// paragraph separators, and the interlinear annotation marks.
pub fn is_invisible(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x034F | 0x061C | 0x115F..=0x1160 | 0x17B4..=0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F
        | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFFB | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF)
}

/// Control characters (a newline would forge a line of its own, an escape
/// sequence would drive the terminal) and invisible ones (a right-to-left
/// override makes two names look alike), shown escaped.
pub fn printable(s: &str) -> Cow<'_, str> {
    let hidden = |c: char| c.is_control() || is_invisible(c);
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if matches!(c, '\n' | '\r' | '\t') {
            out.extend(c.escape_debug());
        } else if hidden(c) {
            // Not escape_debug: it leaves some of these as they are.
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_hides_itself_is_shown_escaped() {
        assert_eq!(printable("plain name: ok"), "plain name: ok");
        assert_eq!(printable("a\nb"), "a\\nb");
        assert_eq!(printable("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(printable("\u{202e}cba"), "\\u{202e}cba");
        for c in [
            '\u{34f}',
            '\u{3164}',
            '\u{115f}',
            '\u{17b4}',
            '\u{180b}',
            '\u{2065}',
            '\u{ffa0}',
            '\u{fe0f}',
            '\u{e0041}',
            '\u{1d173}',
            '\u{85}',
        ] {
            let s = format!("ab{c}");
            assert_ne!(printable(&s), s, "U+{:04X}", c as u32);
        }
        assert_eq!(printable("naïve 日本 ✓"), "naïve 日本 ✓");
    }
}
