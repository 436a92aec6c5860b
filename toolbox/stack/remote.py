"""Network reads of `toolbox bump`: a URL opened (one clear error when it cannot be) or hashed, a
git ref resolved to its commit (`git ls-remote`), an image tag to its registry digest (v2 API)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import urllib.error
import urllib.request

from toolbox.errors import ToolError, UserError


class NotFound(ToolError):
    """The server answered 404: nothing there (a project an index does not list)."""


def _open(url: str, method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        return urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"cannot reach {url}: {exc.reason}") from None
        raise ToolError(f"cannot reach {url}: {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ToolError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    except ValueError as exc:  # http.client.InvalidURL and the like: what the URL was built from
        raise UserError(f"{url}: not a URL that can be fetched ({exc})") from None


def sha256_url(url: str) -> str:
    h = hashlib.sha256()
    with _open(url) as resp:
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_git(repo: str, ref: str | None) -> str:
    ref = ref or "HEAD"
    if ref == "latest":
        ref = "HEAD"
    try:
        out = subprocess.run(["git", "ls-remote", repo, ref, f"{ref}^{{}}"], capture_output=True,
                             text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"git ls-remote {repo}: {exc}") from None
    if out.returncode != 0:
        raise ToolError(f"git ls-remote {repo} {ref}: {out.stderr.strip()}")
    rows = [line.split("\t") for line in out.stdout.splitlines() if "\t" in line]
    # An annotated tag's peeled line (^{}) names the commit; prefer it.
    peeled = [sha for sha, name in rows if name.endswith("^{}")]
    exact = [sha for sha, name in rows if name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}")]
    for cands in (peeled, exact, [sha for sha, _ in rows]):
        if cands:
            return cands[0]
    raise UserError(f"--to {ref}: no such ref in {repo}")


def resolve_digest(image: str, registry_url: str | None = None) -> str:
    """Manifest digest of image (registry/name:tag) via the registry's v2 API (anonymous)."""
    ref, _, tag = image.rpartition(":")
    host, _, name = ref.partition("/")
    if "." not in host and ":" not in host:
        host, name = "registry-1.docker.io", ref
    if host == "docker.io":
        host = "registry-1.docker.io"
        if "/" not in name:
            name = f"library/{name}"
    base = registry_url or f"https://{host}"
    accept = ", ".join([
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ])
    with _open(f"{base}/v2/{name}/manifests/{tag}", method="HEAD", headers={"Accept": accept}) as resp:
        digest = resp.headers.get("Docker-Content-Digest")
    if not digest or not re.match(r"^sha256:[0-9a-f]{64}$", digest):
        raise ToolError(f"{base}: no Docker-Content-Digest for {image}")
    return digest
