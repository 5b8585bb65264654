"""What the simulated model "generates" and how fast: the requests of /v1/chat/completions and
/v1/completions checked as vLLM checks them, the reply's tokens (words of a fixed text, in order,
as many as ``max_tokens`` asks), the token rate the lab sets, and the bodies of a whole answer
and of each server-sent event of a streamed one, in vLLM's shapes. Pure: the HTTP API
(:mod:`vllm.http_api`) times and writes them. A SIMULATION for the servefleet lab.

Token rate: ``/etc/rbln-sim/tokens-per-second`` (under ``$RBLN_SIM_ROOT`` when set), a number
> 0, read for every request (a lab or a test changes it without restarting a server); no file:
:data:`DEFAULT_TOKENS_PER_SECOND`, fast enough that a short chat costs nothing. A per-release
speed factor: ``/etc/rbln-sim/slowdown`` (:func:`slowdown`). When each token is ready, streamed or
not: the timing model, :class:`Timing`.

Streaming (``"stream": true``), as vLLM 0.30's OpenAI server writes it: ``data: JSON\\n\\n`` per
event; for a chat the first event carries ``delta: {"role": "assistant", "content": ""}``, then
one event per token (``delta.content``; the last one carries ``finish_reason``), for a
completion one event per token (``text``); with ``stream_options.include_usage`` an event with
no choices and the usage; then ``data: [DONE]``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .common import SIM_ETC, SimError, sim_path
from .flag_table import _object

REPLY_WORDS = (
    "This is a simulated reply from the servefleet lab; no model ran to produce these words, "
    "which repeat in a fixed order so that tests can predict them"
).split()
DEFAULT_TOKENS_PER_SECOND = 1000.0  # no rate file: a 16-token reply takes 16 ms
DEFAULT_MAX_TOKENS = 16  # a request that names no limit (vLLM: the rest of the context)
TOKENS_FILE = SIM_ETC + "/tokens-per-second"
SLOWDOWN_FILE = SIM_ETC + "/slowdown"
# The timing model's constants (Timing; docs/lab.md, "Serving time")
BATCH_COST = 0.05  # a decode step grows by this share of a lone step per other running request
PREFILL_TOKENS_PER_STEP = 256  # prompt tokens whose prefill costs one lone step's time
ACCEPTANCE = 0.6  # draft tokens accepted per speculative token and step (--speculative-config)
# an unset --max-num-seqs / --max-num-batched-tokens: vLLM 0.30's API-server defaults on an
# H100/H200 (vllm-rbln fills in --max-num-seqs 1 at the parse: common.PLATFORM_DEFAULTS)
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def tokens_per_second(env: Mapping[str, str]) -> float:
    """The lab's token rate: the number in /etc/rbln-sim/tokens-per-second, else the default.

    + env: the environment (RBLN_SIM_ROOT)
    Raises SimError naming the file when it holds anything but a number > 0.
    """
    path = sim_path(env, TOKENS_FILE)
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return DEFAULT_TOKENS_PER_SECOND
    except OSError as exc:
        raise SimError(f"{path}: cannot read it: {exc.strerror}") from None
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not rate > 0:  # also NaN
        raise SimError(f"{path} holds {text[:40]!r}; expected a number of tokens per second > 0")
    return rate


def slowdown(env: Mapping[str, str], subject: str) -> float:
    """The lab's speed factor for this process: lines ``FACTOR MATCH...`` in
    /etc/rbln-sim/slowdown; the first line whose MATCH (the rest of the line, one string; none:
    every process) ``subject`` contains gives FACTOR, a number >= 1 by which every time the
    server takes grows; no file, or no line matches: 1. Read at every request.

    + env: the environment (RBLN_SIM_ROOT)
    + subject: the process's release and command line (``sys.prefix``, a space, argv joined by
      spaces): a release directory holds its release id
    Raises SimError naming the file and the line when a line is not ``FACTOR MATCH...``.
    """
    path = sim_path(env, SLOWDOWN_FILE)
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return 1.0
    except OSError as exc:
        raise SimError(f"{path}: cannot read it: {exc.strerror}") from None
    for factor, match in _slowdown_lines(path, text):
        if match in subject:
            return factor
    return 1.0


@functools.lru_cache(maxsize=8)
def _slowdown_lines(path: str, text: str) -> tuple[tuple[float, str], ...]:
    """The (FACTOR, MATCH) of each line of a slowdown file (blank lines skipped), parsed once
    per content."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.strip().split(None, 1)
        if not words:
            continue
        try:
            factor = float(words[0])
        except ValueError:
            factor = math.nan
        if not (factor >= 1 and math.isfinite(factor)):
            raise SimError(
                f"{path} line {number} holds {line.strip()[:60]!r}; expected FACTOR MATCH... with "
                "FACTOR a number >= 1 (e.g. '1.3 --max-num-seqs 8')"
            )
        out.append((factor, words[1] if len(words) > 1 else ""))
    return tuple(out)


