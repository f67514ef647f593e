# Shared core of the emulated Jetson tools (nvpmodel, jetson_clocks stand-ins).
#
# Standard library only: device_files.populate() inlines this file into each installed stand-in
# so the tools run on an emulated device with nothing but python3, reading and writing only the
# faked files at their real paths (/sys/..., /etc/..., /var/lib/nvpmodel/...). COLIBRI_SIM_ROOT,
# when set, prefixes every path so the tools can also run against a tree outside a namespace.
import glob
import os
import re
import sys

SIM_ROOT = os.environ.get("COLIBRI_SIM_ROOT", "").rstrip("/")
CPU_DIR = "/sys/devices/system/cpu"
DEVFREQ_DIR = "/sys/class/devfreq"
GPU_NODE_RE = re.compile(r"^(?:[0-9a-f]+\.(?:gpu|gv11b|ga10b|gp10b)|gpu-gpc-[0-9]+)$")
EMC_DIR = "/sys/kernel/debug/bpmp/debug/clk/emc"
EMC_CAP = "/sys/kernel/nvpmodel_emc_cap/emc_iso_cap"
FAN_PWM = "/sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1"
NVPMODEL_CONF = "/etc/nvpmodel.conf"
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
MODEL_FILE = "/sys/firmware/devicetree/base/model"
COMPATIBLE_FILE = "/sys/firmware/devicetree/base/compatible"


def sim(path):
    """The file that stands for the real absolute path."""
    return SIM_ROOT + path


def read(path, default=None):
    try:
        with open(sim(path)) as f:
            return f.read().strip()
    except OSError:
        if default is None:
            raise
        return default


def write(path, value):
    with open(sim(path), "w") as f:
        f.write(f"{value}\n")


def parse_ranges(text):
    """'0-3,6' -> [0, 1, 2, 3, 6] (the kernel's cpu list format)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def format_ranges(cpus):
    parts, start, prev = [], None, None
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def all_cpus():
    return parse_ranges(read(CPU_DIR + "/present"))


def online_cpus():
    return parse_ranges(read(CPU_DIR + "/online"))


def cpufreq(cpu, name):
    return f"{CPU_DIR}/cpu{cpu}/cpufreq/{name}"


def gpu_devfreq():
    """The GPU's devfreq directory (by its class link), or None."""
    for path in sorted(glob.glob(sim(DEVFREQ_DIR) + "/*")):
        name = os.path.basename(path)
        if GPU_NODE_RE.match(name):
            return f"{DEVFREQ_DIR}/{name}"
    return None


def settle():
    """Stand in for the kernel: current clocks follow governor and min/max limits."""
    for cpu in online_cpus():
        gov = read(cpufreq(cpu, "scaling_governor"))
        lo = int(read(cpufreq(cpu, "scaling_min_freq")))
        hi = int(read(cpufreq(cpu, "scaling_max_freq")))
        write(cpufreq(cpu, "scaling_cur_freq"), hi if gov == "performance" else lo)
    gpu = gpu_devfreq()
    if gpu:
        gov = read(gpu + "/governor")
        lo, hi = int(read(gpu + "/min_freq")), int(read(gpu + "/max_freq"))
        write(gpu + "/cur_freq", hi if gov == "performance" else lo)
    if os.path.exists(sim(EMC_DIR + "/rate")):
        locked = read(EMC_DIR + "/mrq_rate_locked") == "1"
        cap = int(read(EMC_CAP, "0"))
        top = int(read(EMC_DIR + "/max_rate"))
        if cap:
            top = min(top, cap)
        write(EMC_DIR + "/rate", top if locked else int(read(EMC_DIR + "/min_rate")))


# ----------------------------------------------------------------------------- nvpmodel.conf

_BLOCK_RE = re.compile(r"^<\s*(\w+)\s+(.*?)\s*>$")
_ATTR_RE = re.compile(r"(\w+)=(\S+)")


def parse_conf(text):
    """-> (modes {id: {"name": str, "lines": [(a, b, c)]}}, default id)."""
    modes, default, cur = {}, None, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _BLOCK_RE.match(line)
        if m:
            attrs = dict(_ATTR_RE.findall(m.group(2)))
            cur = None
            if m.group(1) == "POWER_MODEL":
                cur = {"name": attrs["NAME"], "lines": []}
                modes[int(attrs["ID"])] = cur
            elif m.group(1) == "PM_CONFIG":
                default = int(attrs["DEFAULT"])
            continue
        if cur is not None:
            parts = line.split()
            if len(parts) == 3:
                cur["lines"].append(tuple(parts))
    return modes, default


def load_conf():
    return parse_conf(read(NVPMODEL_CONF))


def current_mode(modes, default):
    status = read(NVPMODEL_STATUS, "")
    m = re.search(r"pmode:(\d+)", status)
    return int(m.group(1)) if m else default


def mode_param(mode, key, arg):
    for a, b, c in mode["lines"]:
        if a == key and b == arg:
            return c
    return None


def apply_mode(mode_id, mode):
    """Set online CPUs and clock caps as the mode says, then record it."""
    present = all_cpus()
    online = []
    for cpu in present:
        flag = mode_param(mode, "CPU_ONLINE", f"CORE_{cpu}") or "1"
        write(f"{CPU_DIR}/cpu{cpu}/online", flag)
        if flag == "1":
            online.append(cpu)
    write(CPU_DIR + "/online", format_ranges(online))
    cpu_max = int(mode_param(mode, "CPU", "MAX_FREQ") or -1)
    for cpu in present:
        top = int(read(cpufreq(cpu, "cpuinfo_max_freq")))
        low = read(cpufreq(cpu, "cpuinfo_min_freq"))
        if cpu not in online:
            # An offline CPU's policy goes back to its hardware limits: deterministic, so a
            # tune/restore round trip leaves the same bytes whatever happened while it was up.
            write(cpufreq(cpu, "scaling_cur_freq"), low)
        elif cpu_max >= 0:
            top = min(top, cpu_max)
        write(cpufreq(cpu, "scaling_max_freq"), top)
        write(cpufreq(cpu, "scaling_min_freq"), low)
    gpu = gpu_devfreq()
    if gpu:
        freqs = [int(f) for f in read(gpu + "/available_frequencies").split()]
        gpu_max = int(mode_param(mode, "GPU", "MAX_FREQ") or -1)
        write(gpu + "/max_freq", max(freqs) if gpu_max < 0 else min(max(freqs), gpu_max))
        write(gpu + "/min_freq", min(freqs))
    if os.path.exists(sim(EMC_CAP)):
        write(EMC_CAP, int(mode_param(mode, "EMC", "MAX_FREQ") or 0))
    write(NVPMODEL_STATUS, f"pmode:{mode_id:04d}")
    settle()


def fail(msg, code=1):
    print(msg, file=sys.stderr)
    sys.exit(code)


def run_tool(main):
    """A stand-in's entry point: exit codes as a shell tool's (Ctrl-C 130, a closed pipe 141)."""
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # output cut short by the reader (| head)
        sys.exit(141)
