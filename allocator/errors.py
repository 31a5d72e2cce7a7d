"""Errors raised by the allocator. Every message is meant to be shown to an operator as is."""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = [
    "AdmitReason",
    "AllocationError",
    "AllocatorError",
    "CheckpointError",
    "ConfigError",
    "PodSpecError",
    "SMTAlignmentError",
    "TopologyAffinityError",
    "TopologyError",
]


# why kubelet's admission refuses a pod (its PodAdmitResult reasons)
AdmitReason = Literal["TopologyAffinityError", "SMTAlignmentError", "UnexpectedAdmissionError"]


class AllocatorError(Exception):
    """Base class of every error the allocator raises on purpose."""


class TopologyError(AllocatorError, ValueError):
    """A topology (sysfs tree or JSON document) is malformed or inconsistent."""


class ConfigError(AllocatorError, ValueError):
    """A policy configuration is invalid (unknown option, forbidden combination, bad reserved CPUs)."""


class PodSpecError(AllocatorError, ValueError):
    """A pod (or the numapin intent annotation) cannot be understood: bad quantity, bad annotation value."""


class CheckpointError(AllocatorError):
    """A state file is corrupt, fails its checksum, or belongs to another policy. Never overwritten silently."""


class AllocationError(AllocatorError):
    """CPUs could not be allocated (not enough free CPUs, invalid request). kubelet's UnexpectedAdmissionError."""

    reason: ClassVar[AdmitReason] = "UnexpectedAdmissionError"


class SMTAlignmentError(AllocationError):
    """``full-pcpus-only``: the request is not a multiple of the SMT width or whole cores are not free."""

    reason: ClassVar[AdmitReason] = "SMTAlignmentError"

    def __init__(self, requested: int, cpus_per_core: int, available_physical_cpus: int = 0,
                 cause: str = "") -> None:
        self.requested = requested
        self.cpus_per_core = cpus_per_core
        self.available_physical_cpus = available_physical_cpus
        self.cause = cause
        if cause == "not enough free physical CPUs":
            msg = (f"SMT Alignment Error: not enough free physical CPUs: available physical CPUs = "
                   f"{available_physical_cpus}, requested CPUs = {requested}, CPUs per core = {cpus_per_core}")
        else:
            msg = f"SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {cpus_per_core}"
        super().__init__(msg)


class TopologyAffinityError(AllocatorError):
    """The topology manager policy cannot align the pod's resources (kubelet's TopologyAffinityError)."""

    reason: ClassVar[AdmitReason] = "TopologyAffinityError"
