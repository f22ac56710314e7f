"""Export a model to a Hugging Face checkpoint directory that `transformers` and `load_hf_model` read.

    save_hf_model(model, "out/dir", tokenizer, source="the/dir/it/was/loaded/from", dtype="bfloat16")

Writes what transformers' ``save_pretrained`` writes for the family: config.json (the HF family chosen
from the LMConfig by `export_model_type`, its config from `HFFamily.hf_config_from_lm`, with the
special-token ids and the weights' ``dtype``), generation_config.json, the weights as safetensors (one
``model.safetensors``, or shards ``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``
above ``max_shard_bytes``) and, when given, the tokenizer (``tokenizer.save(directory)``: tokenizer.json,
tokenizer_config.json, the chat template where it was loaded from).

With ``source`` (the checkpoint directory the model was loaded from) the export is a drop-in
replacement for it: its config.json is the base, and only the fields whose value the LMConfig changed
are replaced (so ``bos/eos/pad_token_id``, ``initializer_range``, ``transformers_version``, RoPE extras
... are kept as they were), and its generation_config.json is kept whole (sampling defaults too). Without
one, the special ids come from the tokenizer, and generation stops at its eos and at the chat template's
end-of-turn token (ChatML's ``<|im_end|>``) when that differs. Everything is written to a temporary
directory next to ``path`` and renamed into place at the end: an interrupted export leaves nothing at
``path``. The tensor names and layouts are those `load_hf_model` reads (`HFFamily.tensor_map`), so
``load_hf_model(export)`` gives back the exported parameters bit for bit (fp32 export).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
import warnings

import jax
import jinja2
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.hf_import import (INDEX, HFImportError, config_from_hf, get_family, param_path,
                                              read_hf_config)
from jaxrl_reason.models.lm.lora import has_lora, merge_lora
from jaxrl_reason.models.lm.packaged import resolve_checkpoint
from jaxrl_reason.models.tokenizer import Tokenizer, read_json_object

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: source config.json fields never carried over: the exported weights are plain floats (no quantization) run
#: by transformers' own class of the family (no remote code)
DROPPED = ("quantization_config", "auto_map")
GENERATION_CONFIG = "generation_config.json"


def export_model_type(cfg: LMConfig) -> str:
    """The HF model_type nearest to ``cfg``: deepseek_v3 for MLA / MoE / MTP (if that family is
    registered), qwen3 with qk_norm, qwen2 with a qkv bias, mistral with a sliding window, else llama.
    ``HFImportError`` naming the feature when no HF architecture matches."""
    if cfg.fp8:
        raise HFImportError("LMConfig.fp8=True: no HF architecture runs these FP8 block-scaled matmuls; export "
                            "a copy with fp8=False (the weights are the same, the logits are not)")
    deepseek = [name for name, on in (("attention='mla'", cfg.attention == "mla"), ("n_routed_experts>0", cfg.is_moe),
                                      ("mtp_depth>0", cfg.mtp_depth > 0)) if on]
    if deepseek:
        try:
            get_family("deepseek_v3")
        except HFImportError:
            raise HFImportError(f"LMConfig {', '.join(deepseek)}: only the deepseek_v3 HF architecture has this, "
                                "and its family is not available (jaxrl_reason.models.lm.hf_deepseek)") from None
        return "deepseek_v3"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.qkv_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


def _hf_tensors(model: nnx.Module, model_type: str, cfg: LMConfig, dtype) -> dict[str, np.ndarray]:
    """HF name -> array in ``dtype`` for every state leaf of the model (unstacked, transposed)."""
    tmap = get_family(model_type).tensor_map(cfg)
    out = {}
    for kp, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]:
        p = param_path(kp)
        if p not in tmap:
            raise HFImportError(f"parameter {p!r} has no place in a {model_type} checkpoint")
        t, a = tmap[p], np.asarray(jax.device_get(leaf))
        if not np.all(np.isfinite(a)):
            warnings.warn(f"parameter {p} has {np.sum(~np.isfinite(a))} non-finite (NaN/inf) value(s); exported as is",
                          RuntimeWarning, stacklevel=3)
        for ix, name in t.names(a.shape).items():
            out[name] = np.ascontiguousarray(t.to_hf(a[ix]).astype(dtype))
    return out


def _shards(tensors: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
    """Greedy split in order; a tensor larger than max_bytes gets a shard of its own."""
    shards, size = [{}], 0
    for name, a in tensors.items():
        if shards[-1] and size + a.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    return shards


def _read_source(source) -> tuple[dict | None, dict | None]:
    """(config.json, generation_config.json or None) of the checkpoint directory ``source``; (None, None) for a
    llama.cpp .gguf file (or the packaged checkpoint's name): its special ids are its tokenizer's, which the
    export then writes as without a source."""
    d = resolve_checkpoint(source)
    if d.suffix == ".gguf" and d.is_file():
        return None, None
    if not d.is_dir():
        raise HFImportError(f"source {d} is not a checkpoint directory (config.json + *.safetensors): pass the "
                            "directory the model was loaded from, or source=None")
    gen = d / GENERATION_CONFIG
    return read_hf_config(d), read_json_object(gen) if gen.is_file() else None


def _model_type(cfg: LMConfig, src: dict | None) -> str:
    """`export_model_type`, or the source's model_type when its family expresses ``cfg`` too (e.g. a Mistral
    checkpoint without a sliding window stays mistral)."""
    model_type = export_model_type(cfg)
    theirs = None if src is None else src.get("model_type")
    if theirs not in (None, model_type):
        try:
            get_family(theirs).hf_config_from_lm(cfg)
            return theirs
        except HFImportError:
            pass
    return model_type


def _tokenizer_ids(tokenizer) -> dict[str, int]:
    """config.json's special ids from a `Tokenizer`: eos, and bos / pad when the tokenizer names them
    (not guessed); {} for other objects."""
    if not isinstance(tokenizer, Tokenizer):
        return {}
    named = tokenizer.special_tokens_map
    ids = {f"{k}_id": tokenizer.token_to_id(named[k]) for k in ("bos_token", "pad_token") if named.get(k)}
    return ids | {"eos_token_id": tokenizer.eos_id}


def end_of_turn_id(tokenizer) -> int | None:
    """The id of the control token the chat template writes right after an assistant message (ChatML's
    ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``); None without a template, when it
    fails to render a user + assistant exchange, or writes no control token there."""
    probe = "end-of-turn probe 7f3a"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": probe}])
    except (ValueError, TypeError, KeyError, jinja2.TemplateError):
        return None
    at = text.rfind(probe)
    hits = [t for t in tokenizer.control_tokens if at >= 0 and text.startswith(t, at + len(probe))]
    return tokenizer.token_to_id(max(hits, key=len)) if hits else None


def _hf_config(cfg: LMConfig, model_type: str, src: dict | None, tokenizer) -> dict:
    """config.json: the family's fields from ``cfg``, over the source's config.json when given (only the
    fields whose value ``cfg`` changed are replaced: those whose value differs from the source's own
    LMConfig's), else with the tokenizer's special ids."""
    family = get_family(model_type)
    ours = family.hf_config_from_lm(cfg)
    if src is None:
        return ours | _tokenizer_ids(tokenizer)
    if src.get("model_type") != model_type:  # another architecture: only the source's special ids carry over
        return ours | {k: src[k] for k in TOKEN_IDS if k in src}
    try:
        before = family.hf_config_from_lm(config_from_hf(src))
    except HFImportError:  # a source that loads only with overrides (e.g. mtp_depth=0): all of ours replaces it
        before = {}
    missing = object()
    return ({k: v for k, v in src.items() if k not in DROPPED}
            | {k: v for k, v in ours.items() if before.get(k, missing) != v})


def _generation_config(hf: dict, src_gen: dict | None, from_source: bool, tokenizer) -> dict:
    """generation_config.json: the source's unchanged; else the special ids of config.json (as transformers
    derives it from a config), eos extended with the chat template's end-of-turn token (no source)."""
    if src_gen is not None:
        return src_gen
    gen = {k: hf[k] for k in TOKEN_IDS if hf.get(k) is not None}
    if from_source:
        return {"_from_model_config": True} | gen
    eot = end_of_turn_id(tokenizer) if isinstance(tokenizer, Tokenizer) else None
    if eot is not None and eot != gen.get("eos_token_id", eot):
        gen["eos_token_id"] = [gen["eos_token_id"], eot]
    return gen


