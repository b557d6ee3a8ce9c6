"""Responses made in turns with a tool whose calls take time: one call at a time against
`rollout.multi_turn.max_concurrent_calls` at once (`generation.calls`).

The tiny LM (1.2 M parameters, random init, on CPU; the hf engine, or vLLM with `--backend vllm`) answers 64
arithmetic prompts in turns of at most 32 new tokens, sampled at temperature 1 with per-sequence seeds as in a
rollout. Its call end is the token most of its responses hold (found in a first, untimed pass), so that most
responses make a call. The tool waits `--latency` seconds per call before answering (a `time.sleep`, standing for a
sandbox's or a search engine's round trip) and answers a fixed text; latency 0 shows what running calls on threads
costs a tool that answers at once. A call starts when the engine reports its row's turn ended (vLLM at the step that
ends it, the hf engine every 8 decode steps), while the other rows decode. Each cell is the median of `--repeats`
timed `MultiTurn.generate` calls; every concurrency must make the same responses.

    .venv/bin/python benchmarks/tool_calls.py
    .venv/bin/python benchmarks/tool_calls.py --backend vllm
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time

from results import publish

from rlplace.reasoning.config import MultiTurnConfig
from rlplace.reasoning.generation.engine import make_engine
from rlplace.reasoning.generation.turns import MultiTurn
from rlplace.reasoning.models.tiny_lm import build_tiny_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import reward_function
from rlplace.reasoning.tasks.prompts import Problem

ROWS, NEW_TOKENS, CALLS = 64, 32, 2
LATENCY = {"s": 0.0}
"""The tool's wait per call, set per table row."""


def waiting_tool(call: str, extra) -> str:
    """The benchmark's tool: answers after LATENCY["s"] seconds."""
    if LATENCY["s"]:
        time.sleep(LATENCY["s"])
    return "42"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", nargs="+", type=float, default=[0.0, 0.05, 0.2])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()

    folder = build_tiny_lm(tempfile.mkdtemp(prefix="tool-calls-"))
    tokenizer = load_tokenizer(folder)
    engine = make_engine(args.backend, str(folder), "cpu")
    prompts = [tokenizer(f"{10 + (7 * i) % 90}+{10 + (13 * i) % 90}=")["input_ids"] for i in range(ROWS)]
    problems = [Problem("", "")] * ROWS
    sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "seed": 0}
    pilot = engine.generate(prompts, list(range(ROWS)), ignore_eos=True, **sampling)
    frequent = collections.Counter(t for response in pilot for t in set(response)).most_common(1)[0][0]
    call_end = tokenizer.decode([frequent])

    lines = [
        "| tool latency | concurrent calls | calls | s per generate | vs one at a time | same responses |",
        "|---|---|---|---|---|---|",
    ]
    for latency in args.latency:
        LATENCY["s"] = latency
        serial_s, reference = None, None
        for concurrency in args.concurrency:
            settings = MultiTurnConfig(
                tool=f"{__name__}:waiting_tool",
                call_end=call_end,
                response_template="{result}",
                max_tool_calls=CALLS,
                max_concurrent_calls=concurrency,
            )
            turns = MultiTurn(tokenizer, settings, reward_function("exact_match"), chat=False)
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                made = turns.generate(engine, prompts, list(range(ROWS)), problems, **sampling)
                seconds.append(time.perf_counter() - start)
            median = statistics.median(seconds)
            serial_s = serial_s or median
            reference = reference or made
            lines.append(
                f"| {latency * 1000:.0f} ms | {concurrency} | {sum(made.calls)} | {median:.3f} | "
                f"{serial_s / median:.2f}x | {'yes' if made == reference else 'NO'} |"
            )
    caption = (
        f"{ROWS} prompts, at most {NEW_TOKENS} new tokens and {CALLS} tool calls each, the tiny LM on the "
        f"{args.backend} engine (CPU), call end {call_end!r}; median of {args.repeats} runs a cell."
    )
    publish("tool_calls.py" + (" --backend vllm" if args.backend == "vllm" else ""), caption, lines)
    sys.exit(0 if all(line.endswith("yes |") for line in lines[2:]) else 1)


if __name__ == "__main__":
    main()
