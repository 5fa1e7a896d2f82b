"""Typed export options: one frozen record per format, parsed once from its config section.

A format's options are a frozen dataclass deriving from ``FormatOptions``. Its ``parse`` reads
the section ``export.formats.<name>`` (config.py hands over the mapping and where it sits) and
refuses a bad value or an unknown key with a ConfigError naming the key; its exporter's
constructor takes the record (``Exporter(options)``), so no option travels as a loose keyword.
A format without options uses ``NoOptions``, whose section takes no key.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Self

from ...errors import ConfigError


@dataclass(frozen=True)
class FormatOptions:
    """The base of every format's options record; as it stands, the record of no options."""

    @classmethod
    def parse(cls, section: Mapping[str, object], where: str) -> Self:
        """The record from the config section at ``where`` (e.g. ``export.formats.hdf5``)."""
        keys(section, where, ())
        return cls()


@dataclass(frozen=True)
class NoOptions(FormatOptions):
    """The shared options record of a format that has none."""


NO_OPTIONS = NoOptions()


def keys(section: object, where: str, allowed: Collection[str]) -> Mapping[str, object]:
    """``section`` as a mapping whose keys are all ``allowed``; else a ConfigError listing them."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    unknown = set(section) - set(allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    return section


def choice(section: Mapping[str, object], key: str, choices: tuple[str, ...], where: str) -> str:
    """``section[key]`` (the first choice when absent), one of ``choices``."""
    value = section.get(key, choices[0])
    if not isinstance(value, str) or value not in choices:
        spelled = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ConfigError(f"{where}.{key} must be {spelled}, got {value!r}")
    return value


def number(section: Mapping[str, object], key: str, default: float, where: str) -> float:
    """``section[key]`` as a float (``default`` when absent); a bool or text is refused."""
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def whole(section: Mapping[str, object], key: str, default: int, where: str) -> int:
    """``section[key]`` as an int (``default`` when absent); a bool, float or text is refused."""
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key} must be a whole number, got {value!r}")
    return value


def flag(section: Mapping[str, object], key: str, default: bool, where: str) -> bool:
    """``section[key]`` as true or false (``default`` when absent)."""
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false, got {value!r}")
    return value
