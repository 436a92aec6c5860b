"""The Docker SDK's private calls, in one place.

podman's Docker-compatible /build takes a `secrets` parameter (the secret files ride in the
context tar) that the SDK's public `APIClient.build()` cannot send, so the build goes through
the SDK's private request helpers. They are stable across docker-py 7.x; pyproject bounds
the SDK to `docker>=7,<8`, and a missing helper is a clear error, not an AttributeError.
"""

from __future__ import annotations

from typing import IO, Iterator

from toolbox.errors import ToolError

_PRIVATE = ("_post", "_url", "_raise_for_status", "_stream_helper")


def post_build(api, context_tar: IO[bytes], params: dict) -> Iterator[dict]:
    """POST /build with PARAMS and a context tar; yields the decoded JSON progress chunks.
    Raises docker.errors.APIError for an HTTP error status."""
    missing = [m for m in _PRIVATE if not hasattr(api, m)]
    if missing:
        import docker

        raise ToolError(
            f"the docker SDK {docker.__version__} lacks {', '.join(missing)}, which podman's Docker-API "
            "builds use: install `docker>=7,<8` (pyproject's bound), or build with --engine podman"
        )
    resp = api._post(
        api._url("/build"),
        data=context_tar,
        params=params,
        headers={"Content-Type": "application/x-tar"},
        stream=True,
        timeout=None,
    )
    api._raise_for_status(resp)
    yield from api._stream_helper(resp, decode=True)
