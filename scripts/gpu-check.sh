#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and no network (docs/cuda.md, "GPU check").
#
#   scripts/gpu-check.sh --prepare DIR [--sm N] [--binary PATH] [--models PATTERNS] [--bench "P G R"]
#                        [--large-args "..."] [--no-large] [--call-budget "S1 S2"]
#       here (no GPU needed): a host build with the sm_N cubin + PTX (default sm_90: H100/H200),
#       a model of every family x weight type and the coverage models with their expected CPU
#       logits and greedy ids, the run script and the run plan, into DIR (<= 64 MiB, printed).
#   scripts/gpu-check.sh DIR [--call 1|2|all] [--out DIR2] [--only STEPS] [--list]
#       on the GPU machine (bash + python3's standard library + DIR only): the plan's steps, each
#       with its own timeout; call 1 correctness (logits, greedy ids, determinism, sanitizers),
#       call 2 speed and coverage (benches vs the performance model, the large model, coverage
#       models). Each finished step is appended to DIR2/report.jsonl (and report.txt) at once.
#       Exit 0: every check passed, 1: not, 2: DIR is not a prepared directory.
set -euo pipefail

usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")

[[ $# -ge 1 ]] || usage
case "$1" in
    -h|--help) usage 0 ;;
    --prepare)
        shift
        [[ $# -ge 1 ]] || usage
        py=${PYTHON:-}
        if [[ -z $py ]]; then
            for cand in "$root/.venv/bin/python" python3; do
                if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import numpy, yaml' 2>/dev/null; then
                    py=$cand
                    break
                fi
            done
        fi
        [[ -n $py ]] || { echo "gpu-check: --prepare needs the kit's Python (numpy, PyYAML): set PYTHON" >&2; exit 2; }
        cd "$root"
        exec "$py" "$here/gpu_check_prepare.py" "$@"
        ;;
    -*) usage ;;
esac

dir=$1
shift
[[ -f $dir/manifest.json && -x $dir/bin/colibri ]] || {
    echo "gpu-check: $dir is not a prepared directory (make one with: $0 --prepare $dir)" >&2
    exit 2
}
command -v python3 >/dev/null || { echo "gpu-check: python3 (standard library only) is needed" >&2; exit 2; }
exec python3 "$dir/gpu_check_run.py" "$dir" "$@"
