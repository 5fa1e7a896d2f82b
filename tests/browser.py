"""Debian's chromium driven by Playwright (no browser download): the one launch of the browser
tests (tests/conftest.py ``browser`` fixture)."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
# no background networking: this machine's closed network refuses those connections
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
