//! How text that lockrun did not write (names, labels and errors from a
//! server, a lock directory's file names) is shown: on one line, with
//! nothing that hides itself or changes how the rest looks.

use std::borrow::Cow;
use std::time::Duration;

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

/// A duration as a user writes it to lockrun (`7d`, `1h 30m`, `500ms`): the
/// units `--ttl` and `--wait` take, days the largest but for a whole number
/// of years (`1y`, as humantime counts it: 365.25 days).
pub fn duration(d: Duration) -> String {
    const YEAR: u64 = 31_557_600;
    let (secs, nanos) = (d.as_secs(), u64::from(d.subsec_nanos()));
    if secs == 0 && nanos == 0 {
        return "0s".to_string();
    }
    if nanos == 0 && secs % YEAR == 0 {
        return format!("{}y", secs / YEAR);
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (nanos / 1_000_000, "ms"),
        (nanos / 1000 % 1000, "us"),
        (nanos % 1000, "ns"),
    ];
    let shown: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    shown.join(" ")
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

    #[test]
    fn durations_read_as_they_are_written() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(ms(500)), "500ms");
        assert_eq!(duration(s(30)), "30s");
        assert_eq!(duration(s(5400)), "1h 30m");
        assert_eq!(duration(s(7 * 86_400)), "7d");
        assert_eq!(duration(s(40 * 86_400 + 1)), "40d 1s");
        assert_eq!(duration(s(31_557_600)), "1y");
        assert_eq!(duration(Duration::new(1, 2_003_004)), "1s 2ms 3us 4ns");
        // What is shown parses back to the same duration.
        for d in [ms(134), s(7 * 86_400), s(31_557_600), s(90_061), ms(61_001)] {
            assert_eq!(humantime::parse_duration(&duration(d)).unwrap(), d);
        }
    }
}
