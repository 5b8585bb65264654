"""The simulated server's timing model (src/servefleet/fleet/lab/simulator/packages/vllm/
generation.py: ``Timing``, ``timing_of``), its per-release slowdown switch (``slowdown``:
/etc/rbln-sim/slowdown) and the engine's queue of --max-num-seqs (lifecycle.py: ``Requests``).
Pure functions, no server, no sleeping: the queue's waits are on conditions, with deadlines."""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from lab_sim_support import wait_for
from sim_fixtures import MODEL

RELEASE = "/opt/servefleet/releases/5111e30ae8fe8dbf"
SUBJECT = f"{RELEASE} {RELEASE}/bin/vllm serve {MODEL} --max-num-seqs 8 --port 8001"


def module(sim: Any, name: str) -> ModuleType:
    return importlib.import_module(sim.__name__.rsplit(".", 1)[0] + "." + name)


@pytest.fixture
def gen(sim: Any) -> ModuleType:
    return module(sim, "generation")


def timing(sim: Any, *args: str, platform: str = "upstream", rate: float = 1000.0,
           factor: float = 1.0) -> Any:  # fmt: skip
    ns = sim.parse_serve_args([MODEL, *args], platform)
    return module(sim, "generation").timing_of(ns, rate, factor)


# ---------------------------------------------------------------------------------------------
# The formula


def test_alone_at_the_default_rate_is_as_before(sim: Any, gen: ModuleType) -> None:
    """One request alone, a short prompt, the default rate: token i at about (i + 1) / rate, a
    16-token reply in 16 ms (what the lab's tests were timed with)."""
    t = timing(sim, rate=gen.DEFAULT_TOKENS_PER_SECOND)
    assert t.step == 1 / gen.DEFAULT_TOKENS_PER_SECOND
    for i in range(16):
        assert t.ready_at(0.0, i, 3, 1) == pytest.approx((i + 1) / 1000, rel=0.02)
    assert t.ready_at(0.0, 15, 3, 1) < 0.0162


def test_the_formula(sim: Any, gen: ModuleType) -> None:
    """step(b) = T (1 + 0.05 (b - 1)); prefill = ceil(P / B) steps + P T / 256; then one token
    every step(b) / g."""
    t = timing(sim, "--max-num-seqs", "8", "--max-num-batched-tokens", "512", rate=100.0)
    assert (t.max_num_seqs, t.max_num_batched_tokens, t.tokens_per_step) == (8, 512, 1.0)
    step = 0.01 * (1 + gen.BATCH_COST * 4)
    assert t.step_seconds(5) == pytest.approx(step)
    prefill = 2 * step + 1000 * 0.01 / gen.PREFILL_TOKENS_PER_STEP  # 1000 tokens: two chunks
    assert t.prefill_seconds(1000, 5) == pytest.approx(prefill)
    assert t.ready_at(10.0, 0, 1000, 5) == pytest.approx(10.0 + prefill)
    assert t.ready_at(10.0, 7, 1000, 5) == pytest.approx(10.0 + prefill + 7 * step)
    assert t.prefill_seconds(512, 1) == pytest.approx(0.01 + 0.02)  # one whole chunk
    assert t.prefill_seconds(513, 1) == pytest.approx(0.02 + 513 * 0.01 / 256)
    assert t.prefill_seconds(0, 1) == pytest.approx(0.01)  # an empty prompt: one step
    # the batch counts at most --max-num-seqs: the others wait in the queue
    assert t.step_seconds(100) == t.step_seconds(8) == pytest.approx(0.01 * 1.35)
    assert t.step_seconds(0) == t.step_seconds(1) == 0.01


