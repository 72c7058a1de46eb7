//! Links lockrun with packed relative relocations (DT_RELR) wherever the
//! toolchain and the C library take them, so that `cargo install`,
//! `cargo build --release` and `cargo deb` all get it with no flag to
//! remember.
//!
//! Why: a position-independent executable has one relative relocation for
//! every pointer in its constant data (vtables, string slices, the tables
//! of the crates it links), about 13,700 of them here. As RELA entries
//! they are 24 bytes each, 330 KB that the dynamic loader reads at every
//! start; packed, the same relocations take a few KB. PIE and RELRO stay
//! as they are.
//!
//! The flag is tried first: the C library must know DT_RELR (glibc 2.36
//! and later) or the program it builds would not start, and an older
//! linker may not know the flag at all. Where the probe fails, lockrun is
//! linked as before.

use std::path::{Path, PathBuf};
use std::process::Command;

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

fn main() {
    println!("cargo:rerun-if-changed=src/build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" && links_and_runs() {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    }
}

/// A program linked with the flag by the compiler and linker that will
/// link lockrun, and run when it is built for this machine (where the C
/// library checks that it knows DT_RELR).
fn links_and_runs() -> bool {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let out = PathBuf::from(var("OUT_DIR"));
    let src = out.join("relr_probe.rs");
    let exe = out.join("relr_probe");
    if std::fs::write(&src, "fn main() {}\n").is_err() {
        return false;
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.arg("--target")
        .arg(var("TARGET"))
        .arg("-o")
        .arg(&exe)
        .arg("-C")
        .arg(format!("link-arg={FLAG}"))
        .arg(&src);
    // The flags the build was given (a linker of its own, say) apply to the
    // probe too.
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        cmd.arg("-C")
            .arg(format!("linker={}", linker.to_string_lossy()));
    }
    if !cmd.output().is_ok_and(|o| o.status.success()) {
        return false;
    }
    var("HOST") != var("TARGET") || runs(&exe)
}

fn runs(exe: &Path) -> bool {
    Command::new(exe).output().is_ok_and(|o| o.status.success())
}
