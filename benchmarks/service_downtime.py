"""Service downtime during a release switch, on an emulated Jetson that boots a real systemd
(needs root; colibri_kit/sim/service_fleet.py).

    python benchmarks/service_downtime.py [--switches 4] [--dist dist/orin-nx]

One device, the orin-nx build (aarch64, under qemu-user) serving the built-in tiny model under
colibri.service. Two releases (the same binaries under two manifests) are deployed in turn; for
each switch the table shows the deploy's own `downtime` figure (restart command -> health gate
passed, measured on this machine through SSH) and what a client saw: it asks the device's
`/health` every 20 ms from this machine, and the longest run of failed probes is the time the
device really did not answer. The client figure is the honest one; the deploy's is an upper
bound (it includes the gate's SSH round trips and its 0.5 s poll). Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri_kit.fleet import deploy as D  # noqa: E402
from colibri_kit.fleet.fleet import Fleet  # noqa: E402
from colibri_kit.fleet.inventory import load_inventory  # noqa: E402
from colibri_kit.model.tiny import write_tiny_model  # noqa: E402
from colibri_kit.profiles import load_profile  # noqa: E402
from colibri_kit.report import table  # noqa: E402
from colibri_kit.service import ServiceSpec  # noqa: E402
from colibri_kit.sim.service_fleet import ServiceFleet  # noqa: E402

KEY_FILE = "/etc/colibri/api-key"


def second_dist(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["source_revision"] = f"{manifest.get('source_revision', '')}-b"
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return dest


class Prober(threading.Thread):
    """GET /health every ``step`` s; records the longest run of failures."""

    def __init__(self, url: str, step: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.url, self.step = url, step
        self.stop = threading.Event()
        self.down_since: float | None = None
        self.longest = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=1) as r:
                    ok = r.status == 200
            except OSError:
                ok = False
            if ok and self.down_since is not None:
                self.longest = max(self.longest, t - self.down_since)
                self.down_since = None
            elif not ok and self.down_since is None:
                self.down_since = t
            time.sleep(self.step)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switches", type=int, default=4)
    ap.add_argument("--dist", default=str(ROOT / "dist" / "orin-nx"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (the emulated device boots systemd in its own namespaces)", file=sys.stderr)
        return 2
    profile = load_profile("orin-nx")
    work = Path(tempfile.mkdtemp(prefix="colibri-bench-svc-"))
    try:
        model = write_tiny_model(work / "tiny.colibri", pad=profile.colibri.embed_pad)
        dists = [Path(args.dist), second_dist(Path(args.dist), work / "dist-b")]
        arts = [D.prepare(profile, d, model) for d in dists]
        spec = ServiceSpec(bind="0.0.0.0", api_key_file=KEY_FILE, model_id="tiny")
        with ServiceFleet(1, work / "state", name_prefix="bench") as sf:
            dev = sf.devices[0]
            dev.write(KEY_FILE, "sk-benchmark-key-0123456789\n", 0o600)
            fleet = Fleet.select(load_inventory(sf.fleet_file))
            first = D.deploy(fleet, arts[1], profile, hooks=D.Hooks(), service=spec)[0]
            rows = [["switch", "result", "deploy total", "deploy downtime", "client saw down"]]
            rows.append(["install (first)", first.result, f"{first.seconds:.1f}s",
                         first.column("downtime"), "-"])
            for i in range(args.switches):
                probe = Prober(f"http://{dev.address}:{spec.port}/health")
                probe.start()
                time.sleep(0.5)
                r = D.deploy(fleet, arts[i % 2], profile, hooks=D.Hooks(), service=spec)[0]
                time.sleep(0.5)
                probe.stop.set()
                probe.join()
                rows.append([f"{i + 1}: -> {arts[i % 2].release_id}", r.result, f"{r.seconds:.1f}s",
                             r.column("downtime"), f"{probe.longest:.2f}s"])
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
