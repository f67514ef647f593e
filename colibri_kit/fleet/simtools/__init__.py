"""Emulated Jetson device files and tool stand-ins (nvpmodel, jetson_clocks) for the simulator.

See ``device_files`` for the files and how an emulated device mounts them, ``enter`` for the
command that mounts them inside a private mount namespace.
"""
