#!/usr/bin/env python3
"""The emulated hardware of one sshd device: its disk and its power button (standard library only;
run by colibri_kit.sim.fleet as ``unshare -m ... python3 power.py DEV DISK_MB NAME``).

In its own mount namespace (the "hardware") it mounts the device's disk, a size-limited tmpfs at
``DEV/disk`` that no other namespace sees, then runs the operating system: a nested mount
namespace (``DEV/os.sh``: the device's mounts, ``/opt/colibri`` bound to the disk, the nvpmodel
boot, then sshd). A reboot is a file, ``DEV/power-request``, written by the device's own
``reboot`` (nvpmodel runs it after YES) or by ``Device.reboot``: every process of the OS namespace
is stopped (sshd, sessions, what they started), its mounts go with it, and a fresh OS boots on
the same disk, in the mode nvpmodel recorded. ``DEV/no-boot`` (a fault for tests) keeps the
device down after its next power-off. ``DEV/os.ns`` names the running OS's mount namespace and
``DEV/boots`` counts boots.
"""
import os
import signal
import subprocess
import sys
import time


def ns_of(pid):
    try:
        return os.readlink("/proc/%d/ns/mnt" % pid)
    except OSError:
        return None


def pin_ns(pid):
    """An open handle on pid's mount namespace, and the namespace's name ("mnt:[inode]"), or
    (None, None). While the handle is open the kernel keeps the namespace, so its inode number
    cannot be handed to a namespace made meanwhile. Processes are killed by namespace name, and a
    name freed in the middle of a kill was once taken by another device's new OS, which was then
    killed as if it were this one's (two devices rebooting in one batch, CI of 2026-12-03)."""
    try:
        fd = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY)
    except OSError:
        return None, None
    return fd, os.readlink("/proc/self/fd/%d" % fd)


def unpin(fd):
    if fd is not None:
        os.close(fd)


def pids_in(ns):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ns_of(int(entry)) == ns:
            out.append(int(entry))
    return out


def kill_ns(ns):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = pids_in(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(50):
            if not pids_in(ns):
                return
            time.sleep(0.02)


def main(argv):
    dev, disk_mb, name = argv[0], int(argv[1]), argv[2]
    disk = os.path.join(dev, "disk")
    os.makedirs(disk, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm,mode=0755" % disk_mb,
                    "colibri-" + name, disk], check=True)
    request = os.path.join(dev, "power-request")
    mine = ns_of(os.getpid())
    state = {"os": None}

    def power_off(signum, frame):
        if state["os"]:
            kill_ns(state["os"])
        sys.exit(0)

    signal.signal(signal.SIGTERM, power_off)
    boots = 0
    while True:
        if os.path.exists(request):
            os.unlink(request)
        if os.path.exists(os.path.join(dev, "no-boot")):
            print("%s: does not boot (no-boot fault)" % name, flush=True)
            while True:
                time.sleep(3600)
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "/bin/sh",
                                 os.path.join(dev, "os.sh")], stdin=subprocess.DEVNULL)
        # Until unshare has entered the OS's namespace or failed: no time bound, since a loaded
        # machine may take seconds, and an OS taken for the hardware's would never be stopped.
        while True:
            pin, ns = pin_ns(proc.pid)
            if ns and ns != mine or proc.poll() is not None:
                break
            unpin(pin)
            time.sleep(0.01)
        state["os"] = ns
        boots += 1
        with open(os.path.join(dev, "os.ns"), "w") as f:
            f.write("%s\n" % ns)
        with open(os.path.join(dev, "boots"), "w") as f:
            f.write("%d\n" % boots)
        while proc.poll() is None and not os.path.exists(request):
            time.sleep(0.1)
        rebooting = os.path.exists(request)
        if ns and ns != mine:
            kill_ns(ns)
        proc.wait()
        state["os"] = None
        unpin(pin)
        if not rebooting:
            print("%s: the OS stopped by itself: powered off" % name, flush=True)
            return 1
        print("%s: rebooting" % name, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
