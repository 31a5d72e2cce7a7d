"""Byte quantities as kubelet prints them in its reserved-memory errors (``resource.Quantity.String()``).

A quantity keeps the format of the text it was parsed from: binary SI (``Ki`` .. ``Ei``) or decimal (a plain
number, ``k`` .. ``E``). A sum starting from zero takes the format of its first non-zero addend, as
``Quantity.Add`` does. Printing is canonical: binary values as the largest power of 1024 dividing them (``1Gi``,
``16484Mi``; below 1024 as a plain number), decimal values as the largest power of 1000 (``1500M``, ``100k``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, PodSpecError
from ..quantity import parse_quantity

__all__ = ["ByteQuantity", "parse_bytes"]

_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = ("", "k", "M", "G", "T", "P", "E")


@dataclass(frozen=True, slots=True)
class ByteQuantity:
    value: int
    binary: bool = False

    def __add__(self, other: ByteQuantity) -> ByteQuantity:
        binary = other.binary if self.value == 0 else self.binary
        return ByteQuantity(self.value + other.value, binary)

    def __str__(self) -> str:
        v = self.value
        if v == 0:
            return "0"
        if self.binary and abs(v) >= 1024:
            exp = 0
            while v % 1024 == 0 and exp < len(_BINARY) - 1:
                v //= 1024
                exp += 1
            return f"{v}{_BINARY[exp]}"
        exp = 0
        while v % 10 == 0:
            v //= 10
            exp += 1
        v *= 10 ** (exp % 3)
        exp -= exp % 3
        if exp // 3 < len(_DECIMAL):
            return f"{v}{_DECIMAL[exp // 3]}"
        return f"{v}e{exp}"


def parse_bytes(text: str, where: str) -> ByteQuantity:
    """A whole number of bytes from a Kubernetes quantity; ConfigError naming ``where`` otherwise."""
    try:
        q = parse_quantity(text.strip())
    except PodSpecError as e:
        raise ConfigError(f"{where}: {e}") from None
    if q < 0:
        raise ConfigError(f"{where}: {text!r} must not be negative")
    if q.denominator != 1:
        raise ConfigError(f"{where}: could not covert a variable of type Quantity to int64 ({text!r} is not a whole "
                          f"number of bytes)")
    return ByteQuantity(int(q), text.strip().endswith("i"))
