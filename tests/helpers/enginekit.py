"""Helpers for the tests that build or run images: podman set up for this machine, a locally
made base image, a dockerd of our own (Dockerd), an unprivileged user with rootless podman
(TestUser). The session fixtures using them are in image_fixtures.py.

No registry is reachable where CI runs, so the base image the cpu stack names in FROM
(docker.io/library/debian:bookworm-slim) is made with debootstrap and `podman import`,
once per machine (podman's store keeps it across runs, the rootfs tarball too).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE_REF = "docker.io/library/debian:bookworm-slim"
CACHE = Path(os.environ.get("TOOLBOX_TEST_CACHE", "/var/tmp/toolbox-tests"))
IN_CI = os.environ.get("CI") == "true"

# Machine quirks (runc, cgroupfs, rlimits) for every podman this test process starts.
os.environ.setdefault("CONTAINERS_CONF", str(HERE / "containers.conf"))


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        msg = f"{tool} is not installed (.ci/apt-packages.txt lists it)"
        if IN_CI:
            pytest.fail(msg)  # in CI a missing engine is a failure, not a skip
        pytest.skip(msg)


def toolbox(*args: str, env: dict | None = None, timeout: int = 1800, check: bool = False) -> subprocess.CompletedProcess:
    """`python -m toolbox ARGS` as a user runs it; output captured (and echoed on failure)."""
    cp = subprocess.run(
        [sys.executable, "-m", "toolbox", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and cp.returncode != 0:
        raise AssertionError(f"toolbox {' '.join(args)} exited {cp.returncode}\n{cp.stdout[-6000:]}\n{cp.stderr[-6000:]}")
    return cp


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def ca_bundle() -> Path:
    """The host CA bundle pip needs inside builds here (PIP_CERT names it)."""
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return Path(cand)
    pytest.fail("no CA bundle found (PIP_CERT unset and /etc/ssl/certs/ca-certificates.crt missing)")


def wheelhouse() -> Path:
    """The folder holding the local torch 2.13.0+cpu cp311 wheel (PyPI's Linux torch is CUDA)."""
    for cand in (*(os.environ.get("PIP_FIND_LINKS") or "").split(), "/opt/wheels"):
        if cand and Path(cand).is_dir() and any(Path(cand).glob("torch-*.whl")):
            return Path(cand)
    pytest.fail("no wheelhouse with a torch wheel (PIP_FIND_LINKS or /opt/wheels)")




class Dockerd:
    """Paths and commands of a test dockerd: its own data/exec roots, pidfile and socket, no
    iptables and no bridge (nothing on the host's network changes)."""

    HOST_DIRS = ("/etc/docker", "/run/docker", "/run/containerd")

    def __init__(self, root: Path):
        self.root = root
        self.sock = root / "docker.sock"
        self.url = f"unix://{self.sock}"
        # what dockerd creates outside its roots: removed at the end unless it was there before
        self._host_dirs = [Path(p) for p in self.HOST_DIRS if not Path(p).exists()]
        self._key_json = Path("/etc/docker/key.json")
        self._key_existed = self._key_json.exists()

    def argv(self) -> list[str]:
        return ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none",
                "--storage-driver=overlay2", "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "dockerd.pid"),
                "-H", self.url]

    def cli(self, *args: str) -> list[str]:
        return [docker_cli(), "-H", self.url, *args]

    def run(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.cli(*args), capture_output=True, check=check, **kw)

    def clean_up(self) -> None:
        # dockerd leaves mounts under its roots (the netns of its containers under exec-root,
        # overlay2's own): lazily unmount the deepest first, then the folders can go
        mounts = []
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                point = line.split()[4].replace("\\040", " ")
                if point == str(self.root) or point.startswith(str(self.root) + "/"):
                    mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        # GBs of image layers: deleted in the background (minutes on a busy disk), out of the
        # suite's time; a rename first, so nothing is left at the fixture's path
        gone = self.root.with_name(self.root.name + ".deleting")
        self.root.rename(gone)
        subprocess.Popen(["rm", "-rf", str(gone)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not self._key_existed:
            self._key_json.unlink(missing_ok=True)
        for d in self._host_dirs:
            shutil.rmtree(d, ignore_errors=True)


def docker_cli() -> str:
    """A docker CLI for the tests' own calls (load, history, save); any version will do."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


class TestUser:
    """An unprivileged user with rootless podman for distrobox (which refuses root) and toolbx.

    Set-up, not product: podman with host network (slirp4netns cannot open /dev/net/tun here),
    overlay storage, runc/cgroupfs and the rlimits this machine allows; XDG_RUNTIME_DIR made as
    logind would; an existing file for DBUS_SYSTEM_BUS_ADDRESS (toolbx only checks it exists).
    The user runs this checkout's `python -m toolbox` with an interpreter it may execute."""

    __test__ = False  # not a test class

    def __init__(self, name: str, created: bool):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir)
        self.created = created
        self.runtime_dir = Path(f"/run/user/{self.uid}")
        self.dbus_file = self.runtime_dir / "toolbox-test-system-bus"
        self.python = sys.executable
        self.pythonpath = ""

    @classmethod
    def make(cls, name: str) -> "TestUser":
        created = False
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True,
                           capture_output=True)
            created = True
        if not any(line.startswith(name + ":") for line in Path("/etc/subuid").read_text().splitlines()):
            subprocess.run(["usermod", "--add-subuids", "300000-365535", "--add-subgids", "300000-365535", name],
                           check=True, capture_output=True)
        user = cls(name, created)
        if not created:
            # a user left by a run cut short: its processes (pause process, conmon, containers)
            # and runtime dir are stale, and its storage may still list containers as running;
            # rootless podman then fails with "invalid internal status" until migrated
            user._kill_processes()
            shutil.rmtree(user.runtime_dir, ignore_errors=True)
        if not user.home.is_dir() or user.home.stat().st_uid != user.uid:
            # a user left by a run cut short, its home gone: rootless podman needs a home of its own
            user.home.mkdir(parents=True, exist_ok=True)
            os.chown(user.home, user.uid, user.gid)
            user.home.chmod(0o700)
        user.runtime_dir.mkdir(parents=True, exist_ok=True)
        os.chown(user.runtime_dir, user.uid, user.gid)
        user.runtime_dir.chmod(0o700)
        user.dbus_file.touch()
        os.chown(user.dbus_file, user.uid, user.gid)
        conf = user.home / ".config" / "containers"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "storage.conf").write_text('[storage]\ndriver = "overlay"\n')
        (conf / "containers.conf").write_text(
            '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\nnetns = "host"\n'
            '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
        for d in (user.home / ".config", conf):
            os.chown(d, user.uid, user.gid)
        for f in conf.iterdir():
            os.chown(f, user.uid, user.gid)
        user._find_python()
        if not created:
            user.run(["podman", "system", "migrate"], timeout=300)
            user.run(["podman", "rm", "--all", "--force"], timeout=300)
        return user

    def _find_python(self) -> None:
        """PYTHONPATH and an interpreter the user can run the host CLI with. A checkout in a
        private folder (a 0700 home, as on current Fedora and Ubuntu) is out of the user's
        reach, its .venv too: then the user gets its own copy, in its home, of the checkout's
        source and of the installed packages the host CLI needs."""
        import sysconfig

        site = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        paths = [str(ROOT), str(ROOT / "entrypoints"), *site]
        if not all(self.can_read(Path(p)) for p in (ROOT / "toolbox" / "cli.py", *site)):
            paths = self._copy_checkout()
        self.pythonpath = os.pathsep.join(paths)
        tried = []
        for py in self._interpreters():
            cp = self.run([py, "-c", "import toolbox.cli, docker, pydantic, yaml, jinja2"], check=False)
            if cp.returncode == 0:
                self.python = py
                return
            tried.append(f"{py}: {(cp.stderr.strip() or cp.stdout.strip())[-300:]}")
        pytest.fail(f"no Python the user {self.name} can run this checkout with: {tried}")

    def can_read(self, path: Path) -> bool:
        return self.run(["test", "-r", str(path)], check=False).returncode == 0

    def _interpreters(self) -> list[str]:
        """This Python (a venv's links to its base, then the base), then the system's of the same
        minor version (the copied compiled packages, pydantic-core, are built for it)."""
        ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        found = [sys.executable, getattr(sys, "_base_executable", sys.executable),
                 os.path.realpath(sys.executable), shutil.which(ver, path="/usr/local/bin:/usr/bin:/bin")]
        return list(dict.fromkeys(p for p in found if p))

    def _copy_checkout(self) -> list[str]:
        """The checkout's source and the host CLI's installed packages (the base dependencies of
        strix-toolbox, found from the installed metadata) under ~/toolbox-src, owned by the user."""
        from importlib import metadata

        from packaging.requirements import Requirement

        dest = self.home / "toolbox-src"
        shutil.rmtree(dest, ignore_errors=True)
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        for part in ("toolbox", "entrypoints", "dockerfiles", "rccl-patches"):
            shutil.copytree(ROOT / part, dest / part, ignore=skip)
        shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
        todo, done = [Requirement(r) for r in metadata.requires("strix-toolbox") or []], set()
        while todo:
            req = todo.pop()
            name = req.name.lower().replace("_", "-")
            if name in done or (req.marker and not req.marker.evaluate({"extra": ""})):
                continue  # extras (train, test ...) are not what the host CLI needs
            done.add(name)
            dist = metadata.distribution(req.name)
            for f in dist.files or []:
                src = Path(dist.locate_file(f))
                if f.parts[0] == ".." or not src.is_file() or "__pycache__" in f.parts:
                    continue  # console scripts in the venv's bin; byte code is made again
                (dest / "site" / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / "site" / f)
            todo += [Requirement(r) for r in dist.requires or []]
        subprocess.run(["chown", "-R", f"{self.uid}:{self.gid}", str(dest)], check=True)
        return [str(dest), str(dest / "entrypoints"), str(dest / "site")]

    def env(self, **extra: str) -> dict:
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "SHELL": "/bin/bash",
                "PATH": "/usr/local/bin:/usr/bin:/bin", "XDG_RUNTIME_DIR": str(self.runtime_dir),
                "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={self.dbus_file}", "PYTHONPATH": self.pythonpath,
                "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra}

    def run(self, argv: list[str], check: bool = False, timeout: int = 1800, env: dict | None = None,
            **kw) -> subprocess.CompletedProcess:
        env = [f"{k}={v}" for k, v in self.env(**(env or {})).items()]
        cp = subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *env, *argv], cwd=self.home,
                            capture_output=True, text=True, timeout=timeout, **kw)
        if check and cp.returncode != 0:
            raise AssertionError(f"as {self.name}: {' '.join(argv)} exited {cp.returncode}\n"
                                 f"{cp.stdout[-4000:]}\n{cp.stderr[-4000:]}")
        return cp

    def toolbox(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run([self.python, "-m", "toolbox", *args], **kw)

    def load_image(self, tag: str) -> None:
        """The root podman's image into the user's storage, unless the same id is there."""
        want = podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        have = self.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag]).stdout.strip()
        if have == want:
            return
        save = subprocess.Popen(["podman", "save", tag], stdout=subprocess.PIPE)
        try:
            env = [f"{k}={v}" for k, v in self.env().items()]
            load = subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *env, "podman", "load"],
                                  stdin=save.stdout, cwd=self.home, capture_output=True)
        finally:
            save.stdout.close()
            save.wait()
        if save.returncode != 0 or load.returncode != 0:
            pytest.fail(f"podman save | podman load (as {self.name}) failed: {load.stderr.decode()[-2000:]}")

    def remove(self) -> None:
        self.run(["podman", "rm", "--all", "--force"], timeout=300)
        # what is left of the user's processes (podman's pause process, conmon): ours, by pid;
        # then userdel removes the home with the user's image storage in it
        self._kill_processes()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.created:
            if subprocess.run(["userdel", self.name], capture_output=True).returncode != 0:
                return  # the user stays, with its home: the next run's make() takes both as they are
            # the home holds the user's image storage (GBs): renamed, then deleted in the background
            gone = self.home.with_name(f"{self.home.name}.deleting-{os.getpid()}")
            self.home.rename(gone)
            subprocess.Popen(["rm", "-rf", str(gone)], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _kill_processes(self) -> None:
        """SIGKILL the user's processes until none is left (userdel refuses a user with
        processes; a stale pause process confuses rootless podman)."""
        for _ in range(50):
            ps = subprocess.run(["ps", "-o", "pid=", "-u", str(self.uid)], capture_output=True, text=True)
            if not ps.stdout.split():
                break
            for pid in ps.stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            time.sleep(0.2)
