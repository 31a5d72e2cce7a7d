"""The schema version of numapin's state files, and the refusal to read a state a newer numapin wrote.

numapin's state files carry, in numapin's own field (``numapin``, which kubelet's JSON decoder ignores and its
checksum does not cover), ``schemaVersion`` (an integer) and ``writtenBy`` (the numapin release that wrote the file,
when known). A file without ``schemaVersion`` was written before versions were recorded: schema 1. The CPU state
(``allocator.checkpoint``) and the memory state (``allocator.memory.checkpoint``, kubelet's ``memory_manager_state``
layout) carry them the same way: ``schema_fields()`` into the document, ``check_schema`` on what it reads. One
version covers both files (they are written as a pair).

Bump :data:`STATE_SCHEMA_VERSION` when a release writes data an older release would misread or silently drop when it
rewrites the file (a new per-container record the allocator depends on, a changed meaning). Additions an older
release can ignore and lose without harm do not need a bump. A release reads every schema up to its own and refuses a
newer one with :class:`~allocator.errors.CheckpointError`, leaving the file untouched: rolling back past a schema
bump is refused, never guessed at.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from typing import Any

from .errors import CheckpointError

__all__ = ["SCHEMA_KEY", "STATE_SCHEMA_VERSION", "WRITTEN_BY_KEY", "check_schema", "schema_fields"]

STATE_SCHEMA_VERSION = 1
SCHEMA_KEY = "schemaVersion"
WRITTEN_BY_KEY = "writtenBy"


@functools.cache  # the installed release does not change under a running process; the look-up costs ~0.4 ms
def _release() -> str | None:
    try:
        return importlib.metadata.version("numapin")
    except importlib.metadata.PackageNotFoundError:  # numapin run from a source tree without its metadata
        return None


def schema_fields() -> dict[str, Any]:
    """What a writer adds to numapin's field: this schema version and, when known, this release."""
    release = _release()
    return {SCHEMA_KEY: STATE_SCHEMA_VERSION, **({WRITTEN_BY_KEY: release} if release else {})}


def check_schema(extra: Mapping[str, Any] | None, path: str) -> int:
    """The schema version of a state file whose numapin field is ``extra`` (None: no such field, schema 1).

    Raises CheckpointError for a malformed version and for a version newer than this release reads; the message
    names both versions and what to do.
    """
    if extra is None or SCHEMA_KEY not in extra:
        return 1
    version = extra[SCHEMA_KEY]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{path}: numapin.schemaVersion must be a positive integer, got {version!r}; "
                              f"numapin will not overwrite the file. Restore a good copy, or drain the node and "
                              f"move the file away")
    if version > STATE_SCHEMA_VERSION:
        by = extra.get(WRITTEN_BY_KEY)
        writer = f"numapin {by}" if isinstance(by, str) and by else "a newer numapin"
        this = _release()
        reader = f"numapin {this}" if this else "this numapin"
        again = f"numapin {by} (or later)" if isinstance(by, str) and by else "the release that wrote it (or later)"
        raise CheckpointError(
            f"{path} was written by {writer} (state schema {version}); {reader} reads state schema "
            f"{STATE_SCHEMA_VERSION} and older, and will neither read nor overwrite it. Install {again} again "
            f"(a rollback past a state schema change is not supported), or go back to kubelet's static policy with "
            f"that release's `numapin export-kubelet-state` (docs/node.md)"
        )
    return version
