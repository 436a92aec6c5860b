"""A folder served over HTTP on loopback, for the tests that stand in for a package index or AMD's
repository (bump, first-use pins, the ROCm sort trap): one server per use, shut down after it."""

from __future__ import annotations

import contextlib
import functools
import http.server
import ssl
import subprocess
import threading
from pathlib import Path


class Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves files; logs nothing (pytest would show every request)."""

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def serve_folder(root: Path, handler: type[http.server.SimpleHTTPRequestHandler] = Quiet, tls: Path | None = None):
    """http://127.0.0.1:PORT serving `root` (with `handler`, a SimpleHTTPRequestHandler, for redirects
    and the like) while the block runs; https:// with `tls`, a folder from self_signed()."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls / "cert.pem", tls / "key.pem")
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def self_signed(folder: Path) -> Path:
    """A certificate for 127.0.0.1 and its key in `folder` (cert.pem is also the CA a client trusts:
    SSL_CERT_FILE), for a stand-in of a repository that must be https (AMD's ROCm wheels)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(folder / "key.pem"),
                    "-out", str(folder / "cert.pem")], check=True, capture_output=True, timeout=60)
    return folder
