"""``python -m bench.otlp_sink``: an OTLP/HTTP receiver on 127.0.0.1 that accepts and
drops what it is sent (the benchmark's traces go somewhere real, at a real cost to
the sender). Prints its port, then serves until killed."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps the connection open, as collectors do

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    print(server.server_port, flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
