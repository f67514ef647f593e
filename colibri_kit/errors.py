"""Exceptions the kit raises. Every message should tell the user what to do next.

This module imports nothing from the kit, so every module can import it. An exception that
carries a richer object lives next to that object's type (``verify.VerifyError`` holds a
``VerifyReport``, ``manifest.ManifestError``)."""

from __future__ import annotations


class KitError(Exception):
    """Base class: a failure the user can act on (printed without a traceback)."""


class ProfileError(KitError):
    """A target profile is missing, malformed or inconsistent."""


class ToolchainError(KitError):
    """A pinned toolchain cannot be installed, found or used."""


class BuildError(KitError):
    """Compiling or linking the runtime failed."""


class ModelError(KitError):
    """A model file or checkpoint is malformed or unsupported."""


class FleetError(KitError):
    """Inventory, connection or remote operation failure."""


class HostKeyError(FleetError):
    """A host key is unknown or has changed."""
