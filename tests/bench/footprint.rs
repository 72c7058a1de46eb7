//! The footprint section: what lockrun's image costs every run whatever
//! engine it uses, beside flock's, so that the next engine's cost shows.
//!
//! Peak RSS and the pages a start dirties are read from the tool's own
//! `/proc/PID/status` by its job (the tool is the job's parent for flock,
//! its grandparent for lockrun, whose guard sits between). A child's
//! `ru_maxrss` from `wait4` cannot be used: a child spawned with
//! `CLONE_VM` (as `Command` spawns) starts its peak at its parent's, the
//! benchmark's own.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::{Bench, bin, s, stats, text, time_once};

/// The job of `job-status OUT DEPTH`: the memory figures of the ancestor
/// DEPTH levels up (1: the parent), in KiB, one `Name: value` a line.
pub fn job_status(args: &[String]) {
    let depth: usize = args[1].parse().unwrap();
    let mut pid = std::process::id().to_string();
    for _ in 0..depth {
        pid = field(&status(&pid), "PPid").unwrap().to_string();
    }
    let st = status(&pid);
    let lines: Vec<String> = ["VmHWM", "VmRSS", "RssAnon", "RssFile"]
        .iter()
        .map(|k| format!("{k}: {}", kib(&st, k)))
        .collect();
    std::fs::write(&args[0], lines.join("\n")).unwrap();
}

fn status(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap()
}

fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
}

