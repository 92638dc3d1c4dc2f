"""A fault-injecting HTTP proxy for the tests, in front of the local S3 server (tests/s3_server.py):
every `every`-th request (only the first `limit` of them: with every=1, a burst) it answers 503
SlowDown (S3's "reduce your request rate"), or forwards it and then cuts the connection in the
middle of the answer's body (a reset: the socket closed with SO_LINGER 0), as a loaded object
store or its load balancer does. All other requests pass through unchanged. `faults` counts the
faults injected."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class FaultyProxy:
    """Listens on 127.0.0.1 (its `url`), forwards to `upstream` (http://host:port)."""

    def __init__(self, upstream: str, every: int, fault: str, limit: int | None = None) -> None:
        assert fault in ("503", "reset")
        self.upstream, self.every, self.fault = urlsplit(upstream), every, fault
        self.limit = limit
        self.requests = self.faults = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _any(self) -> None:
                body = self._request_body()
                with proxy.lock:
                    proxy.requests += 1
                    faulty = (proxy.requests % proxy.every == 0
                              and (proxy.limit is None or proxy.faults < proxy.limit))
                    proxy.faults += faulty
                if faulty and proxy.fault == "503":
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(SLOW_DOWN)
                    return
                status, headers, answer = proxy.forward(self.command, self.path,
                                                        self.headers, body)
                self.send_response_only(status)
                for name, value in headers:
                    if name.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(name, value)
                if not any(n.lower() == "content-length" for n, _ in headers):
                    self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if faulty:  # half the body, then a reset
                    self.wfile.write(answer[:len(answer) // 2])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(answer)

            def _request_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size_line = self.rfile.readline()
                        chunks.append(size_line)
                        size = int(size_line.split(b";")[0], 16)
                        data = self.rfile.read(size + 2)
                        chunks.append(data)
                        if size == 0:
                            # trailers until the empty line
                            while data not in (b"\r\n", b""):
                                data = self.rfile.readline()
                                chunks.append(data)
                            return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def forward(self, method: str, path: str, headers, body: bytes):
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                                timeout=60)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                connection.putheader(name, value)
            connection.endheaders(body if body else None)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
