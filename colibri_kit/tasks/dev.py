"""`invoke demo`: the whole pipeline on the built-in default, for a newcomer's first run.

build orin-nx -> verify (qemu runs --version) -> tiny-moe-4e2r model -> emulated Jetson (real sshd,
faked Jetson files) -> deploy -> status -> smoke (deployed binary under qemu vs the NumPy
reference) -> tune + verify -> restore -> the service on a device that boots a real systemd (deploy
installs colibri.service, health gate) and a chat answer fetched from it over HTTP. Each step is
the same code the individual tasks run.
"""

from __future__ import annotations

import os
from pathlib import Path

from invoke import Context

from colibri_kit.paths import build_dir
from colibri_kit.profiles import Profile
from colibri_kit.tasks._common import kit_task, user_errors

# Apart from `invoke sim.up`'s default, so the demo never touches a fleet the user started.
DEMO_STATE_DIR = "/run/colibri-demo"


def _step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


@kit_task(help={
    "target": "target profile to build and emulate (default orin-nx)",
    "count": "emulated devices to bring up (default 1)",
    "keep_running": "leave the emulated devices running afterwards (stop them with `invoke sim.down`)",
    "max_first_token_ms": "first-token p99 limit for the smoke test; the emulated device runs the "
                          "aarch64 binary under qemu, so the default is generous (5000)",
})
@user_errors
def demo(c: Context, target: str = "orin-nx", count: int = 1, keep_running: bool = False,
         max_first_token_ms: float = 5000.0) -> None:
    """Run the whole pipeline on the built-in default: build, model, emulated device, deploy, smoke, tune."""
    from colibri_kit.build import build
    from colibri_kit.model.tiny import write_tiny_model
    from colibri_kit.profiles import load_profile
    from colibri_kit.tasks.fleet import deploy, smoke, status
    from colibri_kit.tasks.sim import start, stop
    from colibri_kit.tasks.tune import tune

    profile = load_profile(target)
    _step(f"1/7 build {target} (cross-compile, embed kernels, verify; qemu runs --version)")
    build(profile)

    _step("2/7 built-in model tiny-moe-4e2r (4 experts, top-2, 2 layers), padded for the target")
    model = build_dir(target) / "demo" / "tiny-moe-4e2r.colibri"
    model.parent.mkdir(parents=True, exist_ok=True)
    write_tiny_model(model, pad=profile.colibri.embed_pad)
    print(f"wrote {model} ({model.stat().st_size} bytes)")

    if os.geteuid() != 0:
        _step("3/7 emulated device: skipped (needs root)")
        print("As root this demo would now start an emulated Jetson (a real sshd on 127.0.0.1 in its\n"
              "own mount namespace with faked /etc/nv_tegra_release, device tree, cpufreq, devfreq,\n"
              "nvpmodel and jetson_clocks), then run:\n"
              f"  invoke sim.up --count {count} --target {target} --state-dir {DEMO_STATE_DIR}\n"
              f"  invoke deploy --fleet {DEMO_STATE_DIR}/fleet.yaml --target {target} --model {model}\n"
              f"  invoke status --fleet {DEMO_STATE_DIR}/fleet.yaml\n"
              f"  invoke smoke --fleet {DEMO_STATE_DIR}/fleet.yaml --target {target} "
              f"--max-first-token-ms {max_first_token_ms:g}\n"
              f"  invoke tune --fleet {DEMO_STATE_DIR}/fleet.yaml --allow-reboot; "
              f"invoke tune --restore --allow-reboot ...\n"
              "Against real devices, write a fleet.yaml (docs/fleet.md) and run the same commands.")
        return

    _step(f"3/7 emulated fleet: {count} device(s) ({target})")
    fleet = start(count, target, Path(DEMO_STATE_DIR))
    fleet_file = str(fleet.fleet_file)
    try:
        _step("4/7 deploy (upload, verify sha256 on the device, switch `current` atomically)")
        deploy(c, target=target, model=str(model), fleet=fleet_file)
        status(c, fleet=fleet_file)
        _step("5/7 smoke (deployed binary vs the NumPy reference; bench p99 vs the threshold)")
        smoke(c, target=target, fleet=fleet_file, max_first_token_ms=max_first_token_ms)
        _step("6/7 tune (power mode by intent; a factory Orin NX needs a reboot for MAXN: the device "
              "really goes down and comes back, canary first; jetson_clocks, governors; verified), "
              "then restore (a reboot back)")
        tune(c, fleet=fleet_file, allow_reboot=True)
        tune(c, fleet=fleet_file, restore=True, allow_reboot=True)
        _step("7/7 the service: a device that boots a real systemd, deploy installs colibri.service, "
              "health gate, a chat answer over HTTP")
        _service_demo(profile, model.parent)
    finally:
        if keep_running:
            print(f"\nemulated devices left running; stop them with `invoke sim.down --state-dir {DEMO_STATE_DIR}`")
        else:
            stop(fleet)
            print("\nemulated devices stopped")


# ChatML, as many chat models ship it (Qwen's tokenizer_config.json `chat_template`).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _service_demo(profile: Profile, workdir: Path) -> None:
    """One emulated device that boots systemd (sshd as a unit, own address): deploy the release
    with a chat model and the profile's service, served beyond loopback with a fresh API key,
    then ask it a question over HTTP from here. Same library calls as `invoke deploy`."""
    import json
    import secrets
    import shutil
    import tempfile
    import urllib.request
    from dataclasses import replace

    from invoke.exceptions import Exit

    from colibri_kit.fleet import deploy as deploylib
    from colibri_kit.fleet.fleet import Fleet
    from colibri_kit.fleet.inventory import load_inventory
    from colibri_kit.model import chat
    from colibri_kit.model.tiny import tiny_header, tiny_tokenizer, write_random_model
    from colibri_kit.paths import dist_dir
    from colibri_kit.tasks.sim import start_service_fleet

    target = profile.name
    if profile.service is None:
        print(f"{target} has no service: section; skipped")
        return
    meta = {**tiny_tokenizer().blobs(), "chat.template": chat.from_template(CHATML).blob()}
    model = write_random_model(workdir / "tiny-chat.colibri", tiny_header(profile.colibri.embed_pad),
                               seed=3, metadata=meta)
    key = secrets.token_urlsafe(24)
    spec = replace(profile.service, bind="0.0.0.0", api_key_file="/etc/colibri/api-key",
                   model_id="tiny-chat")
    state = Path(tempfile.mkdtemp(prefix="colibri-demo-service-"))
    sf = start_service_fleet(1, target, state, name_prefix="demo")
    try:
        dev = sf.devices[0]
        dev.write("/etc/colibri/api-key", key + "\n", 0o600)   # root-only, as on a real device
        f = Fleet.select(load_inventory(sf.fleet_file))
        art = deploylib.prepare(profile, dist_dir(target), model)
        results = deploylib.deploy(f, art, service=spec)
        print(deploylib.results_table(results, ["service", "downtime"]))
        if not all(r.ok for r in results):
            raise Exit("the service did not pass its health gate", code=1)
        url = f"http://{dev.address}:{spec.port}/v1/chat/completions"
        body = {"model": "tiny-chat", "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": "Hello from the fleet kit!"}]}
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            answer = json.loads(resp.read())
        print(f"POST {url}\n  user: {body['messages'][0]['content']}\n"
              f"  assistant ({answer['usage']['completion_tokens']} tokens, random tiny model): "
              f"{answer['choices'][0]['message']['content']!r}")
    finally:
        sf.down()
        shutil.rmtree(state, ignore_errors=True)


TASKS = [demo]
