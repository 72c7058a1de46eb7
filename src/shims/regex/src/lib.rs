//! `regex::bytes` as far as mysql_common uses it (`Regex::new`,
//! `is_match`, `captures`, `Captures::get`, `Match::as_bytes`), on
//! regex-lite. Two differences from `regex`, both on text mysql_common
//! never gets right anyway: `\d` is an ASCII digit only (a Unicode digit
//! matched by `regex` made mysql_common's own number parsing panic), and a
//! haystack that is not UTF-8 matches nothing.

pub mod bytes {
    pub use regex_lite::Error;

    /// A compiled pattern, matched against bytes that are UTF-8.
    #[derive(Debug, Clone)]
    pub struct Regex(regex_lite::Regex);

    impl Regex {
        pub fn new(re: &str) -> Result<Regex, Error> {
            regex_lite::Regex::new(re).map(Regex)
        }

        pub fn is_match(&self, haystack: &[u8]) -> bool {
            std::str::from_utf8(haystack).is_ok_and(|h| self.0.is_match(h))
        }

        pub fn captures<'h>(&self, haystack: &'h [u8]) -> Option<Captures<'h>> {
            let h = std::str::from_utf8(haystack).ok()?;
            self.0.captures(h).map(Captures)
        }
    }

    /// The groups of one match.
    #[derive(Debug)]
    pub struct Captures<'h>(regex_lite::Captures<'h>);

    impl<'h> Captures<'h> {
        pub fn get(&self, i: usize) -> Option<Match<'h>> {
            self.0.get(i).map(Match)
        }
    }

    /// One group's match.
    #[derive(Debug, Clone, Copy)]
    pub struct Match<'h>(regex_lite::Match<'h>);

    impl<'h> Match<'h> {
        pub fn as_bytes(&self) -> &'h [u8] {
            self.0.as_str().as_bytes()
        }

        pub fn start(&self) -> usize {
            self.0.start()
        }

        pub fn end(&self) -> usize {
            self.0.end()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::Regex;

        /// mysql_common's own patterns, on what servers send.
        #[test]
        fn mysql_common_s_patterns_match_as_they_did() {
            let version = Regex::new(r"^(\d{1,2})\.(\d{1,2})\.(\d{1,3})(.*)").unwrap();
            let c = version.captures(b"8.0.36-0ubuntu0.22.04.1").unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"8");
            assert_eq!(c.get(3).unwrap().as_bytes(), b"36");
            assert_eq!(c.get(4).unwrap().as_bytes(), b"-0ubuntu0.22.04.1");
            let maria = Regex::new(r"^(?:5.5.5-)?(\d{1,2})\.(\d{1,2})\.(\d{1,3})-MariaDB").unwrap();
            let c = maria.captures(b"5.5.5-10.11.6-MariaDB-0+deb12u1").unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"10");
            assert_eq!(c.get(2).unwrap().as_bytes(), b"11");
            assert!(maria.captures(b"8.0.36").is_none());
            let time = Regex::new(r"^[0-8]\d\d:[0-5]\d:[0-5]\d\.\d{1,6}$").unwrap();
            assert!(time.is_match(b"838:59:59.000000"));
            assert!(!time.is_match(b"838:60:59.0"));
            // Not UTF-8, and a digit that is not ASCII: no match.
            assert!(!time.is_match(b"838:59:59.\xff"));
            assert!(!time.is_match("838:59:59.\u{0663}".as_bytes()));
            let pem =
                Regex::new("-----BEGIN PUBLIC KEY-----([^-]*)-----END PUBLIC KEY-----").unwrap();
            let c = pem
                .captures(b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n")
                .unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"\nMIIB\n");
        }
    }
}