@dataclass(frozen=True)
class Timing:
    """When a request's tokens are ready: the simulator's timing model, deterministic given the
    configuration and the load. With ``T = step`` (FACTOR / rate: the slowdown over the token
    rate), ``b`` the requests running (the request itself included, at most ``max_num_seqs``),
    ``P`` the prompt's tokens, ``B`` = ``max_num_batched_tokens`` and ``g`` = ``tokens_per_step``:

    - a decode step takes ``step(b) = T * (1 + BATCH_COST * (b - 1))``;
    - the prefill runs in ``n = max(1, ceil(P / B))`` chunks, one step each, and its prompt
      tokens cost ``T / PREFILL_TOKENS_PER_STEP`` each: token 0 is ready
      ``prefill(P, b) = n * step(b) + P * T / PREFILL_TOKENS_PER_STEP`` after the request was
      scheduled;
    - every further token ``step(b) / g`` after the one before (a step's ``g`` tokens spread
      evenly), ``g = 1 + ACCEPTANCE * k`` with ``k`` speculative tokens, else 1.

    So at a constant load token ``i`` is ready ``prefill(P, b) + i * step(b) / g`` after the
    request was scheduled (:meth:`ready_at`); the server takes ``b`` anew for every token
    (:meth:`delay`). A request waits in the queue before it is scheduled while ``max_num_seqs``
    others run (:class:`vllm.lifecycle.Requests`). Alone, at the default rate and with a short
    prompt: about ``(i + 1) / rate``, a 16-token reply in 16 ms.

    + step: seconds of one decode step of a request running alone
    + max_num_seqs: ``--max-num-seqs``, the most requests running at once
    + max_num_batched_tokens: ``--max-num-batched-tokens``, the prompt tokens of one prefill chunk
    + tokens_per_step: the tokens a decode step yields
    """

    step: float
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    tokens_per_step: float = 1.0

    def step_seconds(self, batch: int) -> float:
        """``step(b)``: a decode step's time with ``batch`` requests running."""
        running = min(max(batch, 1), self.max_num_seqs)
        return self.step * (1 + BATCH_COST * (running - 1))

    def prefill_seconds(self, prompt: int, batch: int) -> float:
        """``prefill(P, b)``: from the schedule to token 0."""
        chunks = max(1, math.ceil(prompt / self.max_num_batched_tokens))
        return chunks * self.step_seconds(batch) + prompt * self.step / PREFILL_TOKENS_PER_STEP

    def delay(self, index: int, prompt: int, batch: int) -> float:
        """Seconds from token ``index - 1`` (token 0: from the schedule) to token ``index``.

        + index: the token
        + prompt: the prompt's tokens
        + batch: the requests running now
        """
        if index == 0:
            return self.prefill_seconds(prompt, batch)
        return self.step_seconds(batch) / self.tokens_per_step

    def ready_at(self, start: float, index: int, prompt: int, batch: int) -> float:
        """When token ``index`` is ready, the request scheduled at ``start`` (monotonic) and
        ``batch`` requests running throughout.

        + start: when the request was scheduled
        + index: the token
        + prompt: the prompt's tokens
        + batch: the requests running
        """
        decode = index * self.step_seconds(batch) / self.tokens_per_step
        return start + self.prefill_seconds(prompt, batch) + decode


def timing_of(ns: Any, rate: float, factor: float = 1.0) -> Timing:
    """The timing model of a server started with ``ns``.

    + ns: the parsed arguments (``max_num_seqs``, ``max_num_batched_tokens``,
      ``speculative_config``; unset or absent: the defaults)
    + rate: the lab's token rate (:func:`tokens_per_second`)
    + factor: the lab's slowdown of this process (:func:`slowdown`)
    """
    spec = _object(getattr(ns, "speculative_config", None))
    drafts = spec.get("num_speculative_tokens")
    if spec and not (type(drafts) is int and drafts >= 1):
        drafts = 1  # a method whose draft length comes from its model's config
    return Timing(
        step=factor / rate,
        max_num_seqs=getattr(ns, "max_num_seqs", None) or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=(
            getattr(ns, "max_num_batched_tokens", None) or DEFAULT_MAX_NUM_BATCHED_TOKENS
        ),
        tokens_per_step=1 + ACCEPTANCE * (drafts or 0),
    )


