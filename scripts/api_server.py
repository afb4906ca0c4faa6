#!/usr/bin/env python3
"""A deterministic, paginated JSON vendor API on loopback: the API source of `make demo` and the
server of the API pull in `make bench`. Python 3 standard library only.

    python3 scripts/api_server.py --port 0 --records N --page-size P [--token TOKEN]
        [--port-file PATH] [--seed S] [--revision K] [--host 127.0.0.1] [--cache-mb M] [--warm]
        [--verbose]

`--port 0` picks a free port. Once the server listens, the port is printed to stdout (the number
and a newline) and, with --port-file, written to that file the same way (a temporary file beside
it, then a rename, so a reader never sees half a number). The server runs until SIGTERM or
SIGINT and then exits 0; on the way out it removes the port file if it still holds its own port,
and nothing else.

Endpoints
  GET  /v2/orders          one page of orders (below)
  GET  /health             200, text/plain `ok` (no auth)
  POST /_control/revision  body {"revision": K}: serve revision K from now on; 204 (no auth)
  GET  /_control/revision  {"revision": K} (no auth)
Anything else is 404 with a JSON body {"error": "..."}; a bad request is 400 the same way.

GET /v2/orders takes the query parameters
  limit          records per page, 1 to 5000 (default --page-size)
  cursor         the opaque `meta.next` of the previous page; absent: the first page
  updated_since  an RFC 3339 timestamp with a time zone: only records with updated_at >= it
and answers 200, Content-Type application/json,
  {"data": [record, ...], "meta": {"next": "<cursor>" | null, "total": <records matching>}}
The last page has "next": null. A cursor is the base64url form of a marked offset into the
matching records (so not a page number); one that does not decode is a 400.
With --token, every /v2/ request needs the header `Authorization: Bearer TOKEN`; without it (or
with another token) the answer is 401 {"error": "unauthorized"}. The token is never logged.

Records (i = 0 .. N-1, sorted by updated_at, then order_id, which is the order of i)
  order_id    100000 + i                       (integer)
  customer    "C%05d" % (i % 7919)
  order_status ["open", "shipped", "cancelled", "returned"][i % 4]
  amount      a decimal string with 2 places, "1.00" to "999.99", from the seed and i
  currency    "EUR" or "USD", from the seed and i
  updated_at  2026-11-01T00:00:00Z plus i seconds (RFC 3339, "Z")
  fetched_at  the server's clock when the page was rendered, with milliseconds: a volatile
              field that differs from one pull to the next (one value for the whole page)

Revisions (--revision K at start, or POST /_control/revision)
  0   the base data above
  >=1 the vendor corrected 3 records: i in corrected_indexes(N) (7, 11 and 13 when N > 13) get the
      next status in the list above, amount + 10.01, and updated_at 2026-12-01T00:00:00Z plus i
      seconds, so they move to the end of the updated_at order (an incremental pull with
      updated_since after the base data's last updated_at sees only them)
  >=2 also 2 new records, i = N and N+1, built as above but with updated_at
      2026-12-01T00:00:00Z plus i seconds (after the corrected ones, so the same incremental pull
      sees 5 records)

Pages are rendered with plain string formatting and kept in a bounded LRU cache (--cache-mb,
default 256: room for 1,000,000 records) keyed by (revision, limit, updated_since, offset);
fetched_at is filled in per response. 1,000 pages of 1,000 records take about 1 s of the
server's CPU when first rendered and about 0.3 s from the cache. --warm renders the pages of a
pull with the default limit and no updated_since before the server listens (about 1 s for
1,000,000 records), so that no timed pull pays for the rendering.
"""
import argparse
import base64
import binascii
import collections
import datetime as dt
import hmac
import json
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

STATUSES = ("open", "shipped", "cancelled", "returned")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
BASE_S = int((dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc) - EPOCH).total_seconds())
REVISED_S = int((dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc) - EPOCH).total_seconds())
MAX_LIMIT = 5000
CURSOR_MARK = b"ig1"
# fetched_at is rendered as this placeholder (as wide as the real value) and replaced per response
FETCHED_PLACEHOLDER = b"\x01FETCHED_AT_PLACEHOLDER\x01"[:24]


