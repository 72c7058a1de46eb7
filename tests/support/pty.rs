//! A pseudo-terminal for the interactive tests: bash (or another shell)
//! with job control on its slave side, the test typing on its master side.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use super::{BIN, default_interrupts, wait_child, wait_until};

/// A bash with job control as session leader of a fresh pseudo-terminal; the
/// test types into the master side as a user would.
pub struct Pty {
    master: std::fs::File,
    pub child: Child,
    pub seen: String,
}

impl Pty {
    pub fn bash(script: &str) -> Pty {
        if Command::new("bash").arg("--version").output().is_err() {
            panic!("bash not found: the terminal tests need it (apt-get install -y bash)");
        }
        Pty::shell("bash", script)
    }

    /// `shell -c script` as session leader of a new pseudo-terminal.
    pub fn shell(shell: &str, script: &str) -> Pty {
        use std::os::fd::FromRawFd;
        use std::os::unix::process::CommandExt;
        // SAFETY: plain libc calls on our own descriptors.
        let (master, slave_path) = unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(m >= 0, "posix_openpt");
            assert_eq!(libc::grantpt(m), 0);
            assert_eq!(libc::unlockpt(m), 0);
            let mut buf = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(m, buf.as_mut_ptr(), buf.len()), 0);
            let path = std::ffi::CStr::from_ptr(buf.as_ptr()).to_owned();
            (std::fs::File::from_raw_fd(m), path)
        };
        let mut cmd = Command::new(shell);
        cmd.args(["-c", script]);
        cmd.env(
            "PATH",
            format!(
                "{}:{}",
                Path::new(BIN).parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("LOCKRUN_") {
                cmd.env_remove(k);
            }
        }
        default_interrupts(&mut cmd);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let fd = libc::open(slave_path.as_ptr(), libc::O_RDWR);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::ioctl(fd, libc::TIOCSCTTY, 0);
                for target in 0..3 {
                    libc::dup2(fd, target);
                }
                if fd > 2 {
                    libc::close(fd);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start bash on a pty");
        // SAFETY: setting O_NONBLOCK on our descriptor.
        unsafe {
            use std::os::fd::AsRawFd;
            let fd = master.as_raw_fd();
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
        }
        Pty {
            master,
            child,
            seen: String::new(),
        }
    }

    fn pump(&mut self) {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        loop {
            match self.master.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => return,
            }
        }
    }

    /// Wait until the terminal has shown `pattern`; returns everything seen.
    pub fn expect(&mut self, pattern: &str, limit: Duration) -> String {
        let ok = wait_until(limit, || {
            self.pump();
            self.seen.contains(pattern)
        });
        assert!(
            ok,
            "terminal never showed {pattern:?}; it showed:\n{}",
            self.seen
        );
        self.seen.clone()
    }

    pub fn type_(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.master.write_all(bytes).unwrap();
    }

    pub fn finish(&mut self, limit: Duration) -> std::process::ExitStatus {
        let st = wait_child(&mut self.child, limit);
        self.pump();
        st
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
