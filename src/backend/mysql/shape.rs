//! What lockrun's tables must look like, checked against the server's own
//! description of them: tables made by hand, or altered since, with a
//! column too short (a name cut on the way in is never found again), of
//! another type, or a primary key that is not the one lockrun counts on.
//! `doctor` reads it; a run reads it only when a name's rows cannot be
//! made or found, to say why.

use mysql::Row;

use super::client::{int, text};
use super::sql::{Tables, lit};

/// A table's suffix, its columns with the type lockrun needs, and its
/// primary key.
type Table = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

/// lockrun's tables (lockrun-engines(7) "MYSQL AND MARIADB").
const NEEDED: [Table; 3] = [
    (
        "tokens",
        &[("name", "varbinary(1024)"), ("token", "bigint")],
        &["name"],
    ),
    (
        "leases",
        &[
            ("name", "varbinary(1024)"),
            ("slot", "int"),
            ("owner", "varbinary(128)"),
            ("label", "varbinary(2048)"),
            ("token", "bigint"),
            ("mode", "varbinary(8)"),
            ("lim", "int"),
            ("expires_at", "datetime(6)"),
            ("granted_at", "datetime(6)"),
            ("revoked", "tinyint(1)"),
        ],
        &["name", "slot"],
    ),
    (
        "waiters",
        &[
            ("seq", "bigint"),
            ("name", "varbinary(1024)"),
            ("owner", "varbinary(128)"),
            ("label", "varbinary(2048)"),
            ("mode", "varbinary(8)"),
            ("lim", "int"),
            ("expires_at", "datetime(6)"),
            ("conn", "bigint"),
        ],
        &["seq"],
    ),
];

/// The two statements that describe the tables: their columns, and the
/// columns of their primary keys (with any prefix length).
pub fn describe(t: &Tables) -> [String; 2] {
    let names = ["leases", "waiters", "tokens"]
        .map(|s| lit(&format!("{}_{s}", t.base)))
        .join(", ");
    [
        format!(
            "SELECT TABLE_NAME, COLUMN_NAME, LOWER(COLUMN_TYPE) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({names})"
        ),
        format!(
            "SELECT TABLE_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({names}) \
               AND INDEX_NAME = 'PRIMARY' ORDER BY TABLE_NAME, SEQ_IN_INDEX"
        ),
    ]
}

/// An integer type without its display width (MySQL 8 shows none).
fn integer(ty: &str) -> Option<&str> {
    let base = ty.split(['(', ' ']).next()?;
    matches!(
        base,
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint"
    )
    .then_some(base)
}

/// Whether a column of type `got` holds what lockrun puts in one of
/// `need`: a byte string at least as long, an integer at least as wide,
/// a time to the microsecond.
fn fits(need: &str, got: &str) -> bool {
    let length = |ty: &str, kind: &str| -> Option<u64> {
        ty.strip_prefix(kind)?
            .strip_prefix('(')?
            .strip_suffix(')')?
            .parse()
            .ok()
    };
    if let Some(n) = length(need, "varbinary") {
        return length(got, "varbinary").is_some_and(|g| g >= n);
    }
    if let Some(need) = integer(need) {
        let rank = |t: &str| {
            ["tinyint", "smallint", "mediumint", "int", "bigint"]
                .iter()
                .position(|x| *x == t)
        };
        // A flag fits any integer; a number, one as wide, signed.
        let wide =
            |g: &str| need == "tinyint" || (rank(g) >= rank(need) && !got.contains("unsigned"));
        return integer(got).is_some_and(wide);
    }
    got == need
}

/// What differs from what lockrun needs, one phrase each (none: the
/// tables are as lockrun makes them). `sets` are the rows of `describe`;
/// a table not there at all is no difference (it is created on first use).
pub fn differences(base: &str, sets: &[Vec<Row>]) -> Vec<String> {
    let (cols, keys) = match sets {
        [cols, keys, ..] => (cols, keys),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for (suffix, columns, key) in NEEDED {
        let table = format!("{base}_{suffix}");
        let has: Vec<(String, String)> = cols
            .iter()
            .filter(|r| text(r, 0).as_deref() == Some(table.as_str()))
            .map(|r| {
                (
                    text(r, 1).unwrap_or_default(),
                    text(r, 2).unwrap_or_default(),
                )
            })
            .collect();
        if has.is_empty() {
            continue;
        }
        for (col, need) in columns {
            match has.iter().find(|(c, _)| c.eq_ignore_ascii_case(col)) {
                None => out.push(format!("{table}.{col} is missing (lockrun needs {need})")),
                Some((_, got)) if !fits(need, got) => out.push(format!(
                    "{table}.{col} is {}, lockrun needs {need}",
                    crate::text::printable(got)
                )),
                Some(_) => {}
            }
        }
        let pk: Vec<String> = keys
            .iter()
            .filter(|r| text(r, 0).as_deref() == Some(table.as_str()))
            .map(|r| {
                let col = text(r, 1).unwrap_or_default().to_ascii_lowercase();
                match int(r, 2) {
                    Some(part) => format!("{col}({part})"),
                    None => col,
                }
            })
            .collect();
        if pk != key.iter().map(|k| k.to_string()).collect::<Vec<_>>() {
            out.push(format!(
                "{table}'s primary key is ({}), lockrun needs ({})",
                crate::text::printable(&pk.join(", ")),
                key.join(", ")
            ));
        }
    }
    out
}

/// The differences as one sentence.
pub fn said(database: &str, diffs: &[String]) -> String {
    format!(
        "lockrun's tables in database {} are not as lockrun makes them: {}; make them as \
         lockrun-engines(7) \"MYSQL AND MARIADB\" shows (or drop them while nothing runs: \
         lockrun creates them again)",
        crate::text::printable(database),
        diffs.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::fits;

    #[test]
    fn columns_fit_when_they_hold_what_lockrun_writes() {
        assert!(fits("varbinary(1024)", "varbinary(1024)"));
        assert!(fits("varbinary(8)", "varbinary(16)"));
        assert!(!fits("varbinary(1024)", "varchar(255)"));
        assert!(!fits("varbinary(1024)", "varbinary(255)"));
        assert!(fits("bigint", "bigint(20)"));
        assert!(!fits("bigint", "int(11)"));
        assert!(!fits("bigint", "bigint(20) unsigned"));
        assert!(fits("int", "int"));
        assert!(fits("tinyint(1)", "tinyint(1)"));
        assert!(fits("tinyint(1)", "int(11)"));
        assert!(fits("datetime(6)", "datetime(6)"));
        assert!(!fits("datetime(6)", "datetime"));
        assert!(!fits("datetime(6)", "timestamp(6)"));
    }
}
