"""The tiny LM folder: a real Hugging Face folder that transformers loads back, and the checks on model.path."""

from __future__ import annotations

import pytest
import torch

from rlplace.core.errors import ConfigError
from rlplace.reasoning.models.char_tokenizer import CHARACTERS
from rlplace.reasoning.models.hf_folder import check_model_folder
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=2))


def test_tokenizer_is_one_token_per_character_with_bos(folder):
    tokenizer = load_tokenizer(folder)
    ids = tokenizer("37+45=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 1
    assert len(ids) == 1 + len("37+45=")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "37+45="
    assert tokenizer.decode(tokenizer(CHARACTERS)["input_ids"], skip_special_tokens=True) == CHARACTERS
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 2)


def test_batches_pad_on_the_left(folder):
    batch = load_tokenizer(folder)(["1+2=", "10+20="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :2].tolist() == [0, 0]
    assert batch["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1, 1]


def test_model_loads_back_with_untied_embeddings_and_32_wide_heads(folder):
    model = load_causal_lm(folder)
    config = model.config
    assert config.model_type == "llama" and not config.tie_word_embeddings
    assert config.head_dim == 32 and config.vocab_size == len(load_tokenizer(folder))
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()
    logits = model(torch.tensor([[1, 20, 21]])).logits
    assert logits.shape == (1, 3, config.vocab_size) and logits.dtype == torch.float32


def test_same_seed_same_weights(tmp_path, folder):
    again = load_causal_lm(build_tiny_lm(tmp_path / "again", TinyLMShape(num_layers=2)))
    for a, b in zip(load_causal_lm(folder).parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_model_path_checks_name_the_key(tmp_path, folder):
    assert check_model_folder(folder) == folder
    with pytest.raises(ConfigError, match=r"model.path = None is invalid"):
        check_model_folder(None)
    with pytest.raises(ConfigError, match=r"model.path = '.*nowhere' is invalid: no such folder"):
        check_model_folder(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"not a Hugging Face model folder \(no config.json\)"):
        check_model_folder(tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ConfigError, match="tokenizer missing"):
        check_model_folder(bare)
