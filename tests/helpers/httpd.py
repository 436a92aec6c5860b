"""A folder served over HTTP on loopback, for the tests that stand in for a package index or AMD's
repository (bump, first-use pins, the ROCm sort trap): one server per use, shut down after it."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from pathlib import Path


class Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves files; logs nothing (pytest would show every request)."""

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def serve_folder(root: Path, handler: type[http.server.SimpleHTTPRequestHandler] = Quiet):
    """http://127.0.0.1:PORT serving `root` (with `handler`, a SimpleHTTPRequestHandler, for redirects
    and the like) while the block runs."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