def save_hf_model(model: nnx.Module, path, tokenizer=None, *, source=None, dtype: str | None = None,
                  max_shard_bytes: int = 5 * 10**9, overwrite: bool = False) -> pathlib.Path:
    """Write ``model`` (its ``cfg``: an LMConfig) as a HF checkpoint directory at ``path``; returns the path.

    source: the HF checkpoint directory ``model`` was loaded from (may be ``path`` itself with ``overwrite``;
    it is read first): its config.json is kept but for the fields the LMConfig changed, its
    generation_config.json whole (see the module docstring). dtype: "float32" or "bfloat16" for the
    stored weights; None: the source's when it is one of these, else "float32". Refuses an existing
    ``path`` unless ``overwrite`` (then it is replaced only once the new export is complete). Warns naming
    each parameter with NaN/inf values.
    """
    path = pathlib.Path(path)
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {dtype!r}")
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    if tokenizer is not None and not callable(getattr(tokenizer, "save", None)):
        raise TypeError(f"tokenizer {type(tokenizer).__name__} has no save(directory) method; export it separately "
                        "or pass tokenizer=None")
    if has_lora(model):  # LoRA adapters are folded into the weights (W + alpha/r * A @ B)
        model = merge_lora(model)
    src, src_gen = _read_source(source) if source is not None else (None, None)  # (None, None) for a .gguf
    cfg = model.cfg
    model_type = _model_type(cfg, src)
    hf = _hf_config(cfg, model_type, src, tokenizer)
    if dtype is None:
        dtype = next((d for d in (hf.get("dtype"), hf.get("torch_dtype")) if d in _DTYPES), "float32")
    for key in [k for k in ("dtype", "torch_dtype") if k in hf] or ("dtype", "torch_dtype"):
        hf[key] = dtype  # the stored weights' dtype (transformers >= 5 reads "dtype", older "torch_dtype")
    gen = _generation_config(hf, src_gen, src is not None, tokenizer)
    tensors = _hf_tensors(model, model_type, cfg, _DTYPES[dtype])

    def write(tmp: pathlib.Path) -> None:
        for name, data in (("config.json", hf), (GENERATION_CONFIG, gen)):
            (tmp / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        shards = _shards(tensors, max_shard_bytes)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for k, shard in enumerate(shards):
                fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map |= dict.fromkeys(shard, fname)
            total = sum(a.nbytes for a in tensors.values())
            (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        if tokenizer is not None:
            tokenizer.save(tmp)

    return write_directory(path, write, overwrite)


def write_directory(path, write, overwrite: bool = False) -> pathlib.Path:
    """``write(tmp)`` fills a fresh temporary directory next to ``path``, which is then renamed to ``path``: an
    interrupted write leaves nothing there, and an existing ``path`` (refused unless ``overwrite``) is replaced
    only once the new one is complete. Returns ``path``."""
    path = pathlib.Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        write(tmp)
        if path.exists():  # overwrite: move the old one aside, put the new one in place, then delete the old
            old = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            path.rename(old / "x")
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


__all__ = ["end_of_turn_id", "export_model_type", "save_hf_model", "write_directory"]
