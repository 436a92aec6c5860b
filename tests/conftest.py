"""Shared test set-up: makes `from helpers.tiny import ...` work, and tiny-model fixtures.

The tiny models are built once per test session (a fraction of a second each) and shared;
tests that change a model copy it first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
for p in (str(TESTS), str(ROOT / "entrypoints")):
    if p not in sys.path:
        sys.path.insert(0, p)

# Session fixtures of images and engines, for every test folder: base_image, cpu_image (the cpu
# stack built once, podman), podman_socket, dockerd, test_user (rootless podman, distrobox, toolbx).
from helpers.image_fixtures import base_image, cpu_image, dockerd, podman_socket, test_user  # noqa: E402,F401

# The fixtures that build or run container images: a test using any of them (directly or through
# another fixture) is marked `image`; `make test-fast` (-m "not image") leaves those out.
IMAGE_FIXTURES = {"base_image", "cpu_image", "dockerd", "podman_socket", "test_user"}


def pytest_configure(config):
    config.addinivalue_line("markers", "image: builds or runs a container image (make test-fast leaves it out)")


# Tests that share machine-wide state go to one pytest-xdist worker each group (`make test`: --dist
# loadgroup), in turn: the session's images, dockerd and rootless test user are made once and never raced
# ("engines": every test on an image fixture, and tests/engines); tests/cluster and tests/ray (network
# namespaces, sshd, Ray heads, many processes) are a group each, so they run beside each other, not
# beside themselves.
GROUPS = {"cluster": "cluster", "ray": "ray", "engines": "engines"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its loadgroup hook)
def pytest_collection_modifyitems(items):
    for item in items:
        rel = Path(str(item.fspath)).relative_to(TESTS).parts
        group = GROUPS.get(rel[0]) if len(rel) > 1 else None
        if IMAGE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.image)
            group = group or "engines"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


# Nothing in the suite may reach a hub; fail fast instead of hanging on the closed network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True, scope="session")
def _user_state(tmp_path_factory):
    """toolbox's first-use pins file and download cache (toolbox.stack.pinning) go to a session folder,
    never the developer's ~/.local/state or ~/.cache."""
    d = tmp_path_factory.mktemp("user-state")
    os.environ.setdefault("TOOLBOX_STATE_DIR", str(d / "state"))
    os.environ.setdefault("TOOLBOX_CACHE_DIR", str(d / "cache"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """`tiny_models("qwen3")` -> Path of a saved tiny model (built once per session per arch)."""
    from helpers.tiny import make_tiny_model

    cache: dict[str, Path] = {}

    def get(arch: str = "llama") -> Path:
        if arch not in cache:
            cache[arch] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_model(tiny_models) -> Path:
    """A saved tiny Llama-architecture model with its tokenizer."""
    return tiny_models("llama")


@pytest.fixture
def text_dataset(tmp_path) -> Path:
    from helpers.tiny import write_dataset

    return write_dataset(tmp_path / "data" / "train.jsonl", "text", n=64)


@pytest.fixture(scope="session")
def tiny_vlms(tmp_path_factory):
    """`tiny_vlms("gemma3")` -> Path of a saved tiny vision-language model with its processor (built once per
    session per family; helpers/tiny_vision.py). Qwen-VL processors need torchvision: skipped without it,
    failed in CI (helpers/tiny_vision.require_torchvision)."""
    from helpers.tiny_vision import make_tiny_vlm, require_torchvision

    cache: dict[str, Path] = {}

    def get(family: str = "gemma3") -> Path:
        if family.startswith("qwen"):
            require_torchvision()
        if family not in cache:
            cache[family] = make_tiny_vlm(tmp_path_factory.mktemp(f"tiny-vlm-{family}"), family)
        return cache[family]

    return get
