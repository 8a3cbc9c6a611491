"""SubZero's version: the one this source says, and the one installed."""

from __future__ import annotations

__version__ = "0.1.0"


def installed_version() -> str:
    """The installed package's version (this source's when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("subzero-lineage")
    except PackageNotFoundError:
        return __version__
