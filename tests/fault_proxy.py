"""A fault-injecting HTTP proxy between tokenmill and the S3-protocol test server (moto), on 127.0.0.1.

Each request the proxy receives is, with probability `rate` (seeded), answered with a fault instead of
being passed on unchanged:

- `reset`: the connection is reset before the request reaches the server (nothing happened there);
- `reset_after`: the request reaches the server (a PUT is stored), then the connection is reset: the client
  sees a failure for something that succeeded, so only idempotent requests may be retried;
- `slowdown`: 503 SlowDown, as S3 throttles; `internal`: 500 InternalError;
- `truncate`: the server's answer cut off halfway through its body, then a reset;
- `stall`: no answer for `stall_s` seconds, then the connection closed (the client's read timeout fires).

`methods` restricts faults to some HTTP methods (GET reads, PUT/POST writes, GET with `list-type` listings,
HEAD existence checks). `injected` counts the faults by kind and method; `seen` lists every request as (method,
path); `sent` counts the bytes of the answers' bodies. Used by tests/test_faults_s3.py, bench/faults.py and
bench/incremental.py.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

KINDS = ("reset", "reset_after", "slowdown", "internal", "truncate", "stall")
ERROR_BODY = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class FaultProxy:
    def __init__(self, upstream: str, seed: int = 0):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.rate = 0.0
        self.kinds: tuple[str, ...] = KINDS
        self.methods: set[str] | None = None  # None: every method
        self.stall_s = 3.0
        self.injected: Counter = Counter()
        self.requests = 0
        self.seen: list[tuple[str, str]] = []
        self.sent = 0  # bytes of the bodies answered (what clients downloaded)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except (ConnectionError, TimeoutError, OSError):
                    self.close_connection = True

            def _any(self):
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def configure(self, rate: float, kinds=KINDS, methods=None, stall_s: float | None = None) -> None:
        with self.lock:
            self.rate, self.kinds = rate, tuple(kinds)
            self.methods = set(methods) if methods else None
            if stall_s is not None:
                self.stall_s = stall_s

    def _fault_for(self, method: str, path: str) -> str | None:
        with self.lock:
            self.requests += 1
            self.seen.append((method, path))
            if self.methods is not None and method not in self.methods:
                return None
            if self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(self.kinds)
            if kind == "truncate" and method != "GET":
                kind = "reset_after"  # only a body can be cut short
            self.injected[(kind, method)] += 1
            return kind

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        body = _read_body(handler)
        kind = self._fault_for(handler.command, handler.path)
        if kind == "reset":
            return _reset(handler)
        if kind == "stall":
            time.sleep(self.stall_s)
            handler.close_connection = True
            return None
        if kind in ERRORS:
            status, code, message = ERRORS[kind]
            payload = ERROR_BODY.format(code=code, message=message).encode()
            handler.send_response(status)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            return None
        status, headers, answer = self._forward(handler, body)
        if kind == "reset_after":
            return _reset(handler)
        handler.send_response(status)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                handler.send_header(name, value)
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", len(answer)))
        handler.send_header("Content-Length", str(length if handler.command == "HEAD" else len(answer)))
        handler.end_headers()
        if kind == "truncate" and len(answer) > 1:
            handler.wfile.write(answer[: len(answer) // 2])
            handler.wfile.flush()
            return _reset(handler)
        if handler.command != "HEAD":
            handler.wfile.write(answer)
            with self.lock:
                self.sent += len(answer)
        return None

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list, bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            connection.putrequest(handler.command, handler.path, skip_host=True, skip_accept_encoding=True)
            for name, value in handler.headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    connection.putheader(name, value)
            if body or handler.command in ("PUT", "POST"):
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox does."""
    handler.close_connection = True
    try:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    except OSError:
        pass
