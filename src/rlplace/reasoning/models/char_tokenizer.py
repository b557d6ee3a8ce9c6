"""A character-level tokenizer built locally with `tokenizers`, saved as an ordinary Hugging Face tokenizer.

Arithmetic answers are short strings of digits; a character vocabulary makes every digit one token, so the model
never has to learn how a BPE vocabulary happens to split numbers, and the whole tokenizer is built offline in
milliseconds. It is a `PreTrainedTokenizerFast`, so transformers, vLLM and users load it with
`AutoTokenizer.from_pretrained(folder)` like any other.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
"""Ids 0-3, in this order; the model config names the same ids."""
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
"""Newline and printable ASCII: enough for arithmetic and for plain-text prompts of a dataset task."""
assert set(string.digits) <= set(CHARACTERS)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; a BOS token starts every encoded text; decoding joins characters without spaces."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
