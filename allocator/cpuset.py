"""Immutable sets of CPU (or NUMA node) ids in the Linux cpu-list format.

A CPUSet is backed by one Python int used as a bitmask: union, intersection and
difference are single big-int operations, length is a popcount, and equal sets
have equal masks, so sets are cheap to hash and compare. The same type is used
for NUMA node sets (``cpuset.mems``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["CPUSet"]


class CPUSet:
    """An immutable set of non-negative integer ids, printed as ``0-3,8``."""

    __slots__ = ("_mask",)
    _mask: int

    def __init__(self, ids: Iterable[int] = ()) -> None:
        mask = 0
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"CPU ids must be integers, got {i!r}")
            if i < 0:
                raise ValueError(f"CPU ids must be non-negative, got {i}")
            mask |= 1 << i
        object.__setattr__(self, "_mask", mask)

    # -- construction -------------------------------------------------------
    @classmethod
    def from_mask(cls, mask: int) -> CPUSet:
        if mask < 0:
            raise ValueError(f"a CPU mask must be non-negative, got {mask}")
        s = object.__new__(cls)
        object.__setattr__(s, "_mask", mask)
        return s

    @classmethod
    def range(cls, first: int, last: int) -> CPUSet:
        """The ids ``first..last`` inclusive."""
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {first}-{last}")
        return cls.from_mask(((1 << (last - first + 1)) - 1) << first)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse the Linux cpu-list format (``0-3,8,10-11``); surrounding white space is ignored.

        Raises ValueError quoting the input for anything else (``3-1``, ``a``, ``1,,2``, ``-1``).
        """
        if not isinstance(text, str):
            raise TypeError(f"cpu-list must be a string, got {type(text).__name__}")
        s = text.strip()
        if not s:
            return _EMPTY
        mask = 0
        for part in s.split(","):
            lo_s, sep, hi_s = part.partition("-")
            if not _is_uint(lo_s) or (sep and not _is_uint(hi_s)):
                raise ValueError(f"invalid cpu-list {text!r}: bad element {part!r}")
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
            if hi < lo:
                raise ValueError(f"invalid cpu-list {text!r}: range {part!r} is reversed")
            if hi > _MAX_ID:
                raise ValueError(f"invalid cpu-list {text!r}: id {hi} is too large")
            mask |= ((1 << (hi - lo + 1)) - 1) << lo
        return cls.from_mask(mask)

    # -- views ----------------------------------------------------------------
    @property
    def mask(self) -> int:
        return self._mask

    def __len__(self) -> int:
        return self._mask.bit_count()

    def __bool__(self) -> bool:
        return self._mask != 0

    def __iter__(self) -> Iterator[int]:
        m = self._mask
        while m:
            low = m & -m
            yield low.bit_length() - 1
            m ^= low

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and cpu >= 0 and bool(self._mask >> cpu & 1)

    def sorted(self) -> list[int]:
        return list(self)

    def min(self) -> int:
        if not self._mask:
            raise ValueError("min() of an empty CPUSet")
        return (self._mask & -self._mask).bit_length() - 1

    def max(self) -> int:
        if not self._mask:
            raise ValueError("max() of an empty CPUSet")
        return self._mask.bit_length() - 1

    def is_empty(self) -> bool:
        return self._mask == 0

    # -- algebra ----------------------------------------------------------------
    def __or__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask | _mask_of(other))

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask & _mask_of(other))

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask & ~_mask_of(other))

    def __xor__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask ^ _mask_of(other))

    union = __or__
    intersection = __and__
    difference = __sub__

    def issubset(self, other: CPUSet) -> bool:
        return self._mask & ~_mask_of(other) == 0

    def issuperset(self, other: CPUSet) -> bool:
        return _mask_of(other) & ~self._mask == 0

    def isdisjoint(self, other: CPUSet) -> bool:
        return self._mask & _mask_of(other) == 0

    __le__ = issubset
    __ge__ = issuperset

    def __lt__(self, other: CPUSet) -> bool:
        return self.issubset(other) and self._mask != _mask_of(other)

    def __gt__(self, other: CPUSet) -> bool:
        return self.issuperset(other) and self._mask != _mask_of(other)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUSet) and self._mask == other._mask

    def __hash__(self) -> int:
        return hash(("CPUSet", self._mask))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (CPUSet.from_mask, (self._mask,))

    # -- printing -----------------------------------------------------------------
    def __str__(self) -> str:
        """Canonical Linux cpu-list: ascending, ranges of 2+ contiguous ids collapsed (``0-3,8``)."""
        out: list[str] = []
        m = self._mask
        base = 0
        while m:
            # skip zeros
            tz = (m & -m).bit_length() - 1
            m >>= tz
            base += tz
            # count ones
            run = (~m & (m + 1)).bit_length() - 1
            lo, hi = base, base + run - 1
            out.append(str(lo) if lo == hi else f"{lo}-{hi}")
            m >>= run
            base += run
        return ",".join(out)

    def __repr__(self) -> str:
        return f"CPUSet({str(self)!r})"


_MAX_ID = 1 << 20


def _is_uint(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _mask_of(other: object) -> int:
    if isinstance(other, CPUSet):
        return other._mask
    raise TypeError(f"expected a CPUSet, got {type(other).__name__}")


_EMPTY = CPUSet.from_mask(0)
