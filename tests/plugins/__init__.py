"""Formats that exist only in the tests (to prove what adding a format takes)."""
