"""Real-time mode of the runtime (docs/runtime.md, "Real-time mode") through the product build
(dist/host): the same logits bits with and without it, no page fault per decoded token after
warm-up with memory locked, workers really pinned and scheduled, errors that name the limit to
raise, and serve running it (slots sharing the CPUs, faults in /metrics).

The tests run as root (the suite does: CI and this sandbox), so SCHED_FIFO and mlock work; the
refusals are shown by a real unprivileged process (setpriv --reuid) under real limits (prlimit).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from serve_support import Server, write_chat_model, write_load_model

CPUS = sorted(os.sched_getaffinity(0))
TWO = CPUS[:2] if len(CPUS) >= 2 else CPUS * 2      # a 1-CPU machine cannot pin two workers
RT = ["--cpus", ",".join(map(str, reversed(TWO))), "--sched", "fifo:1", "--mlock", "--barrier",
      "spin"]                                     # workers on the CPUs in reverse order, too


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Big enough that two threads split real work (hidden 256, 4 layers, 8 experts; ~30 MB)."""
    path = write_load_model(tmp_path_factory.mktemp("rt") / "load.colibri")
    path.chmod(0o644)
    path.parent.chmod(0o755)
    return path


def run(binary: Path, *args: str, check: bool = True, prefix: tuple[str, ...] = ()):
    proc = subprocess.run([*prefix, str(binary), "--backend", "cpu", *args], capture_output=True,
                          text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def logits(binary: Path, model: Path, out: Path, *args: str) -> bytes:
    ids = ",".join(str((i * 7919 + 13) % 2000) for i in range(24))
    run(binary, *args, "forward", str(model), "--ids", ids, "--decode-from", "16",
        "--logits-out", str(out))
    return out.read_bytes()


@pytest.mark.skipif(len(CPUS) < 2, reason="pinning two workers needs two CPUs")
def test_same_bits_with_and_without_real_time_mode(host_colibri, model, tmp_path) -> None:
    plain = logits(host_colibri, model, tmp_path / "a", "--threads", "2")
    assert len(plain) == 24 * 2000 * 4
    assert logits(host_colibri, model, tmp_path / "b", *RT) == plain
    assert logits(host_colibri, model, tmp_path / "c", "--cpus", str(TWO[0]), "--mlock") == \
        logits(host_colibri, model, tmp_path / "d", "--threads", "1") == plain


def test_no_page_fault_per_decoded_token_after_warm_up_with_memory_locked(host_colibri,
                                                                         model) -> None:
    args = ["bench", str(model), "--prompt-len", "16", "--gen", "24", "--runs", "6", "--json"]
    locked = json.loads(run(host_colibri, "--threads", str(len(TWO)), "--mlock", *args).stdout)
    assert locked["realtime"]["memory_locked"] is True
    assert locked["realtime"]["locked_mb"] >= model.stat().st_size / (1 << 20)
    assert locked["faults_per_token"] == {"minor": 0, "major": 0, "max_minor": 0, "max_major": 0}
    assert locked["token_ms"]["n"] == 6 * 24 and locked["first_token_ms"]["n"] == 6
    # The counter counts: without the lock the warm-up run faults the weights in (at least one
    # fault per page range the kernel maps at a time), with it init did that already.
    plain = json.loads(run(host_colibri, "--threads", str(len(TWO)), *args).stdout)
    assert plain["realtime"]["memory_locked"] is False
    assert plain["warmup_faults"]["minor"] > locked["warmup_faults"]["minor"]
    d = locked["token_ms"]
    assert d["p50"] <= d["p99"] <= d["p999"] <= d["max"]


def test_bench_paces_its_runs_and_traces_every_sample(host_colibri, model, tmp_path) -> None:
    """--pace-ms: run r starts no earlier than r periods after the first (an absolute sleep: a
    lower bound whatever the machine's speed); --trace: every sample, unsorted, with its start."""
    trace = tmp_path / "trace.txt"
    r = json.loads(run(host_colibri, "--threads", "1", "bench", str(model), "--prompt-len", "8",
                       "--gen", "3", "--runs", "4", "--pace-ms", "150", "--trace", str(trace),
                       "--json").stdout)
    assert r["pace_ms"] == 150 and 0 <= r["pace_overruns"] <= 3
    rows = [line.split() for line in trace.read_text().splitlines()]
    assert rows[0] == ["kind", "run", "token", "start_ms", "ms"]
    assert [(k, int(run_), int(t)) for k, run_, t, *_ in rows[1:]] == \
        [(k, n, t) for n in range(4) for k, t in [("first", -1), ("token", 0), ("token", 1),
                                                 ("token", 2)]]
    firsts = [float(row[3]) for row in rows[1:] if row[0] == "first"]
    assert firsts[0] < 1.0 and all(at >= n * 150 for n, at in enumerate(firsts))
    starts = [float(row[3]) for row in rows[1:]]
    assert starts == sorted(starts)                      # in the order they ran
    # the trace holds the samples the distribution was made of
    toks = sorted(float(row[4]) for row in rows[1:] if row[0] == "token")
    assert r["token_ms"]["n"] == len(toks) == 12 and r["token_ms"]["max"] == \
        pytest.approx(toks[-1], abs=1e-3)
    bad = run(host_colibri, "bench", str(model), "--pace-ms", "-1", check=False)
    assert bad.returncode == 2 and "--pace-ms must be 0..600000" in bad.stderr


def stat_fields(pid: int, tid: int) -> list[str]:
    """/proc/PID/task/TID/stat fields after the command name (proc(5): field 3 onwards)."""
    text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


@pytest.mark.skipif(len(CPUS) < 2, reason="two slots on their own CPUs need two CPUs")
def test_serve_pins_each_slot_to_its_cpus_with_the_policy_and_counts_faults(host_colibri,
                                                                            tmp_path) -> None:
    tiny = write_chat_model(tmp_path / "tiny.colibri")
    cpus = ",".join(map(str, TWO))
    srv = Server(host_colibri, tiny, "--slots", "2", "--cpus", cpus, "--sched", "rr:3", "--mlock",
                 "--barrier", "spin", "--deadline-ms", "86400000").start()
    try:
        ready = next(json.loads(x) for x in srv.lines if '"event": "ready"' in x)
        assert ready["threads"] == 2  # the batch engine's workers, one on each listed CPU
        assert ready["realtime"] == {"cpus": cpus, "sched": "rr", "priority": 3, "barrier": "spin",
                                     "memory_locked": True}
        locked_kb = int(next(line.split()[1] for line in
                             Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines()
                             if line.startswith("VmLck:")))
        assert locked_kb * 1024 >= tiny.stat().st_size
        made = 0
        for _ in range(2):          # the second is after warm-up
            status, _, body = srv.call("POST", "/v1/completions", {
                "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 8})
            assert status == 200, body
            assert json.loads(body)["deadline"]["ms"] == 86400000       # --deadline-ms applies
            # sampled at temperature 1 with the request id as the seed (time and pid): a stop
            # token may end a request before 8 tokens, so the count is the responses' own
            made += json.loads(body)["usage"]["completion_tokens"]
        m = srv.metrics()
        assert m['colibri_page_faults_total{type="major"}'] == 0
        assert m['colibri_page_faults_total{type="minor"}'] == 0
        assert m["colibri_deadline_requests_total"] == 2
        before = m["colibri_generated_tokens_total"]
        assert before == made <= 16
    finally:
        assert srv.stop() == 0, srv.lines[-5:]


@pytest.mark.skipif(len(CPUS) < 2, reason="two workers need two CPUs")
def test_helper_threads_really_run_pinned_and_real_time(host_colibri, model, tmp_path) -> None:
    """A bench long enough to look at: its helper thread (worker 1) runs only on its CPU, as
    SCHED_FIFO priority 1 (/proc/PID/task/TID: Cpus_allowed_list, policy field 41)."""
    proc = subprocess.Popen([str(host_colibri), "--backend", "cpu", *RT, "bench", str(model),
                             "--prompt-len", "16", "--gen", "64", "--runs", "200"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        seen = {}
        import time
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(seen) < 2:
            for tid in map(int, os.listdir(f"/proc/{proc.pid}/task")):
                try:
                    f = stat_fields(proc.pid, tid)
                    allowed = next(line.split(":")[1].strip() for line in Path(
                        f"/proc/{proc.pid}/task/{tid}/status").read_text().splitlines()
                        if line.startswith("Cpus_allowed_list:"))
                except (OSError, StopIteration, ValueError):
                    continue
                seen[tid] = (int(f[38]), int(f[37]), allowed)  # policy (41), rt_priority (40)
            time.sleep(0.05)
        fifo = [v for v in seen.values() if v[0] == 1]
        assert len(fifo) == 2, seen                     # worker 0 (the main thread) and worker 1
        assert sorted(v[2] for v in fifo) == sorted(map(str, TWO))
        assert all(v[1] == 1 for v in fifo)
    finally:
        proc.kill()
        proc.wait()


NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.fixture
def public(model: Path):
    """A directory an unprivileged user can read (pytest's are root's own), with the model."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="colibri-rt-"))
    d.chmod(0o755)
    shutil.copy(model, d / "model.colibri")
    (d / "model.colibri").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


C_API = r"""
#include <stdio.h>
#include "colibri.h"
int main(int argc, char **argv) {
    colibri_options o;
    char err[512] = "";
    colibri_ctx *ctx;
    colibri_default_options(&o);
    o.backend = COLIBRI_BACKEND_CPU;
    o.lock_memory = 1;
    o.error = err;
    o.error_len = sizeof err;
    colibri_status s = colibri_init_ex(&ctx, argv[1], &o);
    printf("%s: %s\n", colibri_strerror(s), err);
    if (!s) colibri_free(ctx);
    return (int)s;
}
"""


def c_api_program(binary: Path, where: Path) -> Path:
    """A C API user of the product library (dist/host/lib/libcolibri.a)."""
    dist = binary.parents[1]
    src, exe = where / "lock.c", where / "lock"
    src.write_text(C_API)
    subprocess.run(["cc", "-O1", f"-I{dist / 'include'}", "-o", str(exe), str(src),
                    str(dist / "lib" / "libcolibri.a"), "-lpthread", "-lm", "-ldl"], check=True)
    exe.chmod(0o755)
    return exe


def test_limits_too_low_are_errors_naming_the_limit_and_the_unit_setting(host_colibri,
                                                                          public) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test drops to an unprivileged user with setpriv and needs root (CI "
                    "runs as root)")
    model = public / "model.colibri"
    locked = run(host_colibri, "--mlock", "bench", str(model), check=False,
                 prefix=("prlimit", "--memlock=65536:65536", *NOBODY))
    assert locked.returncode == 1
    assert "--mlock: the model (" in locked.stderr
    assert "MiB) is larger than RLIMIT_MEMLOCK 64 KiB (ulimit -l): raise it, e.g. " \
           "LimitMEMLOCK=infinity in the systemd unit" in locked.stderr
    # The C API says the same for what it locks itself (an application that did not mlockall).
    api = c_api_program(host_colibri, public)
    proc = subprocess.run(["prlimit", "--memlock=65536:65536", *NOBODY, str(api), str(model)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 20, proc.stdout + proc.stderr      # COLIBRI_E_REALTIME
    assert "locking the model's mapping (" in proc.stdout
    assert "RLIMIT_MEMLOCK is 64 KiB (ulimit -l): raise it, e.g. LimitMEMLOCK=infinity" in proc.stdout
    fifo = run(host_colibri, "--threads", "2", "--sched", "fifo:5", "bench", str(model),
               check=False, prefix=("prlimit", "--rtprio=0:0", *NOBODY))
    assert fifo.returncode == 1
    assert "SCHED_FIFO priority 5 for a worker thread: Operation not permitted (an unprivileged " \
           "process needs RLIMIT_RTPRIO >= 5: ulimit -r, LimitRTPRIO= in a systemd unit" \
           in fifo.stderr


def test_options_that_cannot_work_are_refused(host_colibri, model) -> None:
    outside = max(CPUS) + 1
    bad = run(host_colibri, "--cpus", str(outside), "bench", str(model), check=False)
    assert bad.returncode == 1
    assert f"CPU {outside} is not one this process may run on (allowed: " in bad.stderr
    mismatch = run(host_colibri, "--threads", "3", "--cpus", str(CPUS[0]), "bench", str(model),
                   check=False)
    assert "threads 3 and 1 cpus: one worker thread runs on each CPU" in mismatch.stderr
    for args, words in ((["--sched", "fifo"], "--sched must be other, fifo:N or rr:N"),
                        (["--sched", "fifo:100"], "--sched must be other"),
                        (["--cpus", "1,1"], "--cpus must list 1..64 distinct CPUs"),
                        (["--cpus", "3-1"], "--cpus must list"),
                        (["--barrier", "yield"], "--barrier must be sleep or spin")):
        proc = run(host_colibri, *args, "bench", str(model), check=False)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    srv = run(host_colibri, "--cpus", str(CPUS[0]), "serve", str(model), "--slots", "2",
              check=False)
    assert srv.returncode == 2 and "the slots must share the CPUs evenly" in srv.stderr