def test_the_delays_add_up_to_ready_at(sim: Any) -> None:
    """The server steps token by token (delay, the batch read anew each time); at a constant
    load that is ready_at."""
    t = timing(sim, "--max-num-batched-tokens", "64",
               "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}')  # fmt: skip
    for prompt, batch in [(0, 1), (3, 1), (200, 7), (64, 3)]:
        due = 5.0
        for i in range(40):
            due += t.delay(i, prompt, batch)
            assert due == pytest.approx(t.ready_at(5.0, i, prompt, batch)), (prompt, batch, i)


def test_the_batch_slows_each_step(sim: Any) -> None:
    t = timing(sim, rate=50.0)
    times = [t.ready_at(0.0, 31, 10, b) for b in (1, 2, 4, 16, 64)]
    assert times == sorted(times) and len(set(times)) == 5
    gaps = [t.delay(5, 10, b) for b in (1, 11)]
    assert gaps[1] == pytest.approx(gaps[0] * 1.5)  # ten more running: +50 % per step


def test_speculative_decoding_yields_more_tokens_per_step(sim: Any, gen: ModuleType) -> None:
    plain = timing(sim)
    spec = timing(sim, "--speculative-config",
                  '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}')  # fmt: skip
    assert spec.tokens_per_step == pytest.approx(1 + 3 * gen.ACCEPTANCE)
    assert spec.delay(4, 10, 2) == pytest.approx(plain.delay(4, 10, 2) / (1 + 3 * gen.ACCEPTANCE))
    assert spec.delay(0, 10, 2) == plain.delay(0, 10, 2)  # the prefill is not drafted
    dotted = timing(sim, "--speculative-config.method", "ngram")  # no count: one draft token
    assert dotted.tokens_per_step == pytest.approx(1 + gen.ACCEPTANCE)


def test_defaults_follow_the_platform(sim: Any, gen: ModuleType) -> None:
    """vllm-rbln fills in --max-num-seqs 1; upstream's unset values are vLLM's H100/H200
    API-server defaults."""
    rbln = timing(sim, platform="rbln")
    assert rbln.max_num_seqs == 1
    assert rbln.max_num_batched_tokens == gen.DEFAULT_MAX_NUM_BATCHED_TOKENS
    up = timing(sim)
    assert (up.max_num_seqs, up.max_num_batched_tokens) == (1024, 8192)


def test_a_slowdown_scales_every_time(sim: Any) -> None:
    base = timing(sim, "--max-num-seqs", "4", rate=200.0)
    slow = timing(sim, "--max-num-seqs", "4", rate=200.0, factor=1.3)
    for i, prompt, batch in [(0, 3, 1), (9, 3, 1), (0, 5000, 4), (30, 700, 3)]:
        assert slow.ready_at(0.0, i, prompt, batch) == pytest.approx(
            1.3 * base.ready_at(0.0, i, prompt, batch)
        )


# ---------------------------------------------------------------------------------------------
# The slowdown switch


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "etc/rbln-sim").mkdir(parents=True)
    return {"RBLN_SIM_ROOT": str(tmp_path)}


def write(env: dict[str, str], text: str) -> Path:
    path = Path(env["RBLN_SIM_ROOT"]) / "etc/rbln-sim/slowdown"
    path.write_text(text)
    return path


def test_no_slowdown_file_is_full_speed(gen: ModuleType, env: dict[str, str]) -> None:
    assert gen.slowdown(env, SUBJECT) == 1.0


@pytest.mark.parametrize(
    ("text", "factor"),
    [
        ("1.3 --max-num-seqs 8\n", 1.3),  # the change, matched on its command line
        ("1.3 --max-num-seqs 1\n", 1.0),  # another change: no match
        ("2 5111e30ae8fe8dbf\n", 2.0),  # the release id, in its directory
        ("1.5 0000000000000000\n1.25\n", 1.25),  # a bare FACTOR matches every process
        ("\n  1.1   --port 8001  \n3 --port\n", 1.1),  # the first matching line wins
        ("1 --port 8001\n", 1.0),
        ("1.3 --max-num-seqs 8 --port 8002\n", 1.0),  # MATCH is the rest of the line, one string
        ("", 1.0),
    ],
)
def test_slowdown_matches_release_and_command_line(
    gen: ModuleType, env: dict[str, str], text: str, factor: float
) -> None:
    write(env, text)
    assert gen.slowdown(env, SUBJECT) == factor


