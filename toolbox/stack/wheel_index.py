"""The wheels a PEP 503 "simple" index lists for a project (what `toolbox bump torch` reads).

AMD's indexes are static file trees: `<index>/<project>/` is an HTML page of links to wheel
files. Filenames are parsed with packaging's wheel-filename parser, not by hand.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from html.parser import HTMLParser

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version


@dataclass(frozen=True)
class Wheel:
    filename: str
    version: Version
    interpreters: frozenset[str]  # cp312, py3, ...
    platforms: frozenset[str]  # manylinux_2_28_x86_64, linux_x86_64, win_amd64, ...
    url: str = ""  # the link, resolved against the page's URL, without its fragment
    sha256: str | None = None  # the link's #sha256= fragment, where the index gives one (PEP 503)

    def runs_on_linux_x86_64(self) -> bool:
        return any(p == "any" or (p.endswith("_x86_64") and "linux" in p) for p in self.platforms)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def project_url(index_url: str, project: str) -> str:
    base = index_url if index_url.endswith("/") else index_url + "/"
    return urllib.parse.urljoin(base, canonicalize_name(project) + "/")


def parse_page(html: str, page_url: str = "") -> list[Wheel]:
    """The wheel files linked from a project page (other links are skipped)."""
    parser = _Links()
    parser.feed(html)
    out = []
    for href in parser.hrefs:
        link, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        sha = fragment[len("sha256="):].lower() if fragment.startswith("sha256=") else None
        name = urllib.parse.unquote(urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1])
        if not name.endswith(".whl"):
            continue
        try:
            _, version, _, tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        out.append(Wheel(name, version, frozenset(t.interpreter for t in tags), frozenset(t.platform for t in tags),
                         link, sha))
    return out


def versions(wheels: list[Wheel], *, local: str | None = None, interpreter: str | None = None) -> set[Version]:
    """Versions with a Linux x86_64 wheel, for this local tag (e.g. rocm7.14.0) and interpreter."""
    out = set()
    for w in wheels:
        if local is not None and w.version.local != local:
            continue
        if interpreter is not None and not ({interpreter, "py3"} & w.interpreters):
            continue
        if w.runs_on_linux_x86_64():
            out.add(w.version)
    return out
