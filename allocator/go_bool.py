"""Go's ``strconv.ParseBool``, the one place its spellings are defined (kubelet parses boolean options with it)."""

from __future__ import annotations

__all__ = ["FALSE_SPELLINGS", "TRUE_SPELLINGS", "parse_go_bool"]

TRUE_SPELLINGS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE_SPELLINGS = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(value: object) -> bool | None:
    """True or False for Go's spellings (a real boolean, e.g. from YAML, is itself); None for anything else.

    Callers turn None into an error that names their field."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in TRUE_SPELLINGS:
            return True
        if value in FALSE_SPELLINGS:
            return False
    return None