def corrected_indexes(n):
    """The 3 indexes a revision >= 1 corrects: 7, 11 and 13 when N > 13, else the valid ones of
    7, 11, 13 topped up from the highest indexes down (fewer than 3 only when N < 3)."""
    picked = [i for i in (7, 11, 13) if i < n]
    i = n - 1
    while len(picked) < 3 and i >= 0:
        if i not in picked:
            picked.append(i)
        i -= 1
    return tuple(sorted(picked))


_DAYS = {}


def day_str(day):
    s = _DAYS.get(day)
    if s is None:
        s = (EPOCH + dt.timedelta(days=day)).strftime("%Y-%m-%d")
        _DAYS[day] = s
    return s


def now_rfc3339():
    now = dt.datetime.now(dt.timezone.utc)
    return "%s.%03dZ" % (now.strftime("%Y-%m-%dT%H:%M:%S"), now.microsecond // 1000)


class View:
    """The records of one revision in updated_at order: position -> index i."""

    def __init__(self, n, revision, seed):
        self.n = n
        self.seed = seed
        self.corrected = corrected_indexes(n) if revision >= 1 else ()
        self.corrected_set = frozenset(self.corrected)
        self.appended = (n, n + 1) if revision >= 2 else ()
        self.base_count = n - len(self.corrected)
        self.length = n + len(self.appended)

    def index_at(self, pos):
        if pos < self.base_count:
            idx = pos
            for c in self.corrected:  # ascending: skip the corrected ones, they come later
                if c <= idx:
                    idx += 1
                else:
                    break
            return idx
        pos -= self.base_count
        if pos < len(self.corrected):
            return self.corrected[pos]
        return self.appended[pos - len(self.corrected)]

    def updated_s(self, i):
        if i >= self.n or i in self.corrected_set:
            return REVISED_S + i
        return BASE_S + i

    def first_at_or_after(self, since_s):
        """The first position whose updated_at >= since_s (seconds, may be fractional)."""
        lo, hi = 0, self.length
        while lo < hi:
            mid = (lo + hi) // 2
            if self.updated_s(self.index_at(mid)) < since_s:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def render(self, start, stop):
        """The records at positions [start, stop) as JSON text joined by commas, fetched_at as
        FETCHED_PLACEHOLDER."""
        out = []
        split = min(max(start, self.base_count), stop)
        if start < split:  # base records: indexes ascending, the corrected ones left out
            first, last = self.index_at(start), self.index_at(split - 1)
            idxs = range(first, last + 1)
            if any(first <= c <= last for c in self.corrected):
                idxs = [i for i in idxs if i not in self.corrected_set]
            render_records(out, idxs, self.seed, BASE_S, 0)
        if split < stop:  # corrected, then appended records
            for pos in range(split, stop):
                i = self.index_at(pos)
                render_records(out, (i,), self.seed, REVISED_S, 0 if i >= self.n else 1)
        return ",".join(out)


# lookup tables of the record renderer: 86,400 "HH:MM:SS", 7,919 customers, amounts by cents
TIMES = ["%02d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60) for s in range(86400)]
CUSTOMERS = ["C%05d" % k for k in range(7919)]
AMOUNTS = ["%d.%02d" % divmod(c, 100) for c in range(101101)]
CURRENCIES = ("USD", "EUR")
PLACEHOLDER = FETCHED_PLACEHOLDER.decode()


def render_records(out, idxs, seed, base_s, status_shift, customers=CUSTOMERS, statuses=STATUSES,
                   amounts=AMOUNTS, currencies=CURRENCIES, times=TIMES, placeholder=PLACEHOLDER):
    """Append the JSON text of record i for each i of idxs (ascending) to out: updated_at =
    base_s + i seconds, status moved on by status_shift (a corrected record: 1, and amount +
    10.01). The amount (100 to 99999 cents) and the currency come from a hash of (seed, i)."""
    append = out.append
    st = seed * 0x85EBCA77 + 0x27D4EB2F
    off = 100 + (1001 if status_shift else 0)
    cur_day, day_text = None, ""
    for i in idxs:
        h = (i * 0x9E3779B1 + st) & 0xFFFFFFFF
        h ^= h >> 16
        day, rem = divmod(base_s + i, 86400)
        if day != cur_day:
            cur_day, day_text = day, day_str(day)
        append(
            f'{{"order_id":{100000 + i},"customer":"{customers[i % 7919]}",'
            f'"order_status":"{statuses[(i + status_shift) & 3]}","amount":"{amounts[h % 99900 + off]}",'
            f'"currency":"{currencies[(h >> 7) & 1]}","updated_at":"{day_text}T{times[rem]}Z",'
            f'"fetched_at":"{placeholder}"}}'
        )


class PageCache:
    """An LRU of rendered page templates bounded by their total size in bytes."""

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.pages = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            body = self.pages.get(key)
            if body is not None:
                self.pages.move_to_end(key)
            return body

    def put(self, key, body):
        if len(body) > self.max_bytes:
            return
        with self.lock:
            if key in self.pages:
                return
            self.pages[key] = body
            self.bytes += len(body)
            while self.bytes > self.max_bytes:
                _, old = self.pages.popitem(last=False)
                self.bytes -= len(old)


def encode_cursor(offset):
    raw = CURSOR_MARK + offset.to_bytes(8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(text):
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != len(CURSOR_MARK) + 8 or not raw.startswith(CURSOR_MARK):
        return None
    return int.from_bytes(raw[len(CURSOR_MARK):], "big")


def parse_since(text):
    """An RFC 3339 timestamp with a time zone -> seconds since the epoch (float), or None."""
    if " " in text and "+" not in text:
        text = text.replace(" ", "+")  # an unencoded '+' of the offset arrives as a space
    if len(text) < 20 or text[10] not in "Tt":
        return None
    if text[-1] in "zZ":
        text = text[:-1] + "+00:00"
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    return (t - EPOCH).total_seconds()


class Api:
    def __init__(self, records, page_size, seed, revision, token, cache_mb):
        self.records = records
        self.page_size = page_size
        self.seed = seed
        self.token = token
        self.cache = PageCache(cache_mb * 1024 * 1024)
        self.lock = threading.Lock()
        self.views = {}
        self.set_revision(revision)

    def set_revision(self, revision):
        with self.lock:
            self.revision = revision
            if revision not in self.views:
                self.views[revision] = View(self.records, revision, self.seed)

    def current(self):
        with self.lock:
            return self.revision, self.views[self.revision]

    def warm(self):
        """Render the pages a pull with the default limit and no updated_since asks for into the
        cache, while they fit (--warm: the pull's timing then leaves out the rendering)."""
        _, view = self.current()
        for offset in range(0, max(view.length, 1), self.page_size):
            if self.cache.bytes + 200 * self.page_size > self.cache.max_bytes:
                break
            self.page(self.page_size, None, offset)

    def page(self, limit, since_s, offset):
        """The JSON body (bytes) of one page of /v2/orders, fetched_at filled in."""
        revision, view = self.current()
        first = 0 if since_s is None else view.first_at_or_after(since_s)
        total = view.length - first
        if offset > total:
            offset = total
        key = (revision, limit, since_s, offset)
        body = self.cache.get(key)
        if body is None:
            stop = min(offset + limit, total)
            nxt = encode_cursor(stop) if stop < total else None
            body = (
                '{"data":[' + view.render(first + offset, first + stop) + '],"meta":{"next":'
                + ('"%s"' % nxt if nxt else "null") + ',"total":%d}}' % total
            ).encode()
            self.cache.put(key, body)
        return body.replace(FETCHED_PLACEHOLDER, now_rfc3339().encode())


def make_handler(api, verbose):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def version_string(self):
            return "vendor-api/1"

        def log_message(self, fmt, *args):
            if verbose:
                sys.stderr.write("api_server: %s %s\n" % (self.address_string(), fmt % args))

        def send(self, status, body=b"", ctype="application/json", extra=()):
            self.send_response(status)
            for k, v in extra:
                self.send_header(k, v)
            if status != 204:
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if status != 204 and self.command != "HEAD":
                self.wfile.write(body)

        def error(self, status, message, extra=()):
            self.send(status, json.dumps({"error": message}).encode(), extra=extra)

        def read_body(self):
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = 0
            return self.rfile.read(n) if n > 0 else b""

        def authorized(self):
            if api.token is None:
                return True
            got = self.headers.get("Authorization") or ""
            want = "Bearer " + api.token
            return hmac.compare_digest(got.encode("utf-8", "replace"), want.encode())

        def do_GET(self):
            url = urlsplit(self.path)
            path = url.path
            if path == "/health":
                return self.send(200, b"ok", ctype="text/plain")
            if path == "/_control/revision":
                return self.send(200, json.dumps({"revision": api.current()[0]}).encode())
            if path.rstrip("/") == "/v2/orders":
                if not self.authorized():
                    return self.error(401, "unauthorized", extra=[("WWW-Authenticate", "Bearer")])
                return self.orders(url.query)
            if path.startswith("/v2/") and not self.authorized():
                return self.error(401, "unauthorized", extra=[("WWW-Authenticate", "Bearer")])
            return self.error(404, "not found: %s" % path)

        def do_HEAD(self):
            return self.do_GET()

        def do_POST(self):
            body = self.read_body()
            path = urlsplit(self.path).path
            if path != "/_control/revision":
                if path.startswith("/v2/") and not self.authorized():
                    return self.error(401, "unauthorized", extra=[("WWW-Authenticate", "Bearer")])
                if path.rstrip("/") == "/v2/orders":
                    return self.error(405, "method not allowed", extra=[("Allow", "GET")])
                return self.error(404, "not found: %s" % path)
            try:
                revision = json.loads(body)["revision"]
            except (ValueError, TypeError, KeyError):
                return self.error(400, 'body must be a JSON object {"revision": K}')
            if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
                return self.error(400, "revision must be an integer >= 0")
            api.set_revision(revision)
            if verbose:
                sys.stderr.write("api_server: revision %d\n" % revision)
            return self.send(204)

        def orders(self, query):
            try:
                params = parse_qs(query, keep_blank_values=True, strict_parsing=False)
            except ValueError:
                return self.error(400, "bad query string")
            for name, values in params.items():
                if len(values) > 1:
                    return self.error(400, "parameter %s given more than once" % name)
            limit = api.page_size
            if "limit" in params:
                text = params["limit"][0]
                if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
                    return self.error(400, "limit must be an integer from 1 to %d" % MAX_LIMIT)
                limit = int(text)
            since_s = None
            if "updated_since" in params:
                since_s = parse_since(params["updated_since"][0])
                if since_s is None:
                    return self.error(400, "updated_since must be an RFC 3339 timestamp with a time zone")
            offset = 0
            if "cursor" in params:
                offset = decode_cursor(params["cursor"][0])
                if offset is None:
                    return self.error(400, "bad cursor")
            return self.send(200, api.page(limit, since_s, offset))

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def write_port_file(path, port):
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_port_file(path, port):
    try:
        with open(path) as f:
            if f.read() != "%d\n" % port:
                return  # someone else's by now
        os.remove(path)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description="deterministic paginated JSON vendor API (loopback)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--records", type=int, required=True, help="N, records of revision 0")
    ap.add_argument("--page-size", type=int, default=1000, help="default limit (1 to 5000)")
    ap.add_argument("--token", help="require Authorization: Bearer TOKEN on /v2/")
    ap.add_argument("--port-file", help="write the port here (atomically) once listening")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--revision", type=int, default=0)
    ap.add_argument("--cache-mb", type=int, default=256, help="rendered-page cache bound (MiB)")
    ap.add_argument("--warm", action="store_true",
                    help="render the default pages into the cache before listening")
    ap.add_argument("--verbose", action="store_true", help="log each request on stderr")
    a = ap.parse_args()
    if a.records < 0:
        ap.error("--records must be >= 0")
    if not 1 <= a.page_size <= MAX_LIMIT:
        ap.error("--page-size must be from 1 to %d" % MAX_LIMIT)
    if a.revision < 0:
        ap.error("--revision must be >= 0")
    if a.token is not None and not a.token:
        ap.error("--token must not be empty")
    if a.cache_mb < 0:
        ap.error("--cache-mb must be >= 0")

    api = Api(a.records, a.page_size, a.seed, a.revision, a.token, a.cache_mb)
    if a.warm:
        api.warm()
    if ":" in a.host:
        Server.address_family = socket.AF_INET6
    server = Server((a.host, a.port), make_handler(api, a.verbose))
    port = server.server_address[1]

    stopping = threading.Event()

    def stop(signum, frame):
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    if a.port_file:
        write_port_file(a.port_file, port)
    sys.stdout.write("%d\n" % port)
    sys.stdout.flush()
    if a.verbose:
        sys.stderr.write("api_server: listening on %s:%d, %d records, revision %d%s\n" % (
            a.host, port, a.records, a.revision, ", bearer token required" if a.token else ""))
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if a.port_file:
            remove_port_file(a.port_file, port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
