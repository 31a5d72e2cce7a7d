"""Shared pytest fixtures. ``sysfs_machine``: build a generated sysfs tree of a known machine (tests/fixtures)."""

from tests.fixtures.make_sysfs import sysfs_machine

__all__ = ["sysfs_machine"]
