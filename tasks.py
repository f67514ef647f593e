"""Invoke entry points. Thin: each concern's tasks live in colibri_kit/tasks/<concern>.py."""

from colibri_kit.tasks import namespace

ns = namespace()
