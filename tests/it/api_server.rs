//! A real HTTP/1.1 server on loopback for the pull tests: each request is answered by a closure
//! the test gives, which can also misbehave (wait, cut the body short, send garbage). Every
//! request is logged, so a test can check what ingot sent (and that no secret leaked).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the server read it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// Decoded query parameters in order.
    pub query: Vec<(String, String)>,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Request {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// What to answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Wait this long before the status line.
    pub delay: Duration,
    /// Announce the whole body's length but close the connection after this many bytes of it.
    pub cut_after: Option<usize>,
}

impl Reply {
    pub fn json(body: impl Into<String>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.into().into_bytes(),
            delay: Duration::ZERO,
            cut_after: None,
        }
    }

    pub fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            ..Reply::json(body)
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

type Handler = Box<dyn FnMut(&Request) -> Reply + Send>;

pub struct Server {
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Start a server answering with `handler`.
    pub fn start(handler: impl FnMut(&Request) -> Reply + Send + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Mutex<Handler>> = Arc::new(Mutex::new(Box::new(handler)));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, h, s) = (log.clone(), handler.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (l, h) = (l.clone(), h.clone());
                std::thread::spawn(move || serve(conn, &l, &h));
            }
        });
        Server { addr, log, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }

    pub fn clear(&self) {
        self.log.lock().unwrap().clear();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn decode(s: &str) -> Vec<(String, String)> {
    url::form_urlencoded::parse(s.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// One request per connection (the reply says `Connection: close`).
fn serve(conn: TcpStream, log: &Mutex<Vec<Request>>, handler: &Mutex<Handler>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let req = Request {
        method,
        path: path.to_string(),
        query: decode(query),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    log.lock().unwrap().push(req.clone());
    let reply = (handler.lock().unwrap())(&req);
    std::thread::sleep(reply.delay);
    let mut out = conn;
    let reason = match reply.status {
        200 => "OK",
        304 => "Not Modified",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\nConnection: close\r\n", reply.status);
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if reply.status != 304 {
        head.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let body = match reply.cut_after {
        Some(n) => &reply.body[..n.min(reply.body.len())],
        None if reply.status == 304 => &[][..],
        None => &reply.body[..],
    };
    let _ = out.write_all(body);
    let _ = out.flush();
    let _ = out.shutdown(std::net::Shutdown::Both);
}
