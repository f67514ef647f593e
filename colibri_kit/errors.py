"""Exceptions the kit raises. Every message should tell the user what to do next."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colibri_kit.verify import VerifyReport


class KitError(Exception):
    """Base class: a failure the user can act on (printed without a traceback)."""


class ProfileError(KitError):
    """A target profile is missing, malformed or inconsistent."""


class ToolchainError(KitError):
    """A pinned toolchain cannot be installed, found or used."""


class BuildError(KitError):
    """Compiling or linking the runtime failed."""


class VerifyError(KitError):
    """A built artifact does not match its target profile; `report` has every check."""

    def __init__(self, message: str, report: VerifyReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class ModelError(KitError):
    """A model file or checkpoint is malformed or unsupported."""


class FleetError(KitError):
    """Inventory, connection or remote operation failure."""


class HostKeyError(FleetError):
    """A host key is unknown or has changed."""
