#!/usr/bin/env python3
"""Stand-in for NVIDIA's jetson_clocks on an emulated Jetson (standard library only; never
imports colibri_kit: it is copied onto the emulated device as /usr/bin/jetson_clocks).

It follows NVIDIA's jetson_clocks shell script (the 2015-2023 version shipped with JetPack 5/6,
read for reference): same options, messages, store-file format and exit statuses.
  jetson_clocks                  lock clocks at their maximum: every CPU's scaling_min_freq =
                                 scaling_max_freq, cpuidle states disabled, GPU railgate off and
                                 GPU min_freq = max_freq, EMC mrq_rate_locked = 1 and rate = its
                                 max (or the nvpmodel EMC cap when lower). The fan only with --fan.
  jetson_clocks --show           "SOC family:... Machine:...", online CPUs, per-CPU lines, GPU,
                                 EMC, FAN and "NV Power Mode: NAME" lines.
  jetson_clocks --store [FILE]   default ${HOME}/.jetsonclocks_conf.txt (the usage text of the
                                 same script still says ${HOME}/l4t_dfs.conf). An existing FILE:
                                 "File FILE already exists. Can I overwrite it? Y/N:" and one
                                 line from stdin; y/Y overwrites, anything else (EOF too) prints
                                 "Error: file FILE already exists!" and exits 1. Then "Storing
                                 system configuration in FILE" and one "path:value" line per
                                 stored node (CPU online, scaling_min_freq, cpuidle disable, GPU
                                 min_freq and railgate_enable, EMC mrq_rate_locked, the fan status
                                 file).
  jetson_clocks --restore [FILE] "Error: FILE file not found !" and exit 1 when absent; otherwise
                                 "Restoring system configuration from FILE", each line written
                                 back; a line that cannot be written prints "Error: Failed to
                                 restore PATH" and the run still exits 0 (as the script does).
The script must run as root: "Error: Run this script(NAME) as a root user", exit 1.

GPU nodes: every /sys/class/devfreq node whose device/of_node/name (or compatible) names a GPU,
as jetson_stats (jtop) finds them ({gv11b, gp10b, ga10b, gb10b, gpu}); node names
17000000.gpu / .ga10b / .gv11b and gpu-gpc-N / gpu-nvd-N when the tree has no of_node. Thor's
two domains (gpu-gpc-0, gpu-nvd-0) are both locked.

COLIBRI_SIM_ROOT, when set, prefixes every device path (also an absolute FILE argument); the
paths written into the store file are the real ones.
"""
import glob
import os
import re
import sys

SIM_ROOT = os.environ.get("COLIBRI_SIM_ROOT", "").rstrip("/")
NAME = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "jetson_clocks"
HOME = os.environ.get("HOME", "/root")
CPU = "/sys/devices/system/cpu"
DEVFREQ = "/sys/class/devfreq"
GPU_RAIL_GATE = "/sys/devices/platform/gpu.0/railgate_enable"
EMC = "/sys/kernel/debug/bpmp/debug/clk/emc"
EMC_ISO_CAP = "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap"
FAN_GLOBS = ("/sys/devices/platform/pwm-fan*/hwmon/hwmon*/pwm*",)
NVPMODEL_CONF = "/etc/nvpmodel.conf"
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
GPU_OF_NAMES = {"gv11b", "gp10b", "ga10b", "gb10b", "gpu"}
GPU_NODE_RE = re.compile(r"^(?:[0-9a-f]+\.(?:gpu|gv11b|ga10b|gp10b|gb10b)|gpu-(?:gpc|nvd)-\d+)$")


def sim(path):
    # A path already under the root (a caller that maps paths itself, e.g. LocalRemote) stays.
    if SIM_ROOT and (path == SIM_ROOT or path.startswith(SIM_ROOT + "/")):
        return path
    return SIM_ROOT + path if path.startswith("/") else path


def real(path):
    return path[len(SIM_ROOT):] if SIM_ROOT and path.startswith(SIM_ROOT + "/") else path


def read(path, default=None):
    try:
        with open(sim(path), "rb") as f:
            return f.read().decode("utf-8", "replace").replace("\0", "").strip()
    except OSError:
        if default is None:
            raise
        return default


def write(path, value):
    with open(sim(path), "w") as f:
        f.write("%s\n" % value)


def exists(path):
    return os.path.exists(sim(path))


def globbed(pattern):
    return [real(p) for p in sorted(glob.glob(sim(pattern)), key=_natural)]


