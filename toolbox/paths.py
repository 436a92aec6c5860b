"""Where things are: the project's own files and the user's state and cache folders.

One home for these places, so that the stack package, the components and the commands agree.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent  # the checkout (or the installed tree): dockerfiles/, entrypoints/
STACKS_DIR = PACKAGE_DIR / "stacks"  # the shipped stacks and their Python locks
# The shipped stack a command uses when none is named, by the rule in docs/stacks.md ("The
# default"): ROCm 10.1.0, pinned on first use, since no known failure stands against it;
# gfx1151-rocm10.0 (every pin verified) and `gfx1151` (7.13) stay named stacks.
DEFAULT_STACK = "gfx1151-rocm10.1"


def state_dir() -> Path:
    """$TOOLBOX_STATE_DIR, else $XDG_STATE_HOME/toolbox, else ~/.local/state/toolbox."""
    if os.environ.get("TOOLBOX_STATE_DIR"):
        return Path(os.environ["TOOLBOX_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbox"


def cache_dir() -> Path:
    """$TOOLBOX_CACHE_DIR, else $XDG_CACHE_HOME/toolbox, else ~/.cache/toolbox."""
    if os.environ.get("TOOLBOX_CACHE_DIR"):
        return Path(os.environ["TOOLBOX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toolbox"
