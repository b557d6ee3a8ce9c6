"""A model folder's tokenizer, loaded without transformers' model classes.

`AutoTokenizer` imports the auto-model machinery (its class lookup lives beside the model classes), which costs a
process seconds of start-up; the reward workers only decode and never load a causal LM, and every worker process
of a run pays the import. A folder with `tokenizer.json` (every fast tokenizer, what transformers writes) is loaded
by the tokenizers-backed class straight from it; one without (a sentencepiece file alone) goes through
`AutoTokenizer`, whose converters build one.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

TOKENIZER_FILE = "tokenizer.json"


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer, padding on the left so that batched prompts end where generation starts."""
    if (Path(path) / TOKENIZER_FILE).is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        from transformers import AutoTokenizer  # the slow path's converters; see the module's docstring

        tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
