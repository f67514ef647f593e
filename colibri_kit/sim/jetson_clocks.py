from colibri_kit.sim._devlib import *  # noqa: F401,F403  (inlined when installed)

# Stand-in for NVIDIA's jetson_clocks on an emulated Jetson (root only, like the real script):
#   jetson_clocks                  lock CPU, GPU and EMC clocks at their maximum (min = max),
#                                  fan to full speed
#   jetson_clocks --show           print the current state in the real tool's layout
#   jetson_clocks --store [FILE]   save the clock state (default $HOME/l4t_dfs.conf); when FILE
#                                  exists it asks "File exists, overwrite? Y/N" and waits on stdin
#   jetson_clocks --restore [FILE] put a stored state back
USAGE = "usage: jetson_clocks [--show] [--store [file]] [--restore [file]] [--fan]"


def default_conf():
    return os.path.join(os.environ.get("HOME", "/root"), "l4t_dfs.conf")


def clock_files():
    """Every file --store saves, in restore order (max before min, so min <= max holds)."""
    files = []
    for cpu in online_cpus():
        files += [cpufreq(cpu, "scaling_max_freq"), cpufreq(cpu, "scaling_min_freq")]
    gpu = gpu_devfreq()
    if gpu:
        files += [gpu + "/max_freq", gpu + "/min_freq"]
    if os.path.exists(sim(EMC_DIR + "/rate")):
        files += [EMC_DIR + "/mrq_rate_locked"]
    if os.path.exists(sim(FAN_PWM)):
        files += [FAN_PWM]
    return files


def max_clocks():
    for cpu in online_cpus():
        write(cpufreq(cpu, "scaling_min_freq"), read(cpufreq(cpu, "scaling_max_freq")))
    gpu = gpu_devfreq()
    if gpu:
        write(gpu + "/min_freq", read(gpu + "/max_freq"))
    if os.path.exists(sim(EMC_DIR + "/rate")):
        write(EMC_DIR + "/mrq_rate_locked", 1)
    if os.path.exists(sim(FAN_PWM)):
        write(FAN_PWM, 255)
    settle()


def show():
    compat = read(COMPATIBLE_FILE, "").split("\0")
    soc = next((c.split(",", 1)[1] for c in compat if c.startswith("nvidia,tegra")), "unknown")
    model = read(MODEL_FILE, "unknown").rstrip("\0")
    print(f"SOC family:{soc}  Machine:{model}")
    print(f"Online CPUs: {read(CPU_DIR + '/online')}")
    online = set(online_cpus())
    for cpu in all_cpus():
        if cpu not in online:
            print(f"cpu{cpu}: Online=0")
            continue
        print(f"cpu{cpu}: Online=1 Governor={read(cpufreq(cpu, 'scaling_governor'))} "
              f"MinFreq={read(cpufreq(cpu, 'scaling_min_freq'))} "
              f"MaxFreq={read(cpufreq(cpu, 'scaling_max_freq'))} "
              f"CurrentFreq={read(cpufreq(cpu, 'scaling_cur_freq'))} IdleStates: C1=1 c7=1")
    gpu = gpu_devfreq()
    if gpu:
        print(f"GPU MinFreq={read(gpu + '/min_freq')} MaxFreq={read(gpu + '/max_freq')} "
              f"CurrentFreq={read(gpu + '/cur_freq')}")
    if os.path.exists(sim(EMC_DIR + "/rate")):
        print(f"EMC MinFreq={read(EMC_DIR + '/min_rate')} MaxFreq={read(EMC_DIR + '/max_rate')} "
              f"CurrentFreq={read(EMC_DIR + '/rate')} "
              f"FreqOverride={read(EMC_DIR + '/mrq_rate_locked')}")
    if os.path.exists(sim(FAN_PWM)):
        print(f"FAN Dynamic Speed control=active hwmon0_pwm1={read(FAN_PWM)}")
    try:
        modes, default = load_conf()
        print(f"NV Power Mode: {modes[current_mode(modes, default)]['name']}")
    except OSError:
        pass


def store(path):
    if os.path.exists(path):
        print("File exists, overwrite? Y/N", flush=True)
        answer = sys.stdin.readline() if sys.stdin is not None and not sys.stdin.closed else ""
        if answer.strip() not in ("Y", "y"):
            print(f"Not storing: {path} is kept")
            return 1
    lines = [f"{f} {read(f)}" for f in clock_files()]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")
    return 0


_STORE_LINE_RE = re.compile(r"^(/sys/[A-Za-z0-9@._/-]+) ([0-9]+)$")


def restore(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        fail(f"Error: {path} file not found")
    for line in text.splitlines():
        m = _STORE_LINE_RE.match(line.strip())
        if not m or ".." in m.group(1):
            fail(f"Error: {path}: malformed line {line!r}")
        write(m.group(1), m.group(2))
    settle()
    return 0


def main(argv):
    if os.geteuid() != 0:
        fail(f"Error: Run this script({sys.argv[0]}) as a root user")
    args = list(argv)
    if not args:
        max_clocks()
        return 0
    a = args.pop(0)
    if a == "--show" and not args:
        show()
        return 0
    if a == "--fan" and not args:
        write(FAN_PWM, 255)
        return 0
    if a in ("--store", "--restore") and len(args) <= 1:
        path = args[0] if args else default_conf()
        return store(path) if a == "--store" else restore(path)
    fail(USAGE)


if __name__ == "__main__":
    run_tool(main)