@pytest.mark.parametrize(
    ("text", "bad"),
    [("slow --port 8001\n", "slow --port 8001"), ("0.5\n", "0.5"), ("1.2 a\nnan b\n", "nan b"),
     ("inf\n", "inf"), ("-2 x\n", "-2 x"), ("1,3 x\n", "1,3 x")],
)  # fmt: skip
def test_bad_slowdown_is_one_clear_line(
    gen: ModuleType, sim: Any, env: dict[str, str], text: str, bad: str
) -> None:
    path = write(env, text)
    with pytest.raises(sim.SimError) as err:
        gen.slowdown(env, "anything")
    number = text.splitlines().index(bad) + 1
    assert str(err.value) == (
        f"{path} line {number} holds {bad!r}; expected FACTOR MATCH... with FACTOR a number >= 1 "
        "(e.g. '1.3 --max-num-seqs 8')"
    )


def test_slowdown_is_read_at_each_call(gen: ModuleType, env: dict[str, str]) -> None:
    """A test writes the file while the server runs: the next request sees it."""
    for text, factor in [("1.3\n", 1.3), ("2\n", 2.0), ("1.3\n", 1.3)]:
        write(env, text)
        assert gen.slowdown(env, SUBJECT) == factor
    (Path(env["RBLN_SIM_ROOT"]) / "etc/rbln-sim/slowdown").unlink()
    assert gen.slowdown(env, SUBJECT) == 1.0


# ---------------------------------------------------------------------------------------------
# The queue (--max-num-seqs)


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(result=fn()), daemon=True)
    thread.start()
    return thread, out


def test_the_queue_runs_max_num_seqs_first_come_first_served(sim: Any) -> None:
    life = module(sim, "lifecycle")
    requests = life.Requests(max_num_seqs=2)
    flights = [life.Flight(prompt=10 * (i + 1), arrived=float(i)) for i in range(4)]
    assert requests.schedule(flights[0]) and requests.schedule(flights[1])
    assert flights[0].scheduled is not None
    third, third_out = in_thread(lambda: requests.schedule(flights[2]))
    wait_for("the third to wait", lambda: requests.load()[1] == 1)
    fourth, fourth_out = in_thread(lambda: requests.schedule(flights[3]))
    wait_for("the fourth to wait", lambda: requests.load()[1] == 2)
    flights[0].generated = 5
    assert requests.load() == (2, 2, 10 + 5 + 20)  # running, waiting, KV tokens held
    requests.unschedule(flights[1])  # a slot: the first in line runs, the other still waits
    third.join(10)
    assert third_out == {"result": True} and fourth.is_alive()
    assert requests.load() == (2, 1, 15 + 30) and flights[3].scheduled is None
    requests.unschedule(flights[0])
    fourth.join(10)
    assert fourth_out == {"result": True} and requests.load() == (2, 0, 30 + 40)
    requests.unschedule(flights[0])  # twice, or never scheduled: nothing
    assert requests.batch == 2


def test_the_shutdown_aborts_the_queue(sim: Any) -> None:
    life = module(sim, "lifecycle")
    requests = life.Requests(max_num_seqs=1)
    assert requests.schedule(life.Flight(prompt=1, arrived=0.0))
    waiter, out = in_thread(lambda: requests.schedule(life.Flight(prompt=1, arrived=0.0)))
    wait_for("the second to wait", lambda: requests.load()[1] == 1)
    assert requests.shut_down(0) == (0, 0)  # none admitted through admit() here
    waiter.join(10)
    assert out == {"result": False} and requests.load()[:2] == (1, 0)
