#!/usr/bin/env python3
"""Stand-in for NVIDIA's nvpmodel on an emulated Jetson (standard library only; never imports
colibri_kit: it is copied onto the emulated device as /usr/sbin/nvpmodel).

It reads the device's real-format /etc/nvpmodel.conf (colibri_kit/sim/data/nvpmodel/*.conf) and
applies a mode the way nvpmodel does: generically, from the conf's PARAM definitions (TYPE=FILE:
write the value to the path; TYPE=CLOCK: write MAX_FREQ/MIN_FREQ, -1 meaning the top of
FREQ_TABLE). Every path is the real one; COLIBRI_SIM_ROOT, when set, prefixes them all so the tool
also runs against a device tree outside a mount namespace.

Interface and strings, with their sources:
  nvpmodel -q [--verbose]     "NV Power Mode: NAME" then the id (jetson_stats' nvpmodel.py and
                              tests/nvpmodel); "NVPM WARN: fan mode is not set!" first when the
                              status file names no fan mode (jetson_stats' capture prints it; the
                              condition is this emulation's guess). --verbose adds "NVPM VERB:"
                              lines and reads "NVPM VERB: Current mode: NV Power Mode: NAME".
  nvpmodel -p --verbose       "NVPM VERB: PM_CONFIG: DEFAULT=NAME(id)", the PARAM definitions, then
                              "NVPM VERB: POWER_MODEL: ID=n NAME=x" and its lines, -1 printed as
                              2147483647 for clocks (an AGX Orin capture, jetson_stats
                              tests/nvpmodel).
  nvpmodel -m N               switch (root only). When mode N's TPC_PG_MASK differs from the GPU's
                              live mask (/sys/devices/platform/gpu.0/tpc_pg_mask; when that file is
                              absent, from the current mode's mask: jetson_stats' rule) it prints
                                NVPM WARN: Reboot required for changing to this power mode: N
                                NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:
                              and reads one line. YES/yes: the status file records N (the mode is
                              pending until the reboot applies it) and the device reboots (the
                              command in COLIBRI_SIM_REBOOT, default "reboot"). Anything else or
                              EOF: "NVPM ERROR: bad input!", "NVPM ERROR: optMask is 1, no request
                              for power mode", nothing changes, exit status 234 (a device log:
                              nvpmodel.service "exit 234" when nobody answers; 234 = -EINVAL).
  nvpmodel --sim-boot         emulation only: what L4T's nvpmodel.service does at boot, applying
                              the status file's mode (or PM_CONFIG DEFAULT) including the masks.
Messages this emulation invents (the real wording was not found) are marked "(emulated)".
"""
import os
import re
import shlex
import subprocess
import sys

SIM_ROOT = os.environ.get("COLIBRI_SIM_ROOT", "").rstrip("/")
CONF = "/etc/nvpmodel.conf"
STATUS = "/var/lib/nvpmodel/status"
LIVE_TPC_MASK = "/sys/devices/platform/gpu.0/tpc_pg_mask"
INT_MAX = 2147483647
EINVAL_EXIT = 234

_BLOCK_RE = re.compile(r"^<\s*(\w+)\s*(.*?)\s*>$")
_ATTR_RE = re.compile(r"(\w+)\s*=\s*([^\s>]+)")


def sim(path):
    # A path already under the root (a caller that maps paths itself, e.g. LocalRemote) stays.
    if SIM_ROOT and (path == SIM_ROOT or path.startswith(SIM_ROOT + "/")):
        return path
    return SIM_ROOT + path if path.startswith("/") else path


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
        f.write("%s\n" % value)


def parse_conf(text):
    """-> (params {NAME: {"type": T, "args": [(arg, path)]}}, modes [(id, name, [(p, a, v)])],
    default id)."""
    params, modes, default, cur, kind = {}, [], None, None, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _BLOCK_RE.match(line)
        if m:
            attrs = dict(_ATTR_RE.findall(m.group(2)))
            cur, kind = None, m.group(1)
            if kind == "PARAM":
                cur = params.setdefault(attrs["NAME"], {"type": attrs.get("TYPE", "FILE"),
                                                        "args": []})["args"]
            elif kind == "POWER_MODEL":
                modes.append((int(attrs["ID"]), attrs["NAME"], []))
                cur = modes[-1][2]
            elif kind == "PM_CONFIG":
                default = int(attrs["DEFAULT"])
            continue
        parts = line.split()
        if cur is None:
            continue
        if kind == "POWER_MODEL" and len(parts) == 3:
            cur.append(tuple(parts))
        elif kind == "PARAM" and len(parts) == 2:
            cur.append(tuple(parts))
    return params, modes, default


