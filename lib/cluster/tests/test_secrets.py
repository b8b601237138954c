"""Secret detection and scrubbing."""

from __future__ import annotations

import pytest

from schooner.cluster import is_secret_name, redact_env
from schooner.cluster._secrets import REDACTED, scrub, secret_values


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "OPENAI_APIKEY",
        "DB_PASSWORD",
        "GCP_CREDENTIALS",
        "GITHUB_AUTH",
        "SSH_PRIVATE_KEY",
        "MY_KEY",
        "hf_token",
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["PATH", "HOME", "CUDA_VISIBLE_DEVICES", "KEYBOARD_LAYOUT", "JAX_PLATFORMS", "MONKEY_COUNT"]
)
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_redact_env_keeps_ordinary_values():
    assert redact_env({"HF_TOKEN": "hf_x", "PATH": "/bin"}) == {"HF_TOKEN": REDACTED, "PATH": "/bin"}


def test_scrub_replaces_every_occurrence_longest_first():
    env = {"A_TOKEN": "abcdef123456", "B_TOKEN": "abcdef", "SHORT_TOKEN": "abc", "PLAIN": "abcdef123456789"}
    values = secret_values(env)
    assert values == [
        "abcdef123456",
        "abcdef",
    ]  # too-short values are not scrubbed (they would eat ordinary text)
    assert scrub("x=abcdef123456 y=abcdef z=abc", values) == "x=*** y=*** z=abc"


def test_scrub_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("SCHOONER_TEST_SESSION_KEY", "s3cr3t-value-xyz")
    assert scrub("token s3cr3t-value-xyz here") == "token *** here"
