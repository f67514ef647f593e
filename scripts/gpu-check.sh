#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and no network (docs/cuda.md, "GPU check").
#
#   scripts/gpu-check.sh --prepare DIR [--sm N] [--binary PATH]
#       here (no GPU needed): a host build with the sm_N cubin + PTX (default sm_90: H100/H200),
#       a model of every family x weight type with its expected CPU logits and greedy ids, and the
#       run script, into DIR (checked to be <= 64 MiB; the size is printed).
#   scripts/gpu-check.sh DIR [--skip-large] [--large-args "..."] [--bench "..."] [--probe-mib N]
#       on the GPU machine (bash + python3's standard library + DIR only): forward --backend cuda
#       vs the CPU logits, greedy equality, decode tok/s with/without the CUDA graph (and weights
#       mapped on a Jetson) vs the performance model, the copy bandwidth, a large synth model's
#       decode bandwidth. One report: DIR/report.{txt,json}. Exit 0: every check passed, 1: not.
set -euo pipefail

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
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
        PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m colibri_kit.gpucheck "$@"
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
