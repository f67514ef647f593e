from colibri_kit.sim._devlib import *  # noqa: F401,F403  (inlined when installed)

# Stand-in for NVIDIA's nvpmodel on an emulated Jetson. Same interface and quirks as the real tool:
#   nvpmodel -q [--verbose]   "NV Power Mode: NAME" then the id
#   nvpmodel -p --verbose     the power models of /etc/nvpmodel.conf ("POWER_MODEL: ID=n NAME=x")
#   nvpmodel -m N             switch mode (root only); a switch that changes the GPU TPC
#                             power-gating mask needs a reboot: it warns and waits for YES on stdin.
#                             Without YES (EOF, closed stdin, anything else) nothing changes and it
#                             exits 1. With YES the emulated device "reboots" into the new mode.
USAGE = "usage: nvpmodel [-m <mode id>] [-q] [-p] [-f <conf>] [--verbose]"


def main(argv):
    global NVPMODEL_CONF
    verbose, query, printmodes, mode = False, False, False, None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--verbose":
            verbose = True
        elif a == "-q":
            query = True
        elif a == "-p":
            printmodes = True
        elif a in ("-m", "-f") and args:
            v = args.pop(0)
            if a == "-f":
                NVPMODEL_CONF = v
            elif not v.isdigit():
                fail(f"NVPM ERROR: Invalid power mode id: {v}\n{USAGE}")
            else:
                mode = int(v)
        else:
            fail(f"NVPM ERROR: unknown argument {a}\n{USAGE}")
    try:
        modes, default = parse_conf(read(NVPMODEL_CONF))
    except OSError:
        fail(f"NVPM ERROR: failed to open config file {NVPMODEL_CONF}")
    current = current_mode(modes, default)
    if verbose:
        print(f"NVPM VERB: Config file: {NVPMODEL_CONF}")
        print(f"NVPM VERB: parsing done for {NVPMODEL_CONF}")
    if mode is not None:
        return set_mode(modes, current, mode, verbose)
    if printmodes:
        if verbose:
            print(f"NVPM VERB: Current mode: NV Power Mode: {modes[current]['name']}")
            print(current)
        for mid in sorted(modes):
            print(f"NVPM VERB: POWER_MODEL: ID={mid} NAME={modes[mid]['name']}")
            if verbose:
                for a, b, c in modes[mid]["lines"]:
                    print(f"NVPM VERB: PARAM {a}: ARG {b}: CONF_VAL {c}")
        return 0
    if query or not argv:
        print(f"NV Power Mode: {modes[current]['name']}")
        print(current)
        return 0
    return 0


def set_mode(modes, current, mode, verbose):
    if os.geteuid() != 0:
        fail("NVPM ERROR: Error opening /var/lib/nvpmodel/status: Permission denied "
             "(run nvpmodel -m as root)")
    if mode not in modes:
        fail(f"NVPM ERROR: Invalid power mode id {mode} (valid: "
             f"{', '.join(str(m) for m in sorted(modes))})")
    old = mode_param(modes[current], "TPC_POWER_GATING", "TPC_PG_MASK") or "0"
    new = mode_param(modes[mode], "TPC_POWER_GATING", "TPC_PG_MASK") or "0"
    if old != new:
        print("NVPM WARN: Golden image context is already created for this GPU")
        print(f"NVPM WARN: Reboot required for changing to this power mode: {mode}")
        print("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:", flush=True)
        answer = sys.stdin.readline() if sys.stdin is not None and not sys.stdin.closed else ""
        if answer.strip() not in ("YES", "yes"):
            print("NVPM WARN: power mode is not changed")
            return 1
        apply_mode(mode, modes[mode])
        print("NVPM: rebooting (emulated device: mode applied without a reboot)")
        return 0
    apply_mode(mode, modes[mode])
    if verbose:
        print(f"NVPM VERB: Current mode: NV Power Mode: {modes[mode]['name']}")
    return 0


if __name__ == "__main__":
    run_tool(main)
