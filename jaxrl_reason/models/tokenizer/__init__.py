"""Tokenizers with one interface, handed to every language-model capability: the 96-id character
tokenizer of the synthetic-task presets (`CharTokenizer`), a byte-level tokenizer with reserved
special tokens (`ByteTokenizer`) and Hugging Face checkpoint tokenizers through the `tokenizers`
library (`HFTokenizer`), all able to render chat templates exactly as transformers does.

    tok = ByteTokenizer()                       # or HFTokenizer.from_pretrained(checkpoint_dir)
    ids = tok.encode("2+2 <answer>")            # list[int]; text from data stays text: "<answer>" is 8 bytes
    ids = tok.encode(tok.chat_prompt("2+2?"), allow_special=True)   # our own template: tags are single ids
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    batch, lens = tok.encode_batch(texts, max_len=64)   # right-padded np.int32 [B, T], [B]
    stop_tokens, stop_seqs = tok.stops(["</answer>"])   # eos + the strings, as the sampler takes them

One job per module, every public name re-exported here:

- ``base``: the ``Tokenizer`` base class (encode / decode / ids, R1 tags, spelling, stops, padding, model checks);
- ``chat``: chat templates compiled and rendered as transformers does (the jinja parts);
- ``char``: ``ByteTokenizer`` and ``CharTokenizer`` (reserved special tokens, then a fixed alphabet);
- ``spelled``: text spelled one token per character (``byte_ids`` / ``token_bytes`` tables, ``SpelledTokenizer``);
- ``hf``: ``HFTokenizer`` (tokenizer.json + tokenizer_config.json), ``with_tokens``;
- ``gguf``: the ``HFTokenizer`` of a llama.cpp GGUF file.

Control tokens never come from data: `encode(text)` encodes special/added-token strings as plain text
unless `allow_special=True`, and `apply_chat_template(..., tokenize=True)` keeps control-token strings
found in messages, tools, documents and extra variables plain text (``chat``).
"""

from jaxrl_reason.models.tokenizer.base import DEFAULT_SPECIAL, R1_TAGS, TagIds, Tokenizer
from jaxrl_reason.models.tokenizer.char import CHARS, ByteTokenizer, CharTokenizer
from jaxrl_reason.models.tokenizer.chat import R1_SYSTEM, ChatTemplates, compile_chat_template
from jaxrl_reason.models.tokenizer.gguf import PRE_TOKENIZERS, gguf_file_tokenizer
from jaxrl_reason.models.tokenizer.hf import NAMED_TOKENS, HFTokenizer, read_json_object, with_tokens
from jaxrl_reason.models.tokenizer.spelled import (
    MAX_TOKEN_BYTES,
    PRINTABLE,
    UNKNOWN,
    SpelledTokenizer,
    byte_ids,
    byte_offset,
    host_bytes,
    token_bytes,
)

__all__ = ["CHARS", "DEFAULT_SPECIAL", "MAX_TOKEN_BYTES", "NAMED_TOKENS", "PRE_TOKENIZERS", "PRINTABLE", "R1_SYSTEM",
           "R1_TAGS", "UNKNOWN", "ByteTokenizer", "CharTokenizer", "ChatTemplates", "HFTokenizer", "SpelledTokenizer",
           "TagIds", "Tokenizer", "byte_ids", "byte_offset", "compile_chat_template", "gguf_file_tokenizer",
           "host_bytes", "read_json_object", "token_bytes", "with_tokens"]
