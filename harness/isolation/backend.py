"""What the isolation wing needs of a backend: the interface, not the three implementations.

The runner and the fork servers start children for whichever backend the run chose; they see it
only through this protocol. The implementations (cpu, tpu, fake) live in `harness.config.backends`, which
builds on this wing (the fork servers' import lists, the wire format's variables), not the reverse.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Capabilities:
    devices: int
    has_xla: bool
    has_jax: bool
    slices: int = 1


class Backend(Protocol):
    name: str
    exclusive_device: bool  # one process at a time may hold the devices (TPU)

    def child_env(self, functionalization: bool) -> dict[str, str]:
        """The environment of a child that runs cases on this backend."""

    def preload(self) -> tuple[str, ...]:
        """Set-up hooks a warm child runs once before its first case."""

    def fork_imports(self, preload: bool) -> tuple[str, ...] | None:
        """What a fork server imports for this backend's children; None: exec each child fresh."""

    def capabilities(self) -> Capabilities:
        """What a case can count on; may start a probe child the first time."""
