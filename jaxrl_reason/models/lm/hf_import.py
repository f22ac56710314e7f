"""Import Hugging Face Qwen2 / Qwen2.5 / Llama checkpoints (config.json + *.safetensors).

    model = load_hf_model("path/to/dir", mesh=make_mesh("fsdp=4,tensor=2"))

The checkpoint is checked first (config.json's fields and types, model type, RoPE scaling; every
layer's tensors present, floating point and of the expected shape, none left over; vocab) and raises
one ``HFImportError`` (a ValueError) naming the file and the field or tensor, before anything is
compiled. Then each parameter is built with `jax.make_array_from_callback` from its fitted
`NamedSharding`: every device reads only its own slice from the memory-mapped safetensors files, so a model is never
materialised whole on one device. HF weights are [out, in] and become our [in, out] kernels; our
RoPE uses HF's rotate-half layout, so q/k need no permutation; per-layer tensors are stacked on
the scanned layer axis.
"""

from __future__ import annotations

import json
import pathlib
import sys
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


class HFImportError(ValueError):
    """A checkpoint that cannot be imported; the message names the file and the field or tensor."""


_REQUIRED = object()
_KINDS = {  # kind -> (test, description)
    "size": (lambda v: type(v) is int and v > 0, "a positive integer"),
    "number": (lambda v: type(v) in (int, float) and 0 < v <= sys.float_info.max, "a positive finite number"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "object": (lambda v: type(v) is dict, "a JSON object"),
}


def _field(d: dict, key: str, kind: str, source: str, default=_REQUIRED, prefix: str = ""):
    """``d[key]`` checked against ``kind``; absent or null -> ``default`` (``HFImportError`` if required)."""
    v = d.get(key)
    if v is None:
        if default is _REQUIRED:
            raise HFImportError(f"{source}: required field {prefix}{key!r} is missing")
        return default
    ok, what = _KINDS[kind]
    if not ok(v):
        raise HFImportError(f"{source}: field {prefix}{key!r} must be {what}, got {v!r} ({type(v).__name__})")
    return v


def config_from_hf(hf: dict, *, source: str = "config.json", **overrides) -> LMConfig:
    """HF config.json dict -> LMConfig (Qwen2/Qwen2.5/Llama only).

    Every field used is checked (present when required, of the right JSON type, sizes > 0): a malformed
    config raises one ``HFImportError`` naming ``source`` (the file) and the field.
    """
    if type(hf) is not dict:
        raise HFImportError(f"{source}: must hold a JSON object, got {type(hf).__name__}")
    mt = hf.get("model_type")
    if mt not in SUPPORTED:
        raise HFImportError(f"{source}: unsupported model_type {mt!r}; supported: {SUPPORTED}")
    rope_key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"  # transformers < 5 / >= 5
    rope = _field(hf, rope_key, "object", source, {})
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype not in ("default", None):
        raise HFImportError(f"{source}: RoPE scaling type {rtype!r} is not supported (only plain RoPE)")
    if _field(hf, "mlp_bias", "bool", source, False):
        raise HFImportError(f"{source}: mlp_bias=true checkpoints are not supported")
    theta = _field(hf, "rope_theta", "number", source, None)
    theta = _field(rope, "rope_theta", "number", source, 10000.0, f"{rope_key}.") if theta is None else theta
    size = lambda key, default=_REQUIRED: _field(hf, key, "size", source, default)
    n_heads = size("num_attention_heads")
    kw = dict(
        vocab_size=size("vocab_size"),
        d_model=size("hidden_size"),
        n_layers=size("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=size("num_key_value_heads", n_heads),
        head_dim=size("head_dim", None),  # None: hidden_size // n_heads (LMConfig checks that it divides)
        d_ff=size("intermediate_size"),
        qkv_bias=True if mt == "qwen2" else _field(hf, "attention_bias", "bool", source, False),
        tie_embeddings=_field(hf, "tie_word_embeddings", "bool", source, False),
        rope_theta=float(theta),
        norm_eps=float(_field(hf, "rms_norm_eps", "number", source, 1e-6)),
        max_seq_len=size("max_position_embeddings", 4096),
    )
    kw.update(overrides)
    try:
        return LMConfig(**kw)
    except ValueError as e:  # a combination LMConfig rejects (e.g. heads not a multiple of kv heads)
        raise HFImportError(f"{source}: {e}") from e


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


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def _ignored(name: str, cfg: LMConfig) -> bool:
    """Checkpoint tensors the model does not use, as in HF: RoPE's derived ``inv_freq`` buffer (older
    checkpoints) and a saved ``lm_head.weight`` of a tied model (HF ties it to the embedding)."""
    return name.endswith(".rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_embeddings)


class _Files:
    """name -> file for one or several safetensors files (memory-mapped, opened lazily)."""

    def __init__(self, path: pathlib.Path):
        self.files = sorted(path.glob("*.safetensors"))
        if not self.files:
            raise HFImportError(f"no *.safetensors files in {path}")
        self.where: dict[str, pathlib.Path] = {}
        self.shape: dict[str, tuple] = {}
        self.dtype: dict[str, str] = {}
        for f in self.files:
            try:
                with safe_open(f, "np") as h:
                    slices = {k: h.get_slice(k) for k in h.keys()}
                    meta = {k: (tuple(sl.get_shape()), sl.get_dtype()) for k, sl in slices.items()}
            except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError
                raise HFImportError(f"{f}: not a readable safetensors file (truncated or corrupt?): {e}") from e
            for k, (shape, dtype) in meta.items():
                if k in self.where:
                    raise HFImportError(f"tensor {k!r} is stored twice: in {self.where[k]} and in {f}")
                self.where[k], self.shape[k], self.dtype[k] = f, shape, dtype
        self._open: dict[pathlib.Path, Any] = {}

    def read(self, name: str, index: tuple) -> np.ndarray:
        f = self.where[name]
        if f not in self._open:
            self._open[f] = safe_open(f, "np")
        return self._open[f].get_slice(name)[index]


def _few(items: list[str], k: int = 8) -> str:
    return ", ".join(items[:k]) + (f", ... ({len(items)} in all)" if len(items) > k else "")


def _check(cfg: LMConfig, files: _Files, sources: dict, shapes: dict, root: pathlib.Path) -> None:
    """Every tensor the model needs (every layer's) is present, floating point and of the expected
    shape, and no unused tensor is left over; else one ``HFImportError`` naming each tensor and file."""
    want = {}  # HF name -> shape as stored ([out, in])
    for path, (name, transpose, per_layer) in sources.items():
        shape = tuple(shapes[path][1:] if per_layer else shapes[path])
        for i in range(cfg.n_layers if per_layer else 1):
            want[name.format(i=i)] = shape[::-1] if transpose else shape
    at = lambda n: f"{n} ({files.where[n].name})"
    present = [n for n in want if n in files.shape]
    missing = [n for n in want if n not in files.shape]
    wrong_shape = [f"{at(n)} has shape {files.shape[n]}, expected {want[n]}" for n in present if files.shape[n] != want[n]]
    not_float = [f"{at(n)} has dtype {files.dtype[n]}, not floating point" for n in present
                 if files.dtype[n] not in _FLOAT_DTYPES]
    unused = [f"{at(n)} is not a parameter of this config" for n in files.shape if n not in want and not _ignored(n, cfg)]
    problems = [_few(p) for p in (wrong_shape, not_float, unused) if p]
    if missing:
        problems.insert(0, f"missing {len(missing)} tensor(s) (not in {_few([f.name for f in files.files])}): {_few(missing)}")
    emb = files.shape.get("model.embed_tokens.weight")
    if emb and emb[0] != cfg.vocab_size:
        problems.insert(0, f"vocab mismatch: checkpoint embedding has {emb[0]} rows, config vocab_size={cfg.vocab_size}")
    if problems:
        raise HFImportError(f"checkpoint {root} does not match its config: " + "; ".join(problems))


def _path(kp) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in kp if getattr(k, "name", None) != "value")


def load_hf_model(path, mesh=None, *, dtype: str | None = None, expected_vocab_size: int | None = None, **overrides):
    """Load a checkpoint directory into a `Transformer`; shard it over `mesh` while loading."""
    path = pathlib.Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise HFImportError(f"no config.json in {path}")
    if dtype:
        overrides.setdefault("param_dtype", dtype)
        overrides.setdefault("dtype", dtype)
    try:
        hf = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise HFImportError(f"{cfg_file}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise HFImportError(f"{cfg_file}: cannot read it as UTF-8 text: {e}") from e
    cfg = config_from_hf(hf, source=str(cfg_file), **overrides)
    if expected_vocab_size is not None and expected_vocab_size > cfg.vocab_size:
        raise HFImportError(f"vocab mismatch: tokenizer has {expected_vocab_size} ids, checkpoint vocab_size={cfg.vocab_size}")
    files = _Files(path)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shapes = {_path(kp): x.shape for kp, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    sources = _hf_sources(cfg)
    extra = set(shapes) - set(sources)
    if extra:
        raise ValueError(f"no HF source for parameters {sorted(extra)}")
    _check(cfg, files, sources, shapes, path)
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


__all__ = ["HFImportError", "config_from_hf", "load_hf_model"]
