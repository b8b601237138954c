"""Helpers for the tests of the release tools (tests/test_release*.py): a throwaway clone of the repository
holding the tools as they are in the working tree, and the tools run in it as a user runs them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .workspace import ROOT

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Release Test",
    "GIT_AUTHOR_EMAIL": "release-test@example.invalid",
    "GIT_COMMITTER_NAME": "Release Test",
    "GIT_COMMITTER_EMAIL": "release-test@example.invalid",
}
OURS = ("tools", ".ci/guards.py", ".ci/run", ".pre-commit-config.yaml", "CONTRIBUTING.md")
"""The paths of the release tooling, copied from the working tree into each clone."""


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    return {**out, **GIT_IDENTITY}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=env(), capture_output=True, text=True, check=True
    ).stdout


def clone(dest: Path, root: Path = ROOT) -> Path:
    """A clone of `root`'s HEAD at `dest`, with the working tree's release tooling committed on top (so the
    tools under test are the ones being edited, and the clone's tree is clean)."""
    git(root, "clone", "-q", str(root), str(dest))
    for rel in OURS:
        src = root / rel
        if src.is_dir():
            shutil.rmtree(dest / rel, ignore_errors=True)
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    commit(dest, "tools under test", *[r for r in OURS if (dest / r).exists()])
    return dest


def commit(repo: Path, message: str, *paths: str) -> None:
    """Stage `paths` (everything when none) and commit, if anything changed."""
    git(repo, "add", "-A", "--", *(paths or ["."]))
    if git(repo, "status", "--porcelain", "--untracked-files=no"):
        git(repo, "commit", "-q", "-m", message)


def tool(repo: Path, module: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`python -m tools.MODULE ARGS` in `repo`, as a user runs it; stdout and stderr together."""
    return subprocess.run(
        [sys.executable, "-m", f"tools.{module}", *args],
        cwd=repo,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PackageIndex:
    """A local package index for tests: pypiserver (from PyPI, through `uv tool run`) serving `folder` on
    127.0.0.1, accepting uploads without authentication, and never falling back to another index."""

    def __init__(self, folder: Path, version: str = "2.4.2") -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.simple = f"{self.url}simple/"
        self.log = folder.parent / f"{folder.name}.log"
        self._cmd = [
            "uv", "tool", "run", "--from", f"pypiserver=={version}", "pypi-server", "run", "-v",
            "--interface", "127.0.0.1", "--port", str(self.port), "--authenticate", ".", "--passwords", ".",
            "--disable-fallback", str(folder),
        ]  # fmt: skip
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> PackageIndex:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            # Its own process group: `uv tool run` starts the server as a child, and both are stopped together.
            self._proc = subprocess.Popen(
                self._cmd, stdout=log, stderr=subprocess.STDOUT, env=env(), start_new_session=True
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"pypiserver exited {self._proc.returncode}: {self.log.read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(self.simple, timeout=5):
                    return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(
            f"pypiserver did not answer on {self.simple} within 120 s: {self.log.read_text()[-2000:]}"
        )

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self._proc.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # whatever of the group outlived its leader
            os.killpg(self._proc.pid, signal.SIGKILL)
