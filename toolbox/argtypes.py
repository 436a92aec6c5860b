"""argparse types shared by the commands: a bad value is refused while the arguments are read,
naming the flag (exit 2), before anything is built, written or started."""

from __future__ import annotations

import argparse
import re

from toolbox_train import contract

# The image reference grammar of the distribution spec (what podman and Docker accept):
# [registry[:port]/]path[:tag][@digest]; lower-case path, a tag of at most 128 characters.
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,})?")
_IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}")
_CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_NETWORK = re.compile(r"[A-Za-z0-9_.:/=,@+-]{1,256}")


def image_ref(text: str) -> str:
    """argparse type of --image/--tag: an image reference or id, refused here rather than by
    the engine after a build (a tag with a space or upper case is refused by every engine)."""
    if len(text) > 255 or not (_IMAGE_REF.fullmatch(text) or _IMAGE_ID.fullmatch(text)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an image reference: expected [registry/]name[:tag] in lower case, e.g. localhost/toolbox-cpu:mine")
    return text


def container_name(text: str) -> str:
    """argparse type of --name/--container: what podman, Docker, toolbx and distrobox accept."""
    if not _CONTAINER_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: use letters, digits, '-', '_' or '.' (starting with a letter or digit)")
    return text


def network_mode(text: str) -> str:
    """argparse type of --network: host, none, bridge, a network's name, container:NAME ..."""
    if not _NETWORK.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a network mode (e.g. host, none, bridge, a network name)")
    return text


def count(text: str) -> int:
    """A whole number of 1 or more (0 processes or iterations cannot run)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, not {n}")
    return n


def tcp_port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), not {text!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port (1-65535)")
    return n


def size_mib(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in MiB, not {text!r}") from None
    if not 0 < n <= 16384:  # nan and inf fail this too
        raise argparse.ArgumentTypeError(f"expected a size above 0 and at most 16384 MiB, not {text}")
    return n


def version_or_ref(text: str) -> str:
    """`bump --to`: a version, a git ref or an image tag (no spaces, no leading '-')."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._+/-]{0,199}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a version, git ref or tag (e.g. 7.13.0, v0.51.0, latest)")
    return text


def http_url(text: str) -> str:
    """An index or registry URL: http(s) or file, with a host (file: a path), no spaces."""
    from urllib.parse import urlsplit

    parts = urlsplit(text) if text.isprintable() and " " not in text else None
    if parts is None or parts.scheme not in ("http", "https", "file") or not (parts.netloc or parts.scheme == "file"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s):// or file:// URL")
    return text


def sync_mode(text: str) -> str:
    """cluster --sync: what `launch --sync` takes (toolbox_train.config.sync), checked before
    any host is asked rather than by every node's launch."""
    k = text.removeprefix("local-sgd:") if text.startswith("local-sgd:") else None
    if text != "every-step" and not (k and k.isdigit() and int(k) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: expected every-step or local-sgd:K with K >= 1")
    return text


# An old flag name kept working hidden, one line naming the new one: the contract's, as launch and
# rccl-check take it in the image.
renamed = contract.renamed
