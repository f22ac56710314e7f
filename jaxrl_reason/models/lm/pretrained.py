"""A pretrained checkpoint from wherever it comes: a Hugging Face directory, a llama.cpp ``.gguf`` file or the
name of a packaged checkpoint (``models.lm.packaged``). Every LM experiment's ``--model`` goes through here: an
argument that is none of them is a one-line FileNotFoundError saying how to fetch it (nothing is downloaded).

    model = load_model("smollm2-135m-instruct", max_seq_len=256)   # or "path/to/dir", "path/to/file.gguf"
    tok = load_tokenizer("smollm2-135m-instruct")                  # an HFTokenizer
"""

from __future__ import annotations

import pathlib

from jaxrl_reason.models.lm.gguf_import import gguf_tokenizer, load_gguf_model
from jaxrl_reason.models.lm.hf_import import load_hf_model
from jaxrl_reason.models.lm.packaged import resolve_checkpoint
from jaxrl_reason.models.tokenizer import HFTokenizer


def _is_gguf(path: pathlib.Path) -> bool:
    return path.suffix == ".gguf" and not path.is_dir()


def load_model(path_or_name, mesh=None, **kwargs):
    """The model of a checkpoint: ``hf_import.load_hf_model`` for a directory, ``gguf_import.load_gguf_model`` for
    a .gguf file (a packaged name resolves to its file); ``kwargs``: theirs (``dtype``, LMConfig overrides)."""
    path = resolve_checkpoint(path_or_name, must_exist=True)
    return (load_gguf_model if _is_gguf(path) else load_hf_model)(path, mesh, **kwargs)


def load_tokenizer(path_or_name, **kwargs) -> HFTokenizer:
    """The tokenizer of a checkpoint: ``HFTokenizer.from_pretrained`` for a directory (``kwargs``: its options),
    the file's own (``gguf_import.gguf_tokenizer``) for a .gguf file."""
    path = resolve_checkpoint(path_or_name, must_exist=True)
    if not _is_gguf(path):
        return HFTokenizer.from_pretrained(path, **kwargs)
    if kwargs:
        raise TypeError(f"load_tokenizer: a .gguf file's tokenizer takes no options, got {sorted(kwargs)}")
    return gguf_tokenizer(path)


__all__ = ["load_model", "load_tokenizer"]
