"""Colibri fleet kit: profiles -> headers -> verified cross-builds -> models -> fleet."""

__version__ = "0.1.0"