def mode_by_id(modes, mid):
    for m in modes:
        if m[0] == mid:
            return m
    return None


def mode_value(mode, param, arg):
    for p, a, v in mode[2]:
        if p == param and a == arg:
            return v
    return None


def mask_value(text):
    try:
        return int(text, 0)
    except ValueError:
        return text.strip()


def status_mode(default):
    """(mode id, fan mode or None) from the status file ("pmode:0002 fmode:quiet")."""
    text = read(STATUS, "")
    m = re.search(r"pmode:(\d+)", text)
    f = re.search(r"fmode:(\S+)", text)
    return (int(m.group(1)) if m else default), (f.group(1) if f else None)


def write_status(mid):
    _, fan = status_mode(None)
    os.makedirs(os.path.dirname(sim(STATUS)), exist_ok=True)
    write(STATUS, "pmode:%04d" % mid + (" fmode:%s" % fan if fan else ""))


def freq_table(path):
    try:
        return sorted(int(x) for x in read(path).split())
    except (OSError, ValueError):
        return []


def apply_mode(params, mode, masks, verbose):
    """Write every line of ``mode`` through its PARAM definition. ``masks`` False skips the GPU
    power-gating files (only a boot may change them)."""
    for p, a, v in mode[2]:
        definition = params.get(p)
        if definition is None:
            continue
        if not masks and p in ("TPC_POWER_GATING", "FBP_POWER_GATING", "GPU_POWER_GATING"):
            continue
        paths = dict(definition["args"])
        if definition["type"] == "CLOCK":
            target = paths.get(a)
            if target is None:
                continue
            value = int(v)
            table = freq_table(paths.get("FREQ_TABLE", "")) if "FREQ_TABLE" in paths else []
            if value < 0:
                if not table:
                    continue            # no cap and no table: leave the node alone
                value = table[-1]
            elif table and a == "MIN_FREQ":     # the kernel rounds a floor up to a step
                value = min([f for f in table if f >= value] or table[-1:])
            elif table:                          # and a cap down to one
                value = max([f for f in table if f <= value] or table[:1])
        else:
            target = paths.get(a)
            if target is None:
                continue
            value = v
        if not os.path.exists(sim(target)):
            if verbose:
                print("NVPM VERB: %s absent, skipped (emulated)" % target)
            continue
        write(target, value)
        if verbose:
            print("NVPM VERB: %s %s" % (target, value))
    online = [c for c in range(256) if os.path.exists(sim("/sys/devices/system/cpu/cpu%d" % c))
              and read("/sys/devices/system/cpu/cpu%d/online" % c, "1") == "1"]
    if online:
        write("/sys/devices/system/cpu/online", ranges(online))


def ranges(cpus):
    out, start, prev = [], None, None
    for c in cpus + [None]:
        if start is None:
            start = prev = c
        elif c is not None and c == prev + 1:
            prev = c
        else:
            out.append("%d-%d" % (start, prev) if prev != start else "%d" % start)
            start = prev = c
    return ",".join(out)


def print_parse(params, modes, default, verbose):
    print("NVPM VERB: Config file: %s" % CONF)
    print("NVPM VERB: parsing done for %s" % CONF)
    print("succeed to parse file %s." % CONF)
    if not verbose:
        return 0
    d = mode_by_id(modes, default)
    print("NVPM VERB: PM_CONFIG: DEFAULT=%s(%d)" % (d[1], d[0]))
    for name, definition in params.items():
        print("NVPM VERB: PARAM TYPE=%s NAME=%s" % (definition["type"], name))
        for arg, path in definition["args"]:
            print("NVPM VERB: %s %s" % (arg, path))
    print("NVPM VERB: ")
    for mid, name, lines in modes:
        print("NVPM VERB: POWER_MODEL: ID=%d NAME=%s" % (mid, name))
        for p, a, v in lines:
            clock = params.get(p, {}).get("type") == "CLOCK"
            print("NVPM VERB: %s %s %s" % (p, a, INT_MAX if clock and v == "-1" else v))
        print("NVPM VERB: ")
    return 0


