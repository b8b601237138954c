"""Secrets never reach the terminal nor the records, whichever way an in-process step prints them (issue 36):
a real driver process, its real stdout and stderr, every file it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from schooner.cluster import ConfigError, Secret, secret_field, step
from schooner.cluster._secrets import StreamScrubber, scrub, secret_values

EXP = Path(__file__).parent / "experiments_data" / "prints_secrets.py"
LONG = "longsecretvalue123"
SHORT = "pw123"
QUOTED = "q'u\"o\\te99"


def test_every_way_an_in_process_step_prints_a_secret_is_scrubbed(tmp_path: Path) -> None:
    prefix = tmp_path / "out"
    env = {**os.environ, "T_LONG": LONG, "T_SHORT": SHORT, "T_QUOTED": QUOTED}
    done = subprocess.run(
        [sys.executable, str(EXP), str(prefix)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    terminal = done.stdout + done.stderr
    assert "ok" in done.stdout
    # Each door printed its line, scrubbed.
    for line in ("buf ***", "child ***", "short ***", "logged ***", "repr '***'", "bad *** '***'"):
        assert line in terminal, terminal
    files = {p: p.read_text(errors="replace") for p in prefix.rglob("*") if p.is_file()}
    assert any(p.name == "step.json" for p in files) and any(p.name == "history.jsonl" for p in files)
    assert any("experiments" in p.parts for p in files)
    for text in [terminal, *files.values()]:
        for secret in (LONG, SHORT, "te99", LONG[5:]):
            assert secret not in text


def test_a_secret_split_over_writes_is_still_scrubbed() -> None:
    s = StreamScrubber(["hunter22"])
    assert s.feed("pass: hunt") == "pass: "
    assert s.feed("er") == ""
    assert s.feed("22 and h") == "*** and "
    assert s.close() == "h"
    b = StreamScrubber([b"hunter22"])
    assert b.feed(b"xhunter2") + b.feed(b"2y") + b.close() == b"x***y"


def test_escaped_forms_of_a_secret_are_scrubbed() -> None:
    Secret(QUOTED)
    values = secret_values()
    assert scrub(repr(QUOTED), values) == "'***'"
    assert scrub(f'{{"k": "{QUOTED}"}}'.replace("\\", "\\\\").replace('"o', '\\"o'), values).count("***") == 1


@dataclass(frozen=True)
class Login:
    pw: str | None = secret_field(None)


def _f(config: Login, out: str) -> None:
    return None


def test_secrets_too_short_to_scrub_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="at least 4 characters"):
        Secret("pw1")
    assert Secret("").get() == "" and Secret("pw12").get() == "pw12"
    with pytest.raises(ConfigError, match=r"step 'login': secret field 'config.pw'.*at least 4 characters"):
        step("login", _f, Login("abc")).key  # noqa: B018