def _natural(path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def cpus():
    return globbed(CPU + "/cpu[0-9]*")


def gpu_nodes():
    nodes = []
    for node in globbed(DEVFREQ + "/*"):
        of = node + "/device/of_node"
        names = {read(of + "/name", ""), read(of + "/compatible", "").split(",")[-1]}
        if names & GPU_OF_NAMES or GPU_NODE_RE.match(os.path.basename(node)):
            nodes.append(node)
    return nodes


def soc_and_machine():
    compatible = read("/proc/device-tree/compatible", "") or \
        read("/sys/firmware/devicetree/base/compatible", "")
    model = read("/proc/device-tree/model", "") or read("/sys/firmware/devicetree/base/model", "")
    m = re.search(r"nvidia,(tegra\d+)", compatible)
    return (m.group(1) if m else ""), model


class Store(object):
    def __init__(self, path):
        self.path = path
        self.lines = []

    def add(self, node):
        if exists(node):
            self.lines.append("%s:%s" % (node, read(node, "")))

    def save(self):
        # The script appends line by line with `>>`: an unwritable file costs a shell error per
        # line on stderr and the run still exits 0.
        try:
            with open(sim(self.path), "a") as f:
                for line in self.lines:
                    f.write(line + "\n")
        except OSError as e:
            print("%s: %s: %s" % (NAME, self.path, e.strerror), file=sys.stderr)


def do_hotplug(action, store):
    if action == "show":
        print("Online CPUs: %s" % read(CPU + "/online", ""))
    elif action == "store":
        for cpu in cpus():
            store.add(cpu + "/online")


def do_cpu(action, store):
    if not exists(CPU + "/cpu0/cpuidle"):
        print("WARNING! CPUIDLE is not supported!")
    if not exists(CPU + "/cpu0/cpufreq"):
        print("WARNING! CPUFREQ is not supported!")
    for cpu in cpus():
        fq = cpu + "/cpufreq"
        idles = globbed(cpu + "/cpuidle/state[0-9]*")
        if action == "show":
            if exists(fq + "/scaling_governor"):
                states = "".join("%s=%d " % (read(s + "/name", "?"),
                                             read(s + "/disable", "0") == "0") for s in idles)
                print("%s: Online=%s Governor=%s MinFreq=%s MaxFreq=%s CurrentFreq=%s "
                      "IdleStates: %s" % (os.path.basename(cpu), read(cpu + "/online", "1"),
                                          read(fq + "/scaling_governor"),
                                          read(fq + "/scaling_min_freq"),
                                          read(fq + "/scaling_max_freq"),
                                          read(fq + "/scaling_cur_freq", "?"), states))
        elif action == "store":
            store.add(fq + "/scaling_min_freq")
            for s in idles:
                store.add(s + "/disable")
        else:
            if exists(fq + "/scaling_max_freq"):
                try:
                    write(fq + "/scaling_min_freq", read(fq + "/scaling_max_freq"))
                except OSError:
                    pass
            for s in idles:
                write(s + "/disable", 1)


def do_gpu(action, store):
    nodes = gpu_nodes()
    if not nodes:
        print("Error! GPU frequency scaling not supported!")
        sys.exit(1)
    if action == "store":
        for node in nodes:
            store.add(node + "/min_freq")
        store.add(GPU_RAIL_GATE)
        return
    for node in nodes:
        if action == "show":
            label = "GPU" if len(nodes) == 1 else "GPU %s" % os.path.basename(node)
            print("%s MinFreq=%s MaxFreq=%s CurrentFreq=%s" % (
                label, read(node + "/min_freq"), read(node + "/max_freq"),
                read(node + "/cur_freq", "?")))
        else:
            if exists(GPU_RAIL_GATE):
                write(GPU_RAIL_GATE, 0)
            try:
                write(node + "/min_freq", read(node + "/max_freq"))
            except OSError:
                print("Error: Failed to max GPU frequency!")


def do_emc(action, store):
    if not exists(EMC + "/max_rate"):
        return
    top = EMC + "/max_rate"
    cap = int(read(EMC_ISO_CAP, "0") or 0)
    if 0 < cap < int(read(top)):
        top = EMC_ISO_CAP
    if action == "show":
        print("EMC MinFreq=%s MaxFreq=%s CurrentFreq=%s FreqOverride=%s" % (
            read(EMC + "/min_rate"), read(top), read(EMC + "/rate"),
            read(EMC + "/mrq_rate_locked")))
    elif action == "store":
        store.add(EMC + "/mrq_rate_locked")
    else:
        write(EMC + "/mrq_rate_locked", 1)
        write(EMC + "/rate", read(top))


def fan_nodes():
    out = []
    for pattern in FAN_GLOBS:
        out += globbed(pattern)
    return [n for n in out if re.search(r"/pwm\d+$", n)]


def do_fan(action, store, fan_override):
    status_file = os.path.join(HOME, ".jetsonclocks_fan.txt")
    active = "active" if exists("/run/nvfancontrol.active") else "inactive"
    if action == "show":
        for node in fan_nodes():
            hwmon = os.path.basename(os.path.dirname(node))
            print("FAN Dynamic Speed control=%s %s_%s=%s" % (
                active, hwmon, os.path.basename(node), read(node)))
    elif action == "store":
        try:
            write(status_file, active)
        except OSError as e:    # the script's `echo > file` fails the same way and goes on
            print("%s: %s: %s" % (NAME, status_file, e.strerror), file=sys.stderr)
        store.add(status_file)
    elif fan_override:
        for node in fan_nodes():
            write(node, 255)


def do_nvpmodel(action):
    if action != "show" or not exists(NVPMODEL_CONF):
        return
    # The script prints `nvpmodel -q | grep "NV Power Mode"`; this reads the same two files.
    conf = read(NVPMODEL_CONF)
    names = dict((int(i), n) for i, n in
                 re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\w+)\s*>", conf))
    default = re.search(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", conf)
    m = re.search(r"pmode:(\d+)", read(NVPMODEL_STATUS, ""))
    mid = int(m.group(1)) if m else (int(default.group(1)) if default else None)
    if mid in names:
        print("NV Power Mode: %s" % names[mid])


def store_action(path):
    if exists(path):
        print("File %s already exists. Can I overwrite it? Y/N:" % path, flush=True)
        try:
            answer = sys.stdin.readline() if sys.stdin is not None else ""
        except (OSError, ValueError):
            answer = ""
        if answer.strip() not in ("y", "Y"):
            print("Error: file %s already exists!" % path)
            return 1
        os.remove(sim(path))
    print("Storing system configuration in %s" % path)
    return None


_SAFE_RE = re.compile(r"^/sys/[A-Za-z0-9@._/+-]+$")
_ONLINE_RE = re.compile(r"^/sys/devices/system/cpu/cpu\d+/online$"
                        r"|^/sys/kernel/debug/clk/override.*/state$")
_MIN_FREQ_RE = re.compile(r"^/sys/devices/system/cpu/cpu\d+/cpufreq/scaling_min_freq$")


def restore(path):
    """The script's restore(): ``for conf in $(cat FILE)``, path before the first ':' and the
    value after it; CPU online / clock override state written only when different, CPU
    scaling_min_freq errors ignored, any other failure reported and the run goes on."""
    with open(sim(path)) as f:
        tokens = f.read().split()
    for conf in tokens:
        node, _, data = conf.partition(":")
        if node.endswith("/.jetsonclocks_fan.txt"):
            continue   # fan_restore starts/stops the nvfancontrol service: none on this device
        # The real script writes wherever the file says; the emulation keeps to /sys so a store
        # file cannot reach outside the device tree.
        safe = bool(_SAFE_RE.match(node)) and ".." not in node.split("/")
        if safe and _ONLINE_RE.match(node):
            if exists(node) and read(node, "") != data:
                _write_quiet(node, data)
        elif safe and _MIN_FREQ_RE.match(node):
            _write_quiet(node, data)
        elif not (safe and exists(node) and _write_quiet(node, data)):
            print("Error: Failed to restore %s" % node)
    return 0


def _write_quiet(node, data):
    if not exists(node):
        return False     # sysfs never creates a node
    try:
        write(node, data)
        return True
    except OSError:
        return False


USAGE = """Maximize jetson performance by setting static max frequency to CPU, GPU and EMC clocks.
Usage:
%s [options]
  options,
  --help, -h         show this help message
  --show             display current settings
  --fan              set PWM fan speed to maximal
  --store [file]     store current settings to a file (default: ${HOME}/l4t_dfs.conf)
  --restore [file]   restore saved settings from a file (default: ${HOME}/l4t_dfs.conf)
  run %s without any option to set static max frequency to CPU, GPU and EMC clocks."""


def main(argv):
    action, fan_override = "max", False
    conf_file = os.path.join(HOME, ".jetsonclocks_conf.txt")
    soc, machine = soc_and_machine()
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--show":
            print("SOC family:%s  Machine:%s" % (soc, machine))
            action = "show"
        elif a in ("--store", "--restore"):
            # `[ -n "$2" ] && CONF_FILE=$2; shift 1`: the next word is the file, whatever it is.
            if args:
                nxt = args.pop(0)
                if nxt:
                    conf_file = nxt
            action = a[2:]
        elif a == "--fan":
            fan_override = True
        elif a in ("-h", "--help"):
            print(USAGE % (NAME, NAME), file=sys.stderr)
            return 0
        else:
            print("Unknown option: %s" % a)
            print(USAGE % (NAME, NAME), file=sys.stderr)
            return 1
    if os.geteuid() != 0:
        print("Error: Run this script(%s) as a root user" % sys.argv[0])
        return 1
    store = None
    if action == "store":
        code = store_action(conf_file)
        if code is not None:
            return code
        store = Store(conf_file)
    elif action == "restore":
        if not exists(conf_file):
            print("Error: %s file not found !" % conf_file)
            return 1
        print("Restoring system configuration from %s" % conf_file)
        return restore(conf_file)
    do_hotplug(action, store)
    do_cpu(action, store)
    do_gpu(action, store)
    do_emc(action, store)
    do_fan(action, store, fan_override)
    do_nvpmodel(action)
    if store is not None:
        store.save()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(141)
