"""Hugging Face checkpoint tokenizers through the `tokenizers` library (``HFTokenizer``): a checkpoint's
tokenizer.json with its tokenizer_config.json (named special tokens, chat templates, ``add_bos_token``),
loaded and saved so that transformers' AutoTokenizer reads the same ids and template.

    tok = HFTokenizer.from_pretrained(checkpoint_dir)   # or from_file(tokenizer.json), train_bpe(texts, 300)
    tok.save(out_dir)                                   # tokenizer.json, tokenizer_config.json, templates
    tok = with_tokens(tok, ["<answer>", "</answer>"])   # a copy with new special tokens (the next ids)

Any checkpoint (a llama.cpp ``.gguf`` file, a packaged name too): ``models.lm.pretrained.load_tokenizer``.
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Mapping, Sequence

from jaxrl_reason.models.tokenizer.base import DEFAULT_SPECIAL, Tokenizer

NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(token) -> str | None:
    """A token given as a string or in the AddedToken dict form {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


def read_json_object(path: pathlib.Path) -> dict:
    """A JSON file holding an object, as a dict (ValueError naming the file and the position otherwise)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` with a checkpoint's tokenizer_config: named special tokens, `chat_template`,
    `add_bos_token`, `model_max_length`. pad/bos/eos: given, else from the config, else guessed from common
    names (pad falls back to eos); without a config (`from_file`) the guesses are the named tokens.
    ``config`` keeps every field of the checkpoint's tokenizer_config.json (`save` writes them back);
    ``template_files``: the chat templates came from chat_template.jinja / additional_chat_templates/
    (`from_pretrained`), so `save` writes them there again rather than into tokenizer_config.json."""

    template_files: bool = False

    def __init__(self, tk, pad: str | None = None, bos: str | None = None, eos: str | None = None,
                 config: Mapping | None = None, chat_template: str | dict[str, str] | None = None):
        self.tk = tk
        self.config = dict(config or {})
        vocab = tk.get_vocab(with_added_tokens=True)
        named = {k: _content(self.config[k]) for k in NAMED_TOKENS if self.config.get(k) is not None}
        named.update({k: v for k, v in (("pad_token", pad), ("bos_token", bos), ("eos_token", eos)) if v})
        for k, v in named.items():
            if v not in vocab:
                raise ValueError(f"{k} {v!r} is not in the tokenizer vocabulary")

        def pick(key, *cands):
            if named.get(key):
                return named[key]
            for c in cands:
                if c in vocab:
                    return c
            raise ValueError(f"no {key} given and none of {cands} is in the tokenizer vocabulary")

        self.eos = pick("eos_token", "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
        self.bos = pick("bos_token", "<|im_start|>", "<s>", "<|begin_of_text|>", "<bos>", self.eos)
        self.pad = pick("pad_token", "<|endoftext|>", "<pad>", "<unk>", self.eos)
        self.special_tokens_map = named if config is not None else {**named, "bos_token": self.bos,
                                                                    "eos_token": self.eos, "pad_token": self.pad}
        self.vocab_size = max(vocab.values()) + 1  # every id, added tokens included
        add_bos = self.config.get("add_bos_token")  # else: whether the post-processor prepends bos
        self.add_bos_token = bool(add_bos) if add_bos is not None else tk.encode("").ids[:1] == [self.bos_id]
        self.model_max_length = self.config.get("model_max_length")
        t = chat_template if chat_template is not None else self.config.get("chat_template")
        if isinstance(t, list):  # [{"name": ..., "template": ...}, ...]
            t = {d["name"]: d["template"] for d in t}
        if t is not None and not isinstance(t, (str, dict)):
            raise ValueError(f"chat_template must be a string or a list of named templates, got {type(t).__name__}")
        self.chat_template = t

    @classmethod
    def train_bpe(cls, texts: Sequence[str], vocab_size: int, special_tokens: Sequence[str] = DEFAULT_SPECIAL,
                  eos: str = "<eos>", pad: str = "<pad>", bos: str = "<bos>",
                  chat_template: str | None = None) -> "HFTokenizer":
        """A byte-level BPE tokenizer trained on ``texts`` with the `tokenizers` library; ``special_tokens``
        (which must include eos, pad and bos) are single ids 0.. in order. Saved with ``save`` it is a
        checkpoint tokenizer that transformers' AutoTokenizer loads."""
        from tokenizers import Tokenizer as _Tk, decoders, models, pre_tokenizers, trainers

        missing = [t for t in (eos, pad, bos) if t not in special_tokens]
        if missing:
            raise ValueError(f"train_bpe: {missing} must be among special_tokens {list(special_tokens)}")
        tk = _Tk(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        tk.train_from_iterator(list(texts), trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        config = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "add_bos_token": False}
        return cls(tk, config=config, chat_template=chat_template)

    @classmethod
    def from_file(cls, path, **kw) -> "HFTokenizer":
        """A bare tokenizer.json (no config: no chat template, named tokens guessed)."""
        from tokenizers import Tokenizer as _Tk

        return cls(_Tk.from_file(str(path)), **kw)

    @classmethod
    def from_pretrained(cls, directory, **kw) -> "HFTokenizer":
        """A checkpoint directory: tokenizer.json (required), tokenizer_config.json and special_tokens_map.json
        (optional; named tokens come from the config first), chat_template.jinja and additional_chat_templates/*.jinja
        (optional; they take priority over the config's chat_template, as in transformers). Any checkpoint (a
        llama.cpp ``.gguf`` file, a packaged name too): ``models.lm.pretrained.load_tokenizer``."""
        from tokenizers import Tokenizer as _Tk

        d = pathlib.Path(directory)
        if not d.exists():
            from jaxrl_reason.models.lm.packaged import not_found

            raise FileNotFoundError(not_found(directory))
        if not (d / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {d} (only fast tokenizers, made by the tokenizers "
                                    "library, are supported)")
        try:
            tk = _Tk.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise ValueError(f"{d / 'tokenizer.json'}: cannot load it: {e}") from e
        cfg = read_json_object(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
        if (d / "special_tokens_map.json").is_file():
            for k, v in read_json_object(d / "special_tokens_map.json").items():
                if k in NAMED_TOKENS and cfg.get(k) is None:
                    cfg[k] = v
        added = {i: t.content for i, t in tk.get_added_tokens_decoder().items()}
        for i, t in cfg.get("added_tokens_decoder", {}).items():
            if added.get(int(i)) != _content(t):
                raise ValueError(f"{d / 'tokenizer_config.json'}: added_tokens_decoder[{i}] = {_content(t)!r} but "
                                 f"tokenizer.json has {added.get(int(i))!r} at that id")
        files = {"default": d / "chat_template.jinja"} if (d / "chat_template.jinja").is_file() else {}
        files.update({f.name.removesuffix(".jinja"): f for f in sorted(d.glob("additional_chat_templates/*.jinja"))})
        templates = {k: f.read_text(encoding="utf-8") for k, f in files.items()}
        from_files = bool(templates) and "chat_template" not in kw
        if from_files:
            kw["chat_template"] = templates["default"] if list(templates) == ["default"] else templates
        tok = cls(tk, config=cfg, **kw)
        tok.template_files = from_files
        return tok

    def save(self, directory) -> None:
        """Write tokenizer.json, tokenizer_config.json (the loaded config's fields, named tokens, added tokens)
        and special_tokens_map.json so that transformers' AutoTokenizer loads the same ids and template; the
        chat template goes where it was loaded from (``template_files``: chat_template.jinja for the default,
        additional_chat_templates/NAME.jinja for the others), else into tokenizer_config.json."""
        d = pathlib.Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.tk.save(str(d / "tokenizer.json"))
        cfg = {k: v for k, v in self.config.items() if k not in ("auto_map", "tokenizer_file", "chat_template")}
        cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        cfg.update(self.special_tokens_map)
        cfg["added_tokens_decoder"] = {
            str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                     "single_word": t.single_word, "special": t.special}
            for i, t in sorted(self.tk.get_added_tokens_decoder().items())}
        if self.model_max_length is not None:
            cfg["model_max_length"] = self.model_max_length
        t = self.chat_template
        if t is not None and self.template_files:
            for name, source in ({"default": t} if isinstance(t, str) else t).items():
                f = d / ("chat_template.jinja" if name == "default" else f"additional_chat_templates/{name}.jinja")
                f.parent.mkdir(exist_ok=True)
                f.write_text(source, encoding="utf-8")
        elif t is not None:
            cfg["chat_template"] = t if isinstance(t, str) else [{"name": k, "template": v} for k, v in t.items()]
            if isinstance(t, str) and (d / "chat_template.jinja").exists():  # it would win over the config
                (d / "chat_template.jinja").write_text(t, encoding="utf-8")
        for name, data in (("tokenizer_config.json", cfg), ("special_tokens_map.json", self.special_tokens_map)):
            (d / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @functools.cached_property
    def control_tokens(self) -> tuple[str, ...]:
        """Every added token except non-special whitespace ones (e.g. Gemma's "\\n" tokens, ordinary text)."""
        return tuple(t.content for t in self.tk.get_added_tokens_decoder().values()
                     if t.special or not t.content.isspace())

    def token_to_id(self, token: str) -> int:
        i = self.tk.token_to_id(token)
        if i is None:
            raise KeyError(f"{token!r} is not in the tokenizer vocabulary")
        return i

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Without `allow_special`, added tokens (special or not) are not matched: the text goes through
        normalizer, pre-tokenizer and model only (transformers' `_encode_without_added_tokens`)."""
        if allow_special:
            return self.tk.encode(text, add_special_tokens=False).ids
        if self.tk.normalizer is not None:
            text = self.tk.normalizer.normalize_str(text)
        parts = [p for p, _ in self.tk.pre_tokenizer.pre_tokenize_str(text)] if self.tk.pre_tokenizer else [text]
        return [t.id for p in parts for t in self.tk.model.tokenize(p)]

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special)


def with_tokens(tokenizer: HFTokenizer, tokens: Sequence[str]) -> HFTokenizer:
    """A copy of ``tokenizer`` (an ``HFTokenizer``) with ``tokens`` appended as special tokens (the next ids)."""
    from tokenizers import AddedToken, Tokenizer as _Tk

    tk = _Tk.from_str(tokenizer.tk.to_str())
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in tokens])
    return HFTokenizer(tk, pad=tokenizer.pad, bos=tokenizer.bos, eos=tokenizer.eos, config=tokenizer.config,
                       chat_template=tokenizer.chat_template)
