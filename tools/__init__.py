"""Maintainer tools of the Schooner workspace: releases, publishing, the compatibility matrix.

Run from the repository root: `uv run python -m tools.release PACKAGE PART`, `uv run python -m tools.publish
PACKAGE VERSION --publish-url URL`, `uv run python -m tools.compat [PACKAGE ...]` (CI: `.ci/guards.py compat`).
Nothing here is shipped in a wheel.
"""
