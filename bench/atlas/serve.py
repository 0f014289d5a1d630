#!/usr/bin/env python3
"""A minimal S3-compatible server over a local folder, for measuring listings: objects
are served with ranges, ETags (nginx's) and If-Match (412) from the files (the atlas
bench puts nginx in front for them, as a Python server answers few requests a second), and ListObjectsV2 pages
(delimited or not, continuation tokens, max-keys up to 1000) come from a key list
computed once, each page answered after a fixed delay, as a real store's take time.
PUT writes a file. No signature is checked. GET /__stats counts the listing pages answered, by prefix.

usage: serve.py ROOT PORT PAGE_DELAY_SECONDS   (ROOT/<bucket>/<key>)
"""
import bisect, email.utils, hashlib, json, os, sys, threading, time, urllib.parse
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from xml.sax.saxutils import escape

ROOT, PORT, DELAY = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
LOCK = threading.Lock()
KEYS = {}  # bucket -> sorted list of keys
PAGES = {}  # listing pages answered so far, by the prefix listed
# GET of this path answers {"list_pages": {prefix: pages}}: how a bench tells whether a
# mount listed a dataset (a mount of the bucket lists its root besides).
STATS_PATH = "/__stats"


def index():
    for bucket in os.listdir(ROOT):
        keys = []
        base = os.path.join(ROOT, bucket)
        for dirpath, _, files in os.walk(base):
            for name in files:
                keys.append(os.path.relpath(os.path.join(dirpath, name), base))
        keys.sort()
        KEYS[bucket] = keys


def etag(st):
    # nginx's ETag of a static file, which serves the objects' GETs in front of this
    # server: a listing's or manifest's ETag must match what a GET with If-Match meets.
    return '"%x-%x"' % (int(st.st_mtime), st.st_size)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def split(self):
        url = urllib.parse.urlsplit(self.path)
        parts = urllib.parse.unquote(url.path).lstrip("/").split("/", 1)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        return parts[0], (parts[1] if len(parts) > 1 else ""), query

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def not_found(self):
        self.reply(404, b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>no</Message></Error>",
                   [("Content-Type", "application/xml")])

    def do_PUT(self):
        bucket, key, _ = self.split()
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = os.path.join(ROOT, bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
        with LOCK:
            keys = KEYS.setdefault(bucket, [])
            i = bisect.bisect_left(keys, key)
            if i == len(keys) or keys[i] != key:
                keys.insert(i, key)
        self.reply(200, b"", [("ETag", etag(os.stat(path)))])

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if self.path == STATS_PATH:
            with LOCK:
                body = json.dumps(dict(list_pages=PAGES)).encode()
            return self.reply(200, body, [("Content-Type", "application/json")])
        bucket, key, query = self.split()
        if query.get("list-type") == "2":
            return self.list(bucket, query)
        path = os.path.join(ROOT, bucket, key)
        try:
            st = os.stat(path)
        except OSError:
            return self.not_found()
        tag = etag(st)
        if self.headers.get("If-Match") not in (None, tag):
            return self.reply(412)
        size, start, end, status = st.st_size, 0, st.st_size, 200
        headers = [("ETag", tag), ("Accept-Ranges", "bytes"),
                   ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))]
        rng = self.headers.get("Range")
        if rng:
            a, b = rng.split("=", 1)[1].split("-")
            start, end = int(a), (int(b) + 1 if b else size)
            end = min(end, size)
            if start >= size:
                return self.reply(416)
            status = 206
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        body = b""
        if self.command != "HEAD":
            with open(path, "rb") as f:
                f.seek(start)
                body = f.read(end - start)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def list(self, bucket, query):
        time.sleep(DELAY)
        prefix, delim = query.get("prefix", ""), query.get("delimiter", "")
        with LOCK:
            PAGES[prefix] = PAGES.get(prefix, 0) + 1
        max_keys = min(int(query.get("max-keys", "1000")), 1000)
        after = query.get("start-after", "")
        token = query.get("continuation-token")
        if token:
            after = bytes.fromhex(token).decode()
        keys = KEYS.get(bucket, [])
        i = bisect.bisect_right(keys, after) if after else bisect.bisect_left(keys, prefix)
        out, n, last = [], 0, None
        while i < len(keys) and n < max_keys:
            key = keys[i]
            if not key.startswith(prefix):
                break
            rest = key[len(prefix):]
            if delim and delim in rest:
                cp = prefix + rest.split(delim, 1)[0] + delim
                out.append(f"<CommonPrefixes><Prefix>{escape(cp)}</Prefix></CommonPrefixes>")
                last = cp + "\U0010ffff"
                i = bisect.bisect_left(keys, last)
            else:
                try:
                    st = os.stat(os.path.join(ROOT, bucket, key))
                except FileNotFoundError:
                    # Deleted from the folder since it was listed (the bench's manifest
                    # between runs): a store lists it no more.
                    i += 1
                    continue
                modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(st.st_mtime))
                out.append(f"<Contents><Key>{escape(key)}</Key><LastModified>{modified}</LastModified>"
                           f"<ETag>{escape(etag(st))}</ETag><Size>{st.st_size}</Size>"
                           f"<StorageClass>STANDARD</StorageClass></Contents>")
                last = key
                i += 1
            n += 1
        truncated = i < len(keys) and keys[i].startswith(prefix)
        body = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult>",
                f"<Name>{bucket}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{n}</KeyCount>",
                f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if truncated:
            body.append(f"<NextContinuationToken>{last.encode().hex()}</NextContinuationToken>")
        body += out
        body.append("</ListBucketResult>")
        self.reply(200, "".join(body).encode(), [("Content-Type", "application/xml")])


index()
print("indexed", {b: len(k) for b, k in KEYS.items()}, flush=True)

class Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops the SYNs of a client that opens dozens of
    # connections at once: each waits for the kernel's retransmission (1 s, then 3 s),
    # and its request times out, a stall no real store makes.
    request_queue_size = 1024


server = Server(("127.0.0.1", PORT), Handler)
server.daemon_threads = True
server.serve_forever()
