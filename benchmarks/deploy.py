"""Deploy timings against emulated Jetsons (needs root: real sshd in mount namespaces).

    python benchmarks/deploy.py [--counts 1,5,20] [--model-mb 200] [--parallel 8] [--dist dist/orin-nx]

For each fleet size N: bring up N emulated orin-nx devices (tmpfs disks sized for the model),
deploy dist/orin-nx + an N-MiB model (first deploy: everything uploaded and verified on every
device), then deploy again (no-op: nothing uploaded; the on-device checks still run), then
time a raw `scp` of the same model file to one device for comparison (same sshd, same key, same
cipher negotiation, no verification). Prints one table. The model is random bytes (deploy does
not parse models). All devices share this machine's CPUs: figures measure the kit's overhead
and SSH throughput on loopback, not a network.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri_kit.fleet import deploy as D  # noqa: E402
from colibri_kit.fleet.fleet import Fleet  # noqa: E402
from colibri_kit.fleet.inventory import load_inventory  # noqa: E402
from colibri_kit.report import table  # noqa: E402
from colibri_kit.sim.fleet import EmulatedFleet  # noqa: E402
from colibri_kit.profiles import load_profile  # noqa: E402

MiB = 1 << 20


def make_model(path: Path, mb: int) -> Path:
    with open(path, "wb") as fh:
        for _ in range(mb):
            fh.write(os.urandom(MiB))
    return path


def scp_seconds(fleet: EmulatedFleet, model: Path) -> float:
    d = fleet.devices[0]
    cmd = ["scp", "-q", "-B", "-i", str(fleet.identity_file), "-P", str(d.port),
           "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-o", "StrictHostKeyChecking=yes",
           str(model), "root@127.0.0.1:/opt/colibri/scp-copy"]
    start = time.monotonic()
    subprocess.run(cmd, check=True)
    took = time.monotonic() - start
    fleet.path_in(d.name, "/opt/colibri/scp-copy").unlink()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="1,5,20")
    ap.add_argument("--model-mb", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--dist", default=str(ROOT / "dist" / "orin-nx"))
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    profile = load_profile("orin-nx")
    rows = [["devices", "model MiB", "deploy s", "MiB/s total", "no-op s", "scp 1 file s", "scp MiB/s"]]
    with tempfile.TemporaryDirectory(prefix="colibri-deploy-bench-") as work:
        work_dir = Path(work)
        model = make_model(work_dir / "model.colibri", args.model_mb)
        art = D.prepare(profile, Path(args.dist), model)
        for n in counts:
            state = work_dir / f"sim{n}"
            with EmulatedFleet(n, "orin-nx", state, disk_mb=args.model_mb * 2 + 64) as fleet:
                hosts = Fleet.select(load_inventory(fleet.fleet_file), parallel=args.parallel)
                quiet = D.Hooks()
                t0 = time.monotonic()
                first = D.deploy(hosts, art, profile, hooks=quiet)
                t_first = time.monotonic() - t0
                bad = [r for r in first if r.result != "ok"]
                if bad:
                    raise SystemExit(D.results_table(first))
                t0 = time.monotonic()
                again = D.deploy(hosts, art, profile, hooks=quiet)
                t_noop = time.monotonic() - t0
                assert all(r.result == "unchanged" and r.uploaded == 0 for r in again), D.results_table(again)
                t_scp = scp_seconds(fleet, model)
            total_mb = n * (art.model_size + art.release_bytes) / MiB
            rows.append([str(n), str(args.model_mb), f"{t_first:.1f}", f"{total_mb / t_first:.0f}",
                         f"{t_noop:.2f}", f"{t_scp:.1f}", f"{args.model_mb / t_scp:.0f}"])
            print(table(rows), flush=True) if n == counts[-1] else print(f"  {n} devices done", flush=True)


if __name__ == "__main__":
    main()
