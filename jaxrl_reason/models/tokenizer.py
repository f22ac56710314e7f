"""Tokenizers with one interface, handed to every language-model capability: the 96-id character
tokenizer of the synthetic-task presets (`CharTokenizer`), a byte-level tokenizer with reserved
special tokens (`ByteTokenizer`) and Hugging Face checkpoint tokenizers through the `tokenizers`
library (`HFTokenizer`), all able to render chat templates exactly as transformers does.

    tok = ByteTokenizer()                       # or HFTokenizer.from_pretrained(checkpoint_dir)
    ids = tok.encode("2+2 <answer>")            # list[int]; text from data stays text: "<answer>" is 8 bytes
    ids = tok.encode(tok.chat_prompt("2+2?"), allow_special=True)   # our own template: tags are single ids
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    batch, lens = tok.encode_batch(texts, max_len=64)   # right-padded np.int32 [B, T], [B]
    stop = tok.ids_array(["</answer>", tok.eos])  # jnp int32 ids for use inside jit
    tags = tok.tag_ids()                        # single-token R1 tags for in-jit parsing (ValueError if not)
    stop_tokens, stop_seqs = tok.stops(["</answer>"])   # eos + the strings, as the sampler takes them

Control tokens never come from data: `encode(text)` encodes special/added-token strings as plain text
unless `allow_special=True`, and `apply_chat_template(..., tokenize=True)` wraps every control-token
string found in messages, tools, documents and extra variables in private-use markers before rendering,
then encodes the marked spans as plain text and the template's own text with specials allowed (the
method of transformers' `sanitize_control_tokens=True`), so only the template's control tokens are special.

ByteTokenizer ids: 0..n_special-1 are the special tokens (pad=0, bos, eos, <think>, </think>,
<answer>, </answer>, then `extra_special`), followed by the 256 byte values. CharTokenizer ids: the
same 7 special tokens and <unk> (0..7), then 78 characters (digits, `+-*/=()<>,.:;?! `, letters) and
10 unused ids (96 in all); other characters encode as <unk>.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

import jax.numpy as jnp
import jinja2
import numpy as np
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

R1_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)
DEFAULT_SPECIAL = ("<pad>", "<bos>", "<eos>", "<think>", "</think>", "<answer>", "</answer>")
R1_TAGS = DEFAULT_SPECIAL[3:7]  # <think> </think> <answer> </answer>
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_START, _END = "\U000f0000", "\U000f0001"  # private-use markers around control tokens found in data
_REASONING = ("reasoning_content", "thinking", "reasoning")


# ---- the chat-template environment of transformers (utils/chat_template_utils.py), replicated ----

class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Dict:
    """`dict(...)` / `dict.fromkeys(...)` in templates without handing them the dict type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore attributes (no route to CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set attribute {name!r} on a namespace")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """json.dumps without jinja's HTML escaping, as transformers overrides it."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile like transformers: immutable sandbox, trim/lstrip blocks, loop controls, its globals and tojson."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=_Dict(), namespace=_Namespace)
    return env.from_string(source)


def _plain(x):
    """What a template may see (as transformers): JSON-like data; other objects become '<TypeName>'."""
    if x is None or type(x) in (str, int, float, bool):
        return x
    for base in (str, int, float):  # subclasses (enums, numpy floats) back to the base type
        if isinstance(x, base):
            return base(x) if base is not str else str.__str__(x)
    if isinstance(x, Mapping):
        return {_plain(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (list if isinstance(x, list) else tuple)(_plain(v) for v in x)
    if isinstance(x, np.generic):
        return _plain(x.item())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if callable(getattr(x, "model_dump", None)):
        return _plain(x.model_dump())
    return f"<{type(x).__name__}>"


def _message(m) -> dict:
    """A message as the template sees it: plain data, keys with None dropped, reasoning under all its names."""
    m = _plain(m)
    if not isinstance(m, dict):
        raise TypeError(f"chat messages must be dicts, got {m!r}")
    m = {k: v for k, v in m.items() if v is not None}
    reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
    return m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning}


def _mark(x, control: re.Pattern):
    """Wrap control-token strings inside data in markers (stray markers in the data are removed first)."""
    if isinstance(x, str):
        return control.sub(f"{_START}\\g<0>{_END}", x.replace(_START, "").replace(_END, ""))
    if isinstance(x, dict):
        return {k: _mark(v, control) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_mark(v, control) for v in x]
    return x


def _content(token) -> str | None:
    """A token given as a string or in the AddedToken dict form {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


class TagIds(NamedTuple):
    """Ids of the four R1 tags when each is one token (in-jit response parsing, `tasks.rewards`)."""

    think: int
    think_end: int
    answer: int
    answer_end: int


class Tokenizer:
    """Shared behaviour; subclasses give `encode`, `decode`, `vocab_size`, `token_to_id`, pad/bos/eos,
    `control_tokens` and `special_tokens_map` (the named tokens a chat template sees)."""

    pad: str
    bos: str
    eos: str

    vocab_size: int
    add_bos_token: bool = False
    chat_template: str | dict[str, str] | None = None
    special_tokens_map: dict[str, str]

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Ids of `text`; special-token strings are plain text unless `allow_special`."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int:
        raise NotImplementedError

    @property
    def control_tokens(self) -> tuple[str, ...]:
        """Token strings that must never come from data (encoded as text inside chat messages)."""
        raise NotImplementedError

    @property
    def pad_id(self) -> int:
        return self.token_to_id(self.pad)

    @property
    def bos_id(self) -> int:
        return self.token_to_id(self.bos)

    @property
    def eos_id(self) -> int:
        return self.token_to_id(self.eos)

    def ids_array(self, tokens: Sequence[str]) -> jnp.ndarray:
        """Special-token strings -> int32 id array (stop tokens, reward markers inside jit)."""
        return jnp.asarray([self.token_to_id(t) for t in tokens], jnp.int32)

    def single_token_id(self, text: str) -> int | None:
        """The id of ``text`` when it is one token of this vocabulary (special or not), else None."""
        try:
            return self.token_to_id(text)
        except KeyError:
            ids = self.encode(text)
            return ids[0] if len(ids) == 1 else None

    def char_ids(self) -> np.ndarray:
        """Text spelled one token per character: ``[128]`` int32 (read-only), entry ``b`` the id of ``chr(b)``
        when ``encode(chr(b))`` is one id that decodes back to ``chr(b)``, else -1 (an unknown token, a
        character of several tokens). Computed once per tokenizer. With our character-level tokenizers the
        entries are their own ids; with a byte-level BPE (Qwen2/3, Llama 3, DeepSeek-V3) text spelled through
        it (``spell``) is a valid id sequence, though not the canonical (merged) tokenization -- what jitted
        code that reads or writes one token per character needs."""
        return self._char_ids

    @functools.cached_property
    def _char_ids(self) -> np.ndarray:
        table = np.full(128, -1, np.int32)
        for b in range(128):
            ids = self.encode(chr(b))
            if len(ids) == 1 and self.decode(ids) == chr(b):
                table[b] = ids[0]
        table.setflags(write=False)  # cached: shared by every caller
        return table

    def spell(self, text: str) -> list[int]:
        """``text`` one token per character (``char_ids``); ValueError naming this tokenizer and the first
        character that is not a single token decoding back to itself (every non-ASCII character)."""
        table = self.char_ids()
        ids = [int(table[ord(ch)]) if ord(ch) < 128 else -1 for ch in text]
        if -1 in ids:
            ch = text[ids.index(-1)]
            raise ValueError(f"{type(self).__name__} (vocab_size {self.vocab_size}) does not encode {ch!r} as a single "
                             f"token that decodes back to it (encode gives {self.encode(ch)})")
        return ids

    def tag_ids(self) -> TagIds:
        """The R1 tags' ids; ValueError when one is not a single token (parse decoded text instead)."""
        ids = [self.single_token_id(t) for t in R1_TAGS]
        missing = [t for t, i in zip(R1_TAGS, ids) if i is None]
        if missing:
            raise ValueError(f"{type(self).__name__}: the R1 tags {missing} are not single tokens; token-level "
                             "parsing needs them (use the text rewards of jaxrl_reason.rewards instead)")
        return TagIds(*ids)

    def stops(self, texts: Sequence[str] = ()) -> tuple[jnp.ndarray, jnp.ndarray | None]:
        """Sampler stops for eos and ``texts``: (stop_tokens int32 [S], stop_sequences int32 [Q, L] or None).

        A text that is one token becomes a stop token; a longer one a stop sequence of its plain-text ids
        (`models.lm.sampler.stop_sequence_array`; matched on ids, so a different tokenization of the
        same text does not stop)."""
        from jaxrl_reason.models.lm.sampler import stop_sequence_array

        single = [self.single_token_id(t) for t in texts]
        tokens = [self.eos_id] + [i for i in single if i is not None]
        multi = [t for t, i in zip(texts, single) if i is None]
        seqs = stop_sequence_array(multi, encode=self.encode) if multi else None
        return jnp.asarray(sorted(set(tokens)), jnp.int32), seqs

    def pad_batch(self, seqs: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Id lists right-padded with pad to ``length`` -> (ids [B, length] int32, lengths [B] int32); too long raises."""
        arr = np.full((len(seqs), length), self.pad_id, np.int32)
        lens = np.zeros(len(seqs), np.int32)
        for i, s in enumerate(seqs):
            if len(s) > length:
                raise ValueError(f"sequence of {len(s)} tokens does not fit the padded length {length}: "
                                 f"{self.decode(s)!r}")
            arr[i, : len(s)] = s
            lens[i] = len(s)
        return arr, lens

    def check_model(self, model_cfg, seq_len: int, owner: str) -> None:
        """ValueError unless a model (``LMConfig``) holds ``seq_len`` tokens of this vocabulary."""
        if seq_len > model_cfg.max_seq_len:
            raise ValueError(f"{owner}: a sequence needs {seq_len} tokens > the model's window "
                             f"max_seq_len={model_cfg.max_seq_len}")
        if model_cfg.vocab_size < self.vocab_size:
            raise ValueError(f"{owner}: model vocab_size {model_cfg.vocab_size} < the tokenizer's {self.vocab_size}")

    def encode_batch(self, texts: Sequence[str], max_len: int, add_bos: bool | None = None,
                     allow_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids [B, max_len] int32 and lengths [B]; `add_bos=None` follows `add_bos_token`."""
        add_bos = self.add_bos_token if add_bos is None else add_bos
        return self.pad_batch([([self.bos_id] if add_bos else []) + self.encode(t, allow_special) for t in texts],
                              max_len)

    def decode_batch(self, ids: np.ndarray, lengths: np.ndarray | None = None, skip_special: bool = True) -> list[str]:
        ids = np.asarray(ids)
        lengths = np.full(len(ids), ids.shape[1]) if lengths is None else np.asarray(lengths)
        return [self.decode(row[:n].tolist(), skip_special) for row, n in zip(ids, lengths)]

    def decode_completions(self, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
        """Sampled responses [B, N] (lengths [B], stop token included) -> text with control tokens kept
        (``<answer>``, ``<|im_end|>``: what reward functions parse), except a final eos."""
        out = []
        for row, n in zip(np.asarray(tokens), np.asarray(lengths)):
            ids = row[:n].tolist()
            out.append(self.decode(ids[:-1] if ids and ids[-1] == self.eos_id else ids))
        return out

    def chat_prompt(self, question: str, system: str = R1_SYSTEM) -> str:
        """DeepSeek-R1-Zero template; generation continues after the opening <think>.
        Encode it with `allow_special=True` (the question is inserted verbatim)."""
        return f"{system} User: {question} Assistant: <think>"

    # ---- chat templates ----

    def get_chat_template(self, name: str | None = None, tools=None) -> str:
        """The template source: `name` of a named template (or a template string), else the default one
        ("tool_use" when tools are given and it exists), as transformers chooses."""
        t = self.chat_template
        if isinstance(t, dict):
            if name is not None and name in t:
                return t[name]
            if name is None:
                key = "tool_use" if tools is not None and "tool_use" in t else "default"
                if key not in t:
                    raise ValueError(f"several chat templates {sorted(t)} and no 'default'; pass chat_template=<name>")
                return t[key]
        if name is not None:
            return name
        if t is None:
            raise ValueError("this tokenizer has no chat_template (tokenizer_config.json 'chat_template' or "
                             "chat_template.jinja); pass chat_template=<jinja source>")
        return t

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = False,
                            tokenize: bool = False, tools: Sequence[Mapping] | None = None,
                            documents: Sequence[Mapping] | None = None, chat_template: str | None = None,
                            **extra) -> str | list[int]:
        """Render one conversation exactly as transformers' `apply_chat_template` (variables: messages, tools,
        documents, add_generation_prompt, the named special tokens, `extra`). With `tokenize`, ids in which
        control-token strings from the data are plain text (see module docstring); prefer it to encoding
        the returned string, which cannot tell the template's control tokens from the data's. Not supported:
        batches of conversations, `continue_final_message`, assistant masks, tools given as Python functions."""
        template = compile_chat_template(self.get_chat_template(chat_template, tools))
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation")
        if tools is not None and not all(isinstance(t, Mapping) for t in tools):
            raise TypeError("tools must be JSON-schema dicts")
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise TypeError("documents must be dicts with 'title' and 'text' keys")
        data = ([_message(m) for m in messages], _plain(tools), _plain(documents), _plain(extra))
        if tokenize:
            data = tuple(_mark(x, self._control_re) for x in data)
        chat, tools, documents, extra = data
        text = template.render(messages=chat, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **{**self.special_tokens_map, **extra})
        return self._encode_marked(text) if tokenize else text

    @functools.cached_property
    def _control_re(self) -> re.Pattern:
        tokens = sorted(self.control_tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, tokens)) or "(?!)")

    def _encode_marked(self, text: str) -> list[int]:
        """Ids of a rendered chat: marked control tokens (and text split by lone markers) as plain text,
        the rest with specials allowed. Pieces after the first are encoded after a newline that is then
        removed, so SentencePiece-style tokenizers add no prefix space (as transformers does)."""
        pieces = re.split(f"{_START}({self._control_re.pattern}){_END}|[{_START}{_END}]", text)
        newline = self.encode("\n", allow_special=True)
        ids = self.encode(pieces[0], allow_special=True)
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1
            got = self.encode("\n" + piece, allow_special=not as_text)
            got = got[len(newline):] if got[:len(newline)] == newline else self.encode(piece, allow_special=not as_text)
            if as_text and self.token_to_id(piece) in got:
                raise ValueError(f"cannot keep {piece!r} as text: the tokenizer produces it from plain text")
            ids += got
        return ids


class _ReservedSpecials(Tokenizer):
    """Special tokens at ids 0..n_special-1, then a fixed alphabet (`_encode_text` / `_decode_text`)."""

    def __init__(self, special: Sequence[str], n_alphabet: int, chat_template: str | dict[str, str] | None):
        self.special = tuple(special)
        if len(set(self.special)) != len(self.special):
            raise ValueError(f"duplicate special tokens in {self.special}")
        self._sid = {s: i for i, s in enumerate(self.special)}
        self._split = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True)) + ")")
        self.pad, self.bos, self.eos = "<pad>", "<bos>", "<eos>"
        self.n_special = len(self.special)
        self.vocab_size = self.n_special + n_alphabet
        self.chat_template = chat_template
        self.special_tokens_map = {"bos_token": self.bos, "eos_token": self.eos, "pad_token": self.pad}

    @property
    def control_tokens(self) -> tuple[str, ...]:
        return self.special

    def token_to_id(self, token: str) -> int:
        if token not in self._sid:
            raise KeyError(f"{token!r} is not a special token of this {type(self).__name__}")
        return self._sid[token]

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        ids: list[int] = []
        for part in self._split.split(text) if allow_special else (text,):
            if part in self._sid and allow_special:
                ids.append(self._sid[part])
            elif part:
                ids.extend(self._encode_text(part))
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        out, run = [], []
        for i in np.asarray(ids, np.int64).reshape(-1).tolist():
            if i >= self.n_special:
                run.append(i - self.n_special)
                continue
            out.append(self._decode_text(run))
            run = []
            if not skip_special and i >= 0:
                out.append(self.special[i])
        out.append(self._decode_text(run))
        return "".join(out)

    def _encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode_text(self, alphabet_ids: list[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(_ReservedSpecials):
    """UTF-8 bytes + reserved special tokens; vocab_size = n_special + 256. `chat_template`: optional jinja
    source (its control tokens must be among the special tokens to become single ids)."""

    def __init__(self, extra_special: Sequence[str] = (), chat_template: str | dict[str, str] | None = None):
        super().__init__(tuple(DEFAULT_SPECIAL) + tuple(extra_special), 256, chat_template)

    def _encode_text(self, text: str) -> list[int]:
        return [b + self.n_special for b in text.encode("utf-8")]

    def _decode_text(self, alphabet_ids: list[int]) -> str:
        return bytes(min(b, 255) for b in alphabet_ids).decode("utf-8", errors="replace")


CHARS = "0123456789+-*/=()<>,.:;?! " + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class CharTokenizer(_ReservedSpecials):
    """The synthetic tasks' tokenizer: 8 special tokens (pad=0, bos, eos, the 4 R1 tags, <unk>), 78
    characters and 10 unused ids = 96, so a tiny model spells every prompt, trace and answer and emits a
    tag in one token. Characters outside `CHARS` encode as <unk>; unused ids decode as "<unk>"."""

    def __init__(self, chat_template: str | dict[str, str] | None = None):
        super().__init__(tuple(DEFAULT_SPECIAL) + ("<unk>",), 96 - len(DEFAULT_SPECIAL) - 1, chat_template)
        self._cid = {c: i + self.n_special for i, c in enumerate(CHARS)}
        self.unk_id = self._sid["<unk>"]

    def _encode_text(self, text: str) -> list[int]:
        return [self._cid.get(c, self.unk_id) for c in text]

    def _decode_text(self, alphabet_ids: list[int]) -> str:
        return "".join(CHARS[i] if i < len(CHARS) else "<unk>" for i in alphabet_ids)


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
