"""Deadlines in `colibri serve` (docs/serve.md, "Deadlines"): a request's `deadline_ms` (a
colibri extension of the OpenAI body; the openai package sends it through `extra_body`), or the
server's `--deadline-ms`; answers generated under one are counted in /metrics, and those whose
generation ended after it (queue time included) are counted as misses.

No test here depends on the machine's speed: a deadline of a day is never missed, and one of a
nanosecond always is (a forward pass takes longer on any machine).
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from serve_support import Server, write_chat_model

NEVER = 86_400_000          # ms: a day, the largest deadline accepted
ALWAYS = 1e-6               # ms: a nanosecond


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_model(tmp_path_factory.mktemp("deadline") / "tiny.colibri")


@pytest.fixture(scope="module")
def server(host_colibri: Path, tiny: Path):
    srv = Server(host_colibri, tiny, "--slots", "2", "--threads", "1").start()
    yield srv
    assert srv.stop() == 0, srv.lines[-5:]


def counts(srv: Server) -> tuple[float, float]:
    m = srv.metrics()
    return m["colibri_deadline_requests_total"], m["colibri_deadline_misses_total"]


def test_requests_with_deadlines_are_counted_and_misses_reported(server) -> None:
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
    answered0, missed0 = counts(server)
    kept = client.completions.create(model="tiny", prompt=[1, 5, 9], max_tokens=4, temperature=0,
                                     extra_body={"deadline_ms": NEVER})
    assert kept.model_extra["deadline"]["missed"] is False
    assert kept.model_extra["deadline"]["ms"] == NEVER
    late = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"deadline_ms": ALWAYS})
    d = late.model_extra["deadline"]
    assert d["missed"] is True and d["elapsed_ms"] > d["ms"]
    # Streaming answers count too (their chunks carry no deadline object).
    stream = client.completions.create(model="tiny", prompt=[1, 2], max_tokens=3, stream=True,
                                       extra_body={"deadline_ms": ALWAYS})
    assert [c for c in stream]
    plain = client.completions.create(model="tiny", prompt=[1, 2], max_tokens=2)
    assert "deadline" not in (plain.model_extra or {})       # no deadline: nothing counted
    assert counts(server) == (answered0 + 3, missed0 + 2)
    line = server.wait_log(lambda e: e.get("deadline_ms") == ALWAYS and e.get("stream") is False)
    assert line["deadline_missed"] is True
    assert server.wait_log(lambda e: e.get("deadline_ms") == NEVER)["deadline_missed"] is False


@pytest.mark.parametrize("value,words", [
    (0, "'deadline_ms' must be > 0"), (-5, "must be between 0 and 8.64e+07"),
    (NEVER + 1, "must be between 0 and 8.64e+07"), ("50", "'deadline_ms' must be a number"),
    (True, "'deadline_ms' must be a number")])
def test_bad_deadlines_are_refused_naming_the_field(server, value, words) -> None:
    answered0, missed0 = counts(server)
    status, _, body = server.call("POST", "/v1/completions", {
        "model": "tiny", "prompt": [1, 2], "max_tokens": 2, "deadline_ms": value})
    err = json.loads(body)["error"]
    assert status == 400 and err["param"] == "deadline_ms" and words in err["message"], err
    assert counts(server) == (answered0, missed0)