class RequestError(Exception):
    """A request vLLM would refuse: HTTP ``code`` with vLLM's error body."""

    def __init__(self, message: str, kind: str = "BadRequestError", code: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.body = error_body(message, kind, code)


def error_body(message: str, kind: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    """vLLM's error response: ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


@dataclass(frozen=True)
class Job:
    """One checked generation request.

    + kind: ``chat`` (/v1/chat/completions) or ``completion`` (/v1/completions)
    + id: the response id (derived from the request body: the same request, the same id)
    + model: the served model name asked for
    + prompt_tokens: the prompt's size (its words; a completion's token ids: their number)
    + max_tokens: how many tokens the reply has
    + stream: answer as server-sent events
    + include_usage: ``stream_options.include_usage``
    + kv_transfer_params: the request's ``kv_transfer_params`` (an object), or None
    """

    kind: str
    id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    kv_transfer_params: dict[str, Any] | None = None

    def tokens(self) -> list[str]:
        """The reply's tokens: the words in order (again from the first when they run out), a
        space before each but the first; joined they are the reply's text."""
        words = [REPLY_WORDS[i % len(REPLY_WORDS)] for i in range(self.max_tokens)]
        return [w if i == 0 else " " + w for i, w in enumerate(words)]

    def usage(self, generated: int) -> dict[str, int]:
        p = self.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": generated, "total_tokens": p + generated}


def _count(value: Any, name: str) -> int | None:
    """An optional integer >= 1 of the request (vLLM's SamplingParams check)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}.")
    if value < 1:
        raise RequestError(f"{name} must be at least 1, got {value}.")
    return value


def _prompt_size(kind: str, req: Mapping[str, Any]) -> int:
    if kind == "chat":
        messages = req.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RequestError("invalid request: expected a JSON object with messages")
        return sum(len(str(m.get("content", "")).split()) for m in messages)
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt)
    raise RequestError(
        "invalid request: prompt must be a string or a list of token ids "
        "(the simulated server answers one prompt per request)"
    )


def parse_job(
    kind: str,
    raw: bytes,
    names: Sequence[str],
    max_model_len: int | None,
    request_id: str | None = None,
) -> Job:
    """The checked request of ``kind`` in body ``raw``; RequestError as vLLM would refuse it.

    + kind: ``chat`` or ``completion``
    + raw: the request body
    + names: the served model names
    + max_model_len: the server's --max-model-len (None or -1: unbounded here)
    + request_id: the ``X-Request-Id`` header, which vLLM makes the response's id (after
      ``chatcmpl-`` or ``cmpl-``); None: an id derived from the body
    """
    try:
        req = json.loads(raw)
    except ValueError:
        req = None
    if not isinstance(req, dict):
        raise RequestError(f"invalid request: expected a JSON object ({kind} request)")
    prompt = _prompt_size(kind, req)
    if req.get("model") not in names:
        msg = f"The model `{req.get('model')}` does not exist."
        raise RequestError(msg, "NotFoundError", 404)
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}.")
    options = req.get("stream_options")
    if options is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object, got {options!r}.")
    n = req.get("n", 1)
    if n != 1:
        raise RequestError(f"n={n!r}: the simulated server answers n=1 only.")
    asked = (
        _count(req.get("max_completion_tokens"), "max_completion_tokens")
        if kind == "chat"
        else None
    )
    asked = asked or _count(req.get("max_tokens"), "max_tokens")
    limit = asked or DEFAULT_MAX_TOKENS
    if max_model_len is not None and max_model_len > 0 and prompt + limit > max_model_len:
        where = "messages" if kind == "chat" else "prompt"
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt + limit} tokens ({prompt} in the {where}, {limit} in the "
            f"completion). Please reduce the length of the {where} or completion."
        )
    kv_params = req.get("kv_transfer_params")
    if kv_params is not None and not isinstance(kv_params, dict):
        raise RequestError(f"kv_transfer_params must be an object, got {kv_params!r:.60}.")
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Job(
        kind=kind,
        id=prefix + (request_id or hashlib.sha1(raw).hexdigest()[:16]),
        model=str(req["model"]),
        prompt_tokens=prompt,
        max_tokens=limit,
        stream=stream,
        include_usage=bool((options or {}).get("include_usage")),
        kv_transfer_params=kv_params,
    )


def _finish(job: Job, generated: int) -> str:
    return "length" if generated == job.max_tokens else "stop"


def answer(job: Job, created: int) -> dict[str, Any]:
    """The whole (non-streamed) answer of ``job``, every token generated."""
    text = "".join(job.tokens())
    n = job.max_tokens
    choice: dict[str, Any]
    if job.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None}
        obj = "text_completion"
    choice["finish_reason"] = _finish(job, n)
    return {
        "id": job.id,
        "object": obj,
        "created": created,
        "model": job.model,
        "choices": [choice],
        "usage": job.usage(n),
    }


def _chunk(job: Job, created: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    return {"id": job.id, "object": obj, "created": created, "model": job.model, "choices": choices}


def first_events(job: Job, created: int) -> list[dict[str, Any]]:
    """The events a stream opens with before any token: a chat's role delta."""
    if job.kind != "chat":
        return []
    delta = {"role": "assistant", "content": ""}
    return [
        _chunk(
            job, created, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        )
    ]


def token_event(job: Job, created: int, index: int, token: str) -> dict[str, Any]:
    """The event of token ``index`` (the last one names why the reply ended)."""
    last = index == job.max_tokens - 1
    choice: dict[str, Any] = {"index": 0}
    if job.kind == "chat":
        choice["delta"] = {"content": token}
    else:
        choice["text"] = token
    choice["logprobs"] = None
    choice["finish_reason"] = _finish(job, index + 1) if last else None
    if last:
        choice["stop_reason"] = None
    return _chunk(job, created, [choice])


def last_events(job: Job, created: int) -> list[dict[str, Any]]:
    """The events after the last token, before ``[DONE]``: the usage, when asked for."""
    if not job.include_usage:
        return []
    return [_chunk(job, created, []) | {"usage": job.usage(job.max_tokens)}]
