"""On-device smoke test: the real aarch64 colibri under qemu on emulated Jetsons vs the NumPy
reference; failures are reported, and a canary rollout stops on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_kit.fleet import deploy as D
from colibri_kit.fleet import smoke as S
from colibri_kit.fleet.status import status
from colibri_kit.profiles import load_profile

from fleet_support import FAULTY, MAIN, fleet_of, rebuilt

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def profile():
    return load_profile("orin-nx")


@pytest.fixture(scope="module")
def deployed(inventory, profile, dist_a, tiny_model):
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    results = D.deploy(fleet_of(inventory, MAIN), art, profile, hooks=D.Hooks())
    assert all(r.ok for r in results), D.results_table(results)
    return art


def test_smoke_passes_on_the_fleet(inventory, profile, deployed, tiny_model) -> None:
    results = S.smoke(fleet_of(inventory, MAIN), profile, model=tiny_model,
                      bench_runs=2)
    for r in results:
        assert r.result == "ok", r.detail
        assert r.release == deployed.release_id and r.model == deployed.model_sha[:12]
        assert r.extra["greedy"] == "same" and float(r.extra["logits"]) <= S.TOLERANCE["f32"]
        assert r.extra["text"] == "same"  # aarch64 tokenizer + generate --prompt under qemu
        assert r.extra["backend"] == "cpu"  # no GPU driver on an emulated device: CPU fallback


def test_smoke_cli_fetches_the_model_and_prints_json(inventory, deployed, sim_fleet, tmp_path) -> None:
    """No --model: the reference uses the device's copy, fetched once by sha256 into the cache."""
    env = {**__import__("os").environ, "COLIBRI_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "invoke", "smoke", "--target", "orin-nx",
                           "--fleet", str(sim_fleet.fleet_file), "--hosts", MAIN[0], "--json",
                           "--bench-runs", "2"],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).parents[2], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = json.loads(proc.stdout)
    assert row["host"] == MAIN[0] and row["result"] == "ok"
    assert (tmp_path / "cache/models" / f"{deployed.model_sha}.colibri").is_file()


def test_slow_first_token_fails(inventory, profile, deployed, tiny_model) -> None:
    [r] = S.smoke(fleet_of(inventory, [MAIN[1]]), profile, model=tiny_model,
                  max_first_token_ms=0.001, bench_runs=2)
    assert r.result == "failed" and "first-token p99" in r.detail and "> 0.001 ms" in r.detail


def test_model_not_fitting_the_binary_fails(inventory, profile, dist_a, tmp_path) -> None:
    """A model padded for another build: the runtime refuses it, and smoke reports that."""
    from colibri_kit.model.tiny import write_tiny_model

    odd = write_tiny_model(tmp_path / "pad128.colibri", pad=128)
    art = D.prepare(load_profile("orin-nx"), dist_a, Path(odd))
    [dep] = D.deploy(fleet_of(inventory, [FAULTY]), art, profile, hooks=D.Hooks())
    assert dep.result == "ok", dep.detail
    [r] = S.smoke(fleet_of(inventory, [FAULTY]), profile, model=Path(odd), bench_runs=1)
    assert r.result == "failed"
    assert "128" in r.detail and "64" in r.detail  # the runtime names both paddings


def test_local_model_must_be_the_deployed_one(inventory, profile, deployed, tmp_path) -> None:
    other = tmp_path / "other.colibri"
    other.write_bytes(b"not the deployed model")
    [r] = S.smoke(fleet_of(inventory, [MAIN[0]]), profile, model=other)
    assert r.result == "failed" and "the --model given is" in r.detail


def test_canary_failure_stops_the_rollout(inventory, profile, deployed, dist_a, tiny_model, tmp_path) -> None:
    art = D.prepare(load_profile("orin-nx"), rebuilt(dist_a, tmp_path / "canary", "canary"), tiny_model)
    hosts = fleet_of(inventory, MAIN)

    def strict_smoke(canaries):
        return S.smoke(canaries, profile, model=tiny_model, max_first_token_ms=0.001, bench_runs=1)
    results = D.deploy(hosts, art, profile, canary=1, smoke_fn=strict_smoke, hooks=D.Hooks())
    assert [r.result for r in results] == ["failed", "skipped", "skipped"]
    assert "canary smoke test failed" in results[0].detail
    assert f"rolled back to {deployed.release_id}" in results[0].detail
    # the canary is back on its previous release; hosts after it were not touched
    rows = status(hosts)
    assert [row.release for row in rows] == [deployed.release_id] * 3

    def lenient_smoke(canaries):
        return S.smoke(canaries, profile, model=tiny_model, bench_runs=1)
    results = D.deploy(hosts, art, profile, canary=1, smoke_fn=lenient_smoke, hooks=D.Hooks())
    assert [r.result for r in results] == ["ok", "ok", "ok"], D.results_table(results)
