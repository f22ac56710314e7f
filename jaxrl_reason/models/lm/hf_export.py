"""Export a model to a Hugging Face checkpoint directory that `transformers` and `load_hf_model` read.

    save_hf_model(model, "out/dir", tokenizer, dtype="bfloat16")

Writes config.json (the HF family chosen from the LMConfig by `export_model_type`, its config from
`HFFamily.hf_config_from_lm`), the weights as safetensors (one ``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json`` above ``max_shard_bytes``)
and, when given, the tokenizer (``tokenizer.save(directory)``). Everything is written to a temporary
directory next to ``path`` and renamed into place at the end: an interrupted export leaves nothing
at ``path``. The tensor names and layouts are those `load_hf_model` reads (`HFFamily.tensor_map`), so
``load_hf_model(export)`` gives back the exported parameters bit for bit (fp32 export).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
import warnings

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.hf_import import INDEX, HFImportError, get_family, param_path
from jaxrl_reason.models.lm.lora import has_lora, merge_lora

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


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


def save_hf_model(model: nnx.Module, path, tokenizer=None, *, dtype: str = "float32",
                  max_shard_bytes: int = 5 * 10**9, overwrite: bool = False) -> pathlib.Path:
    """Write ``model`` (its ``cfg``: an LMConfig) as a HF checkpoint directory at ``path``; returns the path.

    dtype: "float32" or "bfloat16" for the stored weights. Refuses an existing ``path`` unless
    ``overwrite`` (then it is replaced only once the new export is complete). Warns naming each
    parameter with NaN/inf values.
    """
    path = pathlib.Path(path)
    if dtype not in _DTYPES:
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
    cfg = model.cfg
    model_type = export_model_type(cfg)
    family = get_family(model_type)
    hf = family.hf_config_from_lm(cfg)
    hf["torch_dtype"] = hf["dtype"] = dtype
    tensors = _hf_tensors(model, model_type, cfg, _DTYPES[dtype])

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
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


__all__ = ["export_model_type", "save_hf_model"]
