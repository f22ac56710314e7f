"""Import Hugging Face Qwen2 / Qwen2.5 / Llama checkpoints (config.json + *.safetensors).

    model = load_hf_model("path/to/dir", mesh=make_mesh("fsdp=4,tensor=2"))

The checkpoint is checked first (model type, RoPE scaling, every tensor present with the expected
shape, vocab) and raises one ValueError naming the problem, before anything is compiled. Then each
parameter is built with `jax.make_array_from_callback` from its fitted `NamedSharding`: every
device reads only its own slice from the memory-mapped safetensors files, so a model is never
materialised whole on one device. HF weights are [out, in] and become our [in, out] kernels; our
RoPE uses HF's rotate-half layout, so q/k need no permutation; per-layer tensors are stacked on
the scanned layer axis.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors import safe_open

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sharding import param_specs

SUPPORTED = ("qwen2", "llama")


def config_from_hf(hf: dict, **overrides) -> LMConfig:
    """HF config.json dict -> LMConfig (Qwen2/Qwen2.5/Llama only)."""
    mt = hf.get("model_type")
    if mt not in SUPPORTED:
        raise ValueError(f"unsupported model_type {mt!r}; supported: {SUPPORTED}")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype not in ("default", None):
        raise ValueError(f"RoPE scaling type {rtype!r} is not supported (only plain RoPE)")
    if hf.get("mlp_bias"):
        raise ValueError("mlp_bias=True checkpoints are not supported")
    theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    n_heads = hf["num_attention_heads"]
    kw = dict(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        d_ff=hf["intermediate_size"],
        qkv_bias=True if mt == "qwen2" else bool(hf.get("attention_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope_theta=float(theta),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_seq_len=int(hf.get("max_position_embeddings", 4096)),
    )
    kw.update(overrides)
    return LMConfig(**kw)


def _hf_sources(cfg: LMConfig) -> dict[str, tuple[str, bool, bool]]:
    """our '/'-path -> (HF name with {i} for the layer, transpose?, per-layer?)."""
    m = {
        "embed": ("model.embed_tokens.weight", False, False),
        "final_norm/scale": ("model.norm.weight", False, False),
        "blocks/input_norm/scale": ("model.layers.{i}.input_layernorm.weight", False, True),
        "blocks/post_attn_norm/scale": ("model.layers.{i}.post_attention_layernorm.weight", False, True),
    }
    for p in ("q", "k", "v", "o"):
        m[f"blocks/attn/{p}_proj/kernel"] = (f"model.layers.{{i}}.self_attn.{p}_proj.weight", True, True)
        if cfg.qkv_bias and p != "o":
            m[f"blocks/attn/{p}_proj/bias"] = (f"model.layers.{{i}}.self_attn.{p}_proj.bias", False, True)
    for p in ("gate", "up", "down"):
        m[f"blocks/mlp/{p}/kernel"] = (f"model.layers.{{i}}.mlp.{p}_proj.weight", True, True)
    if not cfg.tie_embeddings:
        m["lm_head/kernel"] = ("lm_head.weight", True, False)
    return m


class _Files:
    """name -> file for one or several safetensors files (memory-mapped, opened lazily)."""

    def __init__(self, path: pathlib.Path):
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors files in {path}")
        self.where: dict[str, pathlib.Path] = {}
        self.shape: dict[str, tuple] = {}
        for f in files:
            with safe_open(f, "np") as h:
                for k in h.keys():
                    self.where[k] = f
                    self.shape[k] = tuple(h.get_slice(k).get_shape())
        self._open: dict[pathlib.Path, Any] = {}

    def read(self, name: str, index: tuple) -> np.ndarray:
        f = self.where[name]
        if f not in self._open:
            self._open[f] = safe_open(f, "np")
        return self._open[f].get_slice(name)[index]


def _check(cfg: LMConfig, files: _Files, sources: dict, shapes: dict) -> None:
    missing = []
    for path, (name, transpose, per_layer) in sources.items():
        names = [name.format(i=i) for i in range(cfg.n_layers)] if per_layer else [name]
        missing += [n for n in names if n not in files.shape]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s): {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    emb = files.shape["model.embed_tokens.weight"]
    if emb[0] != cfg.vocab_size:
        raise ValueError(f"vocab mismatch: checkpoint embedding has {emb[0]} rows, config vocab_size={cfg.vocab_size}")
    for path, (name, transpose, per_layer) in sources.items():
        want = shapes[path][1:] if per_layer else shapes[path]
        got = files.shape[name.format(i=0)]
        got = got[::-1] if transpose else got
        if tuple(got) != tuple(want):
            raise ValueError(f"shape mismatch for {name}: checkpoint {tuple(got)} (after transpose) vs model {tuple(want)}")


def _path(kp) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in kp if getattr(k, "name", None) != "value")


def load_hf_model(path, mesh=None, *, dtype: str | None = None, expected_vocab_size: int | None = None, **overrides):
    """Load a checkpoint directory into a `Transformer`; shard it over `mesh` while loading."""
    path = pathlib.Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ValueError(f"no config.json in {path}")
    if dtype:
        overrides.setdefault("param_dtype", dtype)
        overrides.setdefault("dtype", dtype)
    cfg = config_from_hf(json.loads(cfg_file.read_text()), **overrides)
    if expected_vocab_size is not None and expected_vocab_size > cfg.vocab_size:
        raise ValueError(f"vocab mismatch: tokenizer has {expected_vocab_size} ids, checkpoint vocab_size={cfg.vocab_size}")
    files = _Files(path)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shapes = {_path(kp): x.shape for kp, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    sources = _hf_sources(cfg)
    extra = set(shapes) - set(sources)
    if extra:
        raise ValueError(f"no HF source for parameters {sorted(extra)}")
    _check(cfg, files, sources, shapes)
    specs = param_specs(state, mesh) if mesh is not None else None
    specs_by_path = {} if specs is None else {
        _path(kp): s for kp, s in jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0]
    }
    pdtype = cfg.jparam_dtype

    def build(kp, leaf):
        p = _path(kp)
        name, transpose, per_layer = sources[p]
        sharding = (
            NamedSharding(mesh, specs_by_path[p]) if mesh is not None else jax.sharding.SingleDeviceSharding(jax.devices()[0])
        )

        def read(idx: tuple) -> np.ndarray:
            idx = tuple(idx) + (slice(None),) * (len(leaf.shape) - len(idx))
            if per_layer:
                layers = range(*idx[0].indices(cfg.n_layers))
                inner = idx[1:][::-1] if transpose else idx[1:]
                arrs = [files.read(name.format(i=i), inner) for i in layers]
                arrs = [a.T if transpose else a for a in arrs]
                return np.stack(arrs).astype(pdtype)
            a = files.read(name, idx[::-1] if transpose else idx)
            return (a.T if transpose else a).astype(pdtype)

        return jax.make_array_from_callback(leaf.shape, sharding, read)

    loaded = jax.tree_util.tree_map_with_path(build, state)
    return nnx.merge(graphdef, loaded)


__all__ = ["config_from_hf", "load_hf_model"]
