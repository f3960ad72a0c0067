//! The names ramsys creates inside a destination for its own work (issue
//! 34), reserved: a peer cannot write them (the sink refuses such an
//! entry), delete them (`--delete` leaves them), or read them (a request
//! naming one is refused; a source's walk leaves them out of a tree).
//! docs/SECURITY.md "Reserved names" lists them.
//!
//! - `.ramsys-journal.sqlite` and every name that starts with it (its
//!   `-wal`/`-shm` files, a corrupt one moved aside), roles::sink::journal;
//! - `.NAME.ramsys-SESSION.part`, a file being received
//!   (roles::sink::files);
//! - `.NAME.ramsys-HASH.big` and `.NAME.ramsys-HASH.N.done`, a big file
//!   received in pieces and its piece markers (roles::sink::bigfile);
//! - `.ramsys-SESSION-I.lnk`, a link or special file being placed
//!   (roles::sink::tree).

/// The sink's sync journal (roles::sink::journal): named here, below the
/// sink, so the walk can leave it out without importing the sink.
pub const JOURNAL_NAME: &str = ".ramsys-journal.sqlite";

/// Whether the file name `name` (one path component) is reserved.
pub fn is_reserved(name: &[u8]) -> bool {
    let has = |pat: &[u8]| name.windows(pat.len()).any(|w| w == pat);
    let ends = |s: &[u8]| name.ends_with(s);
    name.starts_with(JOURNAL_NAME.as_bytes())
        || (name.starts_with(b".ramsys-") && ends(b".lnk"))
        || (name.starts_with(b".")
            && has(b".ramsys-")
            && (ends(b".part") || ends(b".big") || ends(b".done")))
}

/// Whether any component of the relative path `p` is reserved.
pub fn names_reserved(p: &[u8]) -> bool {
    p.split(|&b| b == b'/').any(is_reserved)
}

/// Why an entry with a reserved name is refused (one line).
pub const REFUSED: &str = "a name ramsys reserves for its own files (docs/SECURITY.md); refused";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_ramsys_makes_is_reserved() {
        let big = crate::roles::sink::bigfile::Names::new(b"d/big", 10, (1, 2), 4);
        let made: Vec<Vec<u8>> = vec![
            JOURNAL_NAME.into(),
            format!("{JOURNAL_NAME}-wal").into(),
            format!("{JOURNAL_NAME}-shm").into(),
            format!("{JOURNAL_NAME}.corrupt").into(),
            b".f.ramsys-00000000000000ab.part".to_vec(),
            big.tmp.clone(),
            [&big.tmp[..big.tmp.len() - 4], b".3.done"].concat(),
            format!(".ramsys-{:016x}-{}.lnk", 7, 2).into(),
        ];
        for n in &made {
            assert!(is_reserved(n), "{}", String::from_utf8_lossy(n));
        }
        for n in [
            &b"journal.sqlite"[..],
            b"ramsys-journal.sqlite",
            b"f.ramsys-1.part",
            b".ramsys-notes.txt",
            b"a.big",
            b".profile",
        ] {
            assert!(!is_reserved(n), "{}", String::from_utf8_lossy(n));
        }
        assert!(names_reserved(b"a/.ramsys-journal.sqlite"));
        assert!(names_reserved(b".ramsys-journal.sqlite/x"));
        assert!(!names_reserved(b"a/b/c"));
    }
}
