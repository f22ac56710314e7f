"""The tokenizer of a llama.cpp GGUF file (``tokenizer.ggml.*``, ``tokenizer.chat_template``) as an
``HFTokenizer``: its own vocabulary, merges, special ids and chat template(s).

    tok = gguf_file_tokenizer(GGUFFile(path))   # or models.lm.gguf_import.gguf_tokenizer(path)

Tokenizers: byte-level BPE (``tokenizer.ggml.model`` gpt2; the split of ``tokenizer.ggml.pre``, see
``PRE_TOKENIZERS``) and SentencePiece BPE (``llama``: byte fallback, merges from the file or from the
token scores). CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens. The file
is read by ``models.lm.gguf_import.GGUFFile`` (anything with its ``meta``, ``get(key, default)`` and
``path`` works); an unsupported tokenizer model or pre-tokenizer is an ``HFImportError`` naming the supported ones.
"""

from __future__ import annotations

import functools

from jaxrl_reason.models.tokenizer.hf import HFTokenizer


def _unsupported(message: str) -> Exception:
    """``models.lm.hf_import.HFImportError`` (imported here: the LM stack imports this module)."""
    from jaxrl_reason.models.lm.hf_import import HFImportError

    return HFImportError(message)


_GPT2_SPLIT, _DIGITS = "gpt2", "digits"  # ByteLevel's own regex (GPT-2's); single digits first, then GPT-2's
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: tokenizer.ggml.pre -> how text is split before byte-level BPE: a regex, _GPT2_SPLIT or _DIGITS (as llama.cpp's
#: llama-vocab.cpp does; the regexes as in transformers' GGUF tokenizers)
PRE_TOKENIZERS = {
    "default": _GPT2_SPLIT, "gpt2": _GPT2_SPLIT, "gpt-2": _GPT2_SPLIT,
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "pixtral"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva"), _DIGITS),
    "tekken": _TEKKEN_SPLIT, "gpt-4o": _GPT4O_SPLIT, "llama4": _GPT4O_SPLIT,
}
_IGNORE_MERGES = ("llama3", "llama-v3", "llama-bpe")  # whole pre-token in vocab wins (llama.cpp, Llama 3)
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type


@functools.cache
def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (byte-level BPE spells every token with these)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _byte_level(f, tokens: list[str], types: list[int]):
    """Byte-level BPE: the file's merges over GPT-2's byte alphabet, text split as ``PRE_TOKENIZERS[pre]``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise _unsupported(f"{f.path}: unsupported pre-tokenizer tokenizer.ggml.pre={pre!r}; supported: "
                           f"{tuple(PRE_TOKENIZERS)}")
    chars = _byte_chars()
    alphabet = set(chars)
    vocab = {t if k in (_CONTROL, _USER_DEFINED) or set(t) <= alphabet else "".join(chars[b] for b in t.encode()): i
             for i, (t, k) in enumerate(zip(tokens, types))}  # added tokens stay as written, they match raw text
    merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges", ())]
    tk = Tokenizer(models.BPE(vocab, merges, ignore_merges=pre in _IGNORE_MERGES))
    split = PRE_TOKENIZERS[pre]
    if split in (_GPT2_SPLIT, _DIGITS):
        digits = [pre_tokenizers.Digits(individual_digits=True)] if split == _DIGITS else []
        tk.pre_tokenizer = pre_tokenizers.Sequence([*digits, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk


def _sentencepiece(f, tokens: list[str], types: list[int]):
    """SentencePiece BPE (Llama 2, Mistral): '▁' for spaces, prefix space on the first word, byte fallback."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in f.meta:
        merges = [tuple(m.split(" ", 1)) for m in f.get("tokenizer.ggml.merges")]
    else:  # every split of a token into two tokens, best-scored token first (as transformers derives them)
        scores = f.get("tokenizer.ggml.scores") or [-i for i in range(len(tokens))]
        pairs = [(s, sorted(((t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab),
                            key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))) for t, s in zip(tokens, scores)]
        merges = sorted(((s, lr) for s, lrs in pairs for lr in lrs),
                        key=lambda x: (-x[0], -len(x[1][0]), -len(x[1][1])))
        merges = [lr for _, lr in merges]
    unk = f.get("tokenizer.ggml.unknown_token_id")
    tk = Tokenizer(models.BPE(vocab, merges, unk_token=None if unk is None else tokens[unk], fuse_unk=True,
                              byte_fallback=True))
    prefix = "first" if f.get("tokenizer.ggml.add_space_prefix", True) else "never"
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prefix, split=False)
    strip = [decoders.Strip(content=" ", left=1)] if prefix == "first" else []
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    return tk


_MODELS = {"gpt2": _byte_level, "llama": _sentencepiece}


def gguf_file_tokenizer(f) -> HFTokenizer:
    """The tokenizer of a parsed GGUF file ``f`` (``models.lm.gguf_import.GGUFFile``) as an `HFTokenizer` with the
    file's named special tokens, ``add_bos_token`` and chat template(s); ``HFImportError`` for a tokenizer model or
    pre-tokenizer we do not read."""
    from tokenizers import AddedToken, processors

    kind, tokens = f.get("tokenizer.ggml.model"), f.get("tokenizer.ggml.tokens")
    if kind not in _MODELS or not tokens:
        raise _unsupported(f"{f.path}: unsupported tokenizer tokenizer.ggml.model={kind!r} (with "
                           f"{len(tokens or ())} tokens); supported: {tuple(_MODELS)}")
    types = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tk = _MODELS[kind](f, tokens, types)
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True)
                           for t, k in zip(tokens, types) if k == _CONTROL])
    tk.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == _USER_DEFINED])
    config = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        i = f.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and i < len(tokens):
            config[name] = tokens[i]
    for flag, default in (("add_bos_token", kind == "llama" or f.get("tokenizer.ggml.pre") in _IGNORE_MERGES),
                          ("add_eos_token", False)):
        config[flag] = bool(f.get(f"tokenizer.ggml.{flag}", default))
    bos, eos = (config.get(f"{k}_token") if config[f"add_{k}_token"] else None for k in ("bos", "eos"))
    if bos or eos:  # encode(text) with special tokens adds them, as llama.cpp does
        wrap = lambda x: " ".join(([bos] if bos else []) + [x] + ([eos] if eos else []))  # noqa: E731
        tk.post_processor = processors.TemplateProcessing(
            single=wrap("$A"), pair=f"{wrap('$A')} {wrap('$B:1')}",
            special_tokens=[(t, tk.token_to_id(t)) for t in dict.fromkeys((bos, eos)) if t])
    template = f.get("tokenizer.chat_template")
    named = {n: f.get(f"tokenizer.chat_template.{n}") for n in f.get("tokenizer.chat_templates") or ()}
    if named:
        template = {**({"default": template} if template is not None else {}), **named}
    return HFTokenizer(tk, config=config, chat_template=template)