fn kib(status: &str, key: &str) -> u64 {
    field(status, key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The dynamic relocations the loader applies at every start of an ELF
/// executable, and the bytes of the tables that describe them.
#[derive(Debug, Default)]
struct Relocations {
    /// Relative relocations, packed (DT_RELR) or not.
    relative: u64,
    /// Every other one (symbols, the PLT, bound at start: `-z now`).
    symbolic: u64,
    table_bytes: u64,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Read from the file's dynamic section; None for what is not a 64-bit
/// little-endian ELF file with one.
fn relocations(path: &Path) -> Option<Relocations> {
    let b = std::fs::read(path).ok()?;
    if b.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    // The relative relocation's type on this machine.
    let relative_type = match u16_at(&b, 0x12) {
        62 => 8,     // x86-64
        183 => 1027, // AArch64
        _ => return None,
    };
    let (phoff, phentsize, phnum) = (
        u64_at(&b, 0x20) as usize,
        u16_at(&b, 0x36),
        u16_at(&b, 0x38),
    );
    let headers: Vec<&[u8]> = (0..phnum)
        .map(|i| &b[phoff + i * phentsize..phoff + (i + 1) * phentsize])
        .collect();
    let kind = |h: &[u8]| u32::from_le_bytes(h[..4].try_into().unwrap());
    // A virtual address's offset in the file.
    let offset = |v: u64| {
        headers.iter().filter(|h| kind(h) == 1).find_map(|h| {
            let (off, vaddr, filesz) = (u64_at(h, 8), u64_at(h, 16), u64_at(h, 32));
            (vaddr..vaddr + filesz)
                .contains(&v)
                .then(|| (v - vaddr + off) as usize)
        })
    };
    let dynamic = headers.iter().find(|h| kind(h) == 2)?;
    let mut tags = std::collections::HashMap::new();
    for at in (u64_at(dynamic, 8) as usize..).step_by(16) {
        let (tag, val) = (u64_at(&b, at), u64_at(&b, at + 8));
        if tag == 0 {
            break;
        }
        tags.insert(tag, val);
    }
    let tag = |t: u64| tags.get(&t).copied().unwrap_or(0);
    let mut r = Relocations::default();
    // DT_RELA, DT_RELASZ; each entry 24 bytes, its type in r_info's low half.
    if let Some(start) = offset(tag(7)) {
        for at in (start..start + tag(8) as usize).step_by(24) {
            if u64_at(&b, at + 8) & 0xffff_ffff == relative_type {
                r.relative += 1;
            } else {
                r.symbolic += 1;
            }
        }
    }
    // DT_PLTRELSZ.
    r.symbolic += tag(2) / 24;
    // DT_RELR, DT_RELRSZ: an address (even) relocates one word; a bitmap
    // (odd) one more word for each bit set above its lowest.
    if let Some(start) = offset(tag(36)) {
        for at in (start..start + tag(35) as usize).step_by(8) {
            let e = u64_at(&b, at);
            r.relative += if e & 1 == 0 {
                1
            } else {
                (e >> 1).count_ones() as u64
            };
        }
    }
    r.table_bytes = tag(8) + tag(2) + tag(35);
    Some(r)
}

/// Where `flock` is on PATH.
fn flock_path() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("flock"))
        .find(|p| p.is_file())
}

/// Medians of a tool's memory figures over `runs` runs of `argv`, whose
/// job reports to `out`.
fn memory(argv: &[String], out: &Path, runs: usize) -> (f64, f64) {
    let mut peak = Vec::new();
    let mut anon = Vec::new();
    for _ in 0..runs {
        time_once(argv);
        let st = std::fs::read_to_string(out).unwrap();
        peak.push(kib(&st, "VmHWM") as f64 / 1024.0);
        anon.push(kib(&st, "RssAnon") as f64 / 4.0);
    }
    (stats(peak).median, stats(anon).median)
}

/// Median ms of `lockrun --version`: the image's start and exit alone.
fn version_ms() -> f64 {
    let runs = (0..100)
        .map(|_| time_once(&s(&[&bin(), "--version"])))
        .collect();
    stats(runs).median
}

/// The guard's floor: fork, exit and reap of a process holding `kib` of
/// private memory, as lockrun does (what a fork copies), in ms.
fn guard_floor(exe: &str, kib: usize) -> f64 {
    let out = Command::new(exe)
        .args(["job-forks", &kib.to_string(), "500"])
        .output()
        .unwrap();
    text(&out.stdout).trim().parse().unwrap()
}

impl Bench {
    pub(super) fn footprint(&mut self) {
        let runs = if self.quick { 5 } else { 21 };
        let out = self.path("status");
        let job = |depth: &str| {
            vec![
                self.exe.clone(),
                "job-status".into(),
                out.display().to_string(),
                depth.into(),
            ]
        };
        let (flock_peak, flock_dirty) = memory(&self.flock("fp", &job("1")), &out, runs);
        let (local_peak, local_dirty) = memory(&self.lockrun_local("fp", &job("2")), &out, runs);
        let (redis_peak, redis_dirty) = memory(&self.lockrun_redis("fp", &job("2")), &out, runs);
        let flock = flock_path();
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let ours = relocations(Path::new(&bin())).unwrap_or_default();
        let theirs = flock.as_deref().and_then(relocations).unwrap_or_default();
        let version = version_ms();
        let guard_ms = guard_floor(&self.exe, (local_dirty * 4.0) as usize);
        let mib = |b: u64| b as f64 / 1048576.0;
        let (lr_size, fl_size) = (size(Path::new(&bin())), flock.as_deref().map_or(0, size));
        println!("\nFootprint of `TOOL NAME JOB`, medians of {runs} runs");
        println!("{:<44} {:>10} {:>10}", "measure", "flock", "lockrun");
        println!(
            "{:<44} {:>10.2} {:>10.2}",
            "binary, MiB",
            mib(fl_size),
            mib(lr_size)
        );
        println!(
            "{:<44} {:>10} {:>10}",
            "relocations applied at every start",
            theirs.relative + theirs.symbolic,
            ours.relative + ours.symbolic
        );
        println!(
            "{:<44} {:>10.1} {:>10.1}",
            "… their tables, KiB",
            theirs.table_bytes as f64 / 1024.0,
            ours.table_bytes as f64 / 1024.0
        );
        println!(
            "{:<44} {flock_dirty:>10.0} {local_dirty:>10.0}",
            "pages dirtied by start-up, local (4 KiB)"
        );
        println!("{:<44} {:>10} {redis_dirty:>10.0}", "… Redis", "");
        println!(
            "{:<44} {flock_peak:>10.2} {local_peak:>10.2}",
            "peak RSS, local, MiB (target ≤ 4)"
        );
        println!("{:<44} {:>10} {redis_peak:>10.2}", "… Redis", "");
        println!(
            "`lockrun --version`: {version:.3} ms; the guard's floor (fork, exit and reap of a process of lockrun's private memory): {guard_ms:.3} ms"
        );
        self.record(
            "footprint",
            json!({
                "flock": {"binary_bytes": fl_size, "relocations": theirs.relative + theirs.symbolic,
                          "relocation_table_bytes": theirs.table_bytes,
                          "dirty_pages": flock_dirty, "peak_rss_mib": flock_peak},
                "lockrun": {"binary_bytes": lr_size, "relocations": ours.relative + ours.symbolic,
                            "relative_relocations": ours.relative,
                            "relocation_table_bytes": ours.table_bytes,
                            "dirty_pages_local": local_dirty, "dirty_pages_redis": redis_dirty,
                            "peak_rss_mib_local": local_peak, "peak_rss_mib_redis": redis_peak,
                            "version_ms": version, "guard_fork_ms": guard_ms},
            }),
        );
    }
}
