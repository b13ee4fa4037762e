"""A GCE metadata server on 127.0.0.1 for host-detection tests: it answers instance attributes
only to requests that carry `Metadata-Flavor: Google`, as the real one does."""

from __future__ import annotations

import http.server
import threading


class FakeMetadataServer:
    """`with FakeMetadataServer({"agent-worker-number": "1", ...}) as server:` then point
    `GCE_METADATA_IP` at `server.address`."""

    def __init__(self, attributes: dict[str, str]) -> None:
        self.requests: list[str] = []
        prefix = "/computeMetadata/v1/instance/attributes/"
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.requests.append(self.path)
                key = self.path[len(prefix):] if self.path.startswith(prefix) else None
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                elif key not in attributes:
                    self.send_error(404)
                else:
                    body = attributes[key].encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeMetadataServer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
