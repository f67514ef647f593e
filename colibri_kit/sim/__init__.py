"""The emulated Jetsons the tests and ``invoke sim.up`` / ``invoke demo`` run against.

Not part of the product: nothing under ``colibri_kit/`` imports this package except
``colibri_kit/tasks/sim.py`` (the sim tasks, which the demo calls).

``modules``       per-module data in one place (identity, CPUs, clocks, power-mode tables)
``device_files``  the faked Jetson files of one module (``populate``) and the stand-in tools
``_devlib``, ``nvpmodel``, ``jetson_clocks``  the stand-ins, run on the device by python3
``enter``         run one command with a faked tree mounted at the real paths
``fleet``         ``Device`` (start/stop/reboot: a real sshd in its own mount namespace) and
                  ``EmulatedFleet`` (N devices, their keys, fleet.yaml and known_hosts)
``local``         ``LocalRemote``: the ``Remote`` protocol on this machine, files under a temp root,
                  for in-process tests without root
"""
