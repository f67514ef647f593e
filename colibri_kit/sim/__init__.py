"""The emulated Jetsons the tests and ``invoke sim.up`` / ``invoke demo`` run against.

Not part of the product: nothing under ``colibri_kit/`` imports this package except
``colibri_kit/tasks/sim.py`` (the sim tasks, which the demo calls).

``data/``         real-format nvpmodel confs per SKU and the SKU identity table (skus.json)
``tools/``        the stand-ins for nvpmodel and jetson_clocks (standalone python3 programs)
``device_files``  the faked Jetson files of one SKU (``populate``) with those tools installed
``power``         an sshd device's emulated hardware: its disk and its power button (reboots)
``enter``         run one command with a faked tree mounted at the real paths
``fleet``         ``Device`` (start/stop/reboot: a real sshd in its own mount namespace) and
                  ``EmulatedFleet`` (N devices, their keys, fleet.yaml and known_hosts)
``local``         ``LocalRemote``: the ``Remote`` protocol on this machine, files under a temp root,
                  for in-process tests without root
"""
