"""Generation throughput of the hf and vllm engines on the tiny LM: tokens/s at several batch sizes, and start time.

Every response is exactly `--max-new-tokens` long (EOS ignored), so both engines generate the same number of
tokens. Prompts are arithmetic problems ("37+45="); sampling at temperature 1 with per-sequence seeds, as in a
rollout. Each cell is the median over `--repeats` timed runs after one untimed warm-up run at that batch size.
Engine start counts from the call to `make_engine` to a ready engine (vllm's import excluded, timed apart).

    python benchmarks/generation_bench.py                       # builds a tiny LM in a temp folder
    python benchmarks/generation_bench.py --model-path /path/to/hf_folder --batches 1 8 64 256
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from results import write_section

from rlplace.reasoning.generation.engine import make_engine
from rlplace.reasoning.models.tiny_lm import build_tiny_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer


def prompts_for(tokenizer, batch: int) -> list[list[int]]:
    """`batch` problems a+b= with two-digit operands, a fixed sequence so every engine gets the same ones."""
    return [tokenizer(f"{10 + (7 * i) % 90}+{10 + (13 * i) % 90}=")["input_ids"] for i in range(batch)]


def tokens_per_s(engine, prompts: list[list[int]], max_new_tokens: int, repeats: int) -> float:
    """Median generated tokens/s over `repeats` runs, after one warm-up run."""

    def run(seed: int) -> tuple[int, float]:
        start = time.perf_counter()
        out = engine.generate(
            prompts,
            list(range(len(prompts))),
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            seed=seed,
            ignore_eos=True,
        )
        seconds = time.perf_counter() - start
        assert all(len(r) == max_new_tokens for r in out)
        return sum(len(r) for r in out), seconds

    run(0)
    rates = []
    for seed in range(1, repeats + 1):
        tokens, seconds = run(seed)
        rates.append(tokens / seconds)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", help="a Hugging Face model folder; default: a fresh tiny LM")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model_path or str(build_tiny_lm(tmp))
        tokenizer = load_tokenizer(path)
        rows = []
        for backend in args.backends:
            if backend == "vllm":
                start = time.perf_counter()
                import vllm  # noqa: F401  (timed apart from the engine start)

                print(f"vllm import: {time.perf_counter() - start:.1f} s")
            start = time.perf_counter()
            engine = make_engine(backend, path, args.device)
            started = time.perf_counter() - start
            rates = [
                tokens_per_s(engine, prompts_for(tokenizer, b), args.max_new_tokens, args.repeats) for b in args.batches
            ]
            rows.append((backend, started, rates))
            del engine

    lines = [
        f"\ngeneration tokens/s, {args.max_new_tokens} new tokens per response, device {args.device}, "
        f"torch threads {torch.get_num_threads()}, median of {args.repeats}",
        "| backend | engine start (s) | " + " | ".join(f"batch {b}" for b in args.batches) + " |",
        "|" + "---|" * (2 + len(args.batches)),
    ]
    for backend, started, rates in rows:
        lines.append(f"| {backend} | {started:.2f} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")
    print("\n".join(lines))
    write_section("generation_bench.py", "\n".join([lines[0], "", *lines[1:]]))


if __name__ == "__main__":
    main()