def query(modes, default, verbose):
    mid, fan = status_mode(default)
    mode = mode_by_id(modes, mid) or mode_by_id(modes, default)
    if verbose:
        print("NVPM VERB: Config file: %s" % CONF)
        print("NVPM VERB: parsing done for %s" % CONF)
    if fan is None:
        print("NVPM WARN: fan mode is not set!")
    prefix = "NVPM VERB: Current mode: " if verbose else ""
    print("%sNV Power Mode: %s" % (prefix, mode[1]))
    print(mode[0])
    return 0


def set_mode(params, modes, default, mid, verbose):
    if os.geteuid() != 0:
        print("NVPM ERROR: failed to set power mode: need root privileges (emulated)",
              file=sys.stderr)
        return 1
    target = mode_by_id(modes, mid)
    if target is None:
        print("NVPM ERROR: Invalid power mode ID %d (emulated; ids: %s)"
              % (mid, ", ".join(str(m[0]) for m in modes)), file=sys.stderr)
        return 1
    current = mode_by_id(modes, status_mode(default)[0]) or mode_by_id(modes, default)
    live = read(LIVE_TPC_MASK, "")
    old = live if live else mode_value(current, "TPC_POWER_GATING", "TPC_PG_MASK")
    new = mode_value(target, "TPC_POWER_GATING", "TPC_PG_MASK")
    if old is not None and new is not None and mask_value(old) != mask_value(new):
        print("NVPM WARN: Reboot required for changing to this power mode: %d" % mid)
        print("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:", flush=True)
        try:
            answer = sys.stdin.readline() if sys.stdin is not None else ""
        except (OSError, ValueError):
            answer = ""
        if answer.strip() not in ("YES", "yes"):
            print("NVPM ERROR: bad input!")
            print("NVPM ERROR: optMask is 1, no request for power mode")
            return EINVAL_EXIT
        write_status(mid)
        sys.stdout.flush()
        command = shlex.split(os.environ.get("COLIBRI_SIM_REBOOT", "reboot"))
        try:
            return subprocess.call(command)
        except OSError as e:
            print("NVPM ERROR: reboot failed: %s (emulated)" % e, file=sys.stderr)
            return 1
    apply_mode(params, target, masks=False, verbose=verbose)
    write_status(mid)
    return 0


def boot(params, modes, default, verbose):
    mid, _ = status_mode(default)
    mode = mode_by_id(modes, mid) or mode_by_id(modes, default)
    apply_mode(params, mode, masks=True, verbose=verbose)
    write_status(mode[0])
    return 0


USAGE = ("usage: nvpmodel [-h] [--verbose] [-q] [-p] [-m <mode>] [-f <conf>]\n"
         "  -q query the current mode, -p parse the conf, -m switch mode, -f use another conf")


def main(argv):
    global CONF
    verbose = query_ = parse = sim_boot = False
    mode = None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--verbose":
            verbose = True
        elif a in ("-q", "--query"):
            query_ = True
        elif a in ("-p", "--parse"):
            parse = True
        elif a == "--sim-boot":
            sim_boot = True
        elif a in ("-h", "--help"):
            print(USAGE)
            return 0
        elif a in ("-m", "--mode", "-f", "--conf") and args:
            v = args.pop(0)
            if a in ("-f", "--conf"):
                CONF = v
            elif not v.isdigit():
                print("NVPM ERROR: Invalid power mode ID %s (emulated)" % v, file=sys.stderr)
                return 1
            else:
                mode = int(v)
        else:
            print("NVPM ERROR: unknown option %s (emulated)\n%s" % (a, USAGE), file=sys.stderr)
            return 1
    try:
        params, modes, default = parse_conf(read(CONF))
    except OSError:
        print("NVPM ERROR: failed to open config file %s (emulated)" % CONF, file=sys.stderr)
        return 1
    except (KeyError, ValueError) as e:
        print("NVPM ERROR: failed to parse %s: %s (emulated)" % (CONF, e), file=sys.stderr)
        return 1
    if not modes or mode_by_id(modes, default) is None:
        print("NVPM ERROR: %s has no valid PM_CONFIG DEFAULT (emulated)" % CONF, file=sys.stderr)
        return 1
    if sim_boot:
        return boot(params, modes, default, verbose)
    if mode is not None:
        return set_mode(params, modes, default, mode, verbose)
    if parse:
        return print_parse(params, modes, default, verbose)
    return query(modes, default, verbose)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(141)
