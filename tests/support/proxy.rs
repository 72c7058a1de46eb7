//! A loopback TCP proxy that can slow a server's replies to a trickle.

use std::net::TcpListener;
use std::time::Duration;

/// A loopback TCP proxy in front of a server. Replies flow normally until
/// `trickle` is set; from then on each reply byte is held back 300 ms, as a
/// congested link or a misbehaving proxy would (every read still sees data
/// before its timeout, so only a bound on the whole request catches it).
pub struct Proxy {
    pub port: u16,
    trickle: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let trickle = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&trickle);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_read, &mut s_write);
                });
                let flag = Arc::clone(&flag);
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = match s_read.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        for b in &buf[..n] {
                            if flag.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(300));
                            }
                            if c_write.write_all(&[*b]).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Proxy { port, trickle }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn trickle(&self) {
        self.set_trickle(true);
    }

    pub fn set_trickle(&self, on: bool) {
        self.trickle.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}
