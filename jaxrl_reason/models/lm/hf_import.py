"""Import Hugging Face checkpoints (config.json + *.safetensors, optionally model.safetensors.index.json).

    model = load_hf_model("path/to/dir", mesh=make_mesh("fsdp=4,tensor=2"))

Each HF ``model_type`` maps to an `HFFamily` in ``FAMILIES`` (``register_family``): how its config.json
becomes an `LMConfig`, where each of our parameters lives in the checkpoint (`HFTensor`), and how an
LMConfig becomes that family's config.json again (for `hf_export.save_hf_model`). Built in: qwen2
(Qwen2/Qwen2.5), qwen3, llama (Llama 2/3.x, plain or llama3 RoPE scaling) and mistral; deepseek_v3 is
registered by `hf_deepseek` (imported on first use).

The checkpoint is checked first (config.json's fields and types, model type, every unsupported feature;
every layer's tensors present, floating point and of the expected shape, none left over; vocab; the
index's files) and raises one ``HFImportError`` naming the file and the field or tensor, before
anything is compiled. Then each parameter is built with `jax.make_array_from_callback` from its fitted
`NamedSharding`: every device reads only its own slice from the memory-mapped safetensors files, so a
model is never materialised whole on one device. HF weights are [out, in] and become our [in, out]
kernels; our RoPE uses HF's rotate-half layout, so q/k need no permutation; per-layer (and per-expert)
tensors are stacked on our leading layer (expert) axes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors import safe_open

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sharding import param_specs


class HFImportError(ValueError):
    """A checkpoint that cannot be imported; the message names the file and the field or tensor."""


# ---------------------------------------------------------------- the family table


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """Where one parameter of ours (an array of shape ``stack + inner``) lives in a HF checkpoint.

    name: HF tensor name; ``{i}`` is replaced by the HF layer index, ``{e}`` by the expert index.
    stacked: our leading axes that gather separate HF tensors, outermost first: ``"layer"`` (-> ``{i}``)
      and/or ``"expert"`` (-> ``{e}``); ``()`` for one tensor. E.g. per-expert weights [L, E, d, f]
      from ``model.layers.{i}.mlp.experts.{e}.gate_proj.weight`` are ``stacked=("layer", "expert")``;
      experts fused into one [E, f, d] HF tensor per layer are ``stacked=("layer",)``.
    transpose: the HF tensor has the last two axes of ours swapped (HF Linear [out, in], ours [in, out]).
    layer_offset: HF layer index = layer_offset + index on our layer axis (e.g. a stack of MoE
      layers that starts after ``first_k_dense_replace`` dense ones).
    HF tensor shape = our shape without the ``len(stacked)`` leading axes, last two swapped if transpose.
    """

    name: str
    stacked: tuple[str, ...] = ()
    transpose: bool = False
    layer_offset: int = 0

    def names(self, shape: tuple) -> dict[tuple, str]:
        """index into our stacked axes -> HF tensor name, for a parameter of shape ``shape``."""
        out = {}
        for ix in itertools.product(*(range(n) for n in shape[: len(self.stacked)])):
            keys = {("i" if ax == "layer" else "e"): j + (self.layer_offset if ax == "layer" else 0)
                    for ax, j in zip(self.stacked, ix)}
            out[ix] = self.name.format(**keys)
        return out

    def hf_shape(self, shape: tuple) -> tuple:
        inner = tuple(shape[len(self.stacked):])
        return inner[:-2] + inner[:-3:-1] if self.transpose else inner

    def to_hf(self, a: np.ndarray) -> np.ndarray:
        """one stacked slice of ours -> the HF tensor (and back: the swap is its own inverse)."""
        return np.swapaxes(a, -1, -2) if self.transpose else a


@dataclasses.dataclass(frozen=True)
class HFFamily:
    """How one HF ``model_type`` maps onto our model.

    config_from_hf(hf: dict, source: str) -> dict: LMConfig keyword arguments from config.json's dict.
      Check every field used and refuse every feature we do not implement with
      ``HFImportError(f"{source}: ...")`` naming the field (use `hf_field` for typed fields); the
      caller applies the user's overrides and builds the LMConfig (its ValueErrors are re-raised as
      HFImportError naming ``source``).
    tensor_map(cfg: LMConfig) -> dict[str, HFTensor]: every state leaf of ``build(cfg)`` (its
      '/'-joined nnx path, e.g. ``"blocks/attn/q_proj/kernel"``; non-Param variables such as the MoE
      ``blocks/mlp/bias`` too) -> where it lives in the checkpoint. Checked both ways at import
      (a leaf without an entry, a missing or unexpected checkpoint tensor are errors).
    hf_config_from_lm(cfg: LMConfig) -> dict: the family's config.json (with ``model_type`` and
      ``architectures``) for an export; raise ``HFImportError`` naming the LMConfig field for anything
      the HF architecture cannot express.
    build(cfg, rngs) -> nnx.Module: the model; default `Transformer`.
    ignored(name, cfg) -> bool: checkpoint tensors skipped silently (default: RoPE ``inv_freq``
      buffers and a tied model's saved ``lm_head.weight``).
    """

    config_from_hf: Callable[[dict, str], dict]
    tensor_map: Callable[[LMConfig], dict[str, HFTensor]]
    hf_config_from_lm: Callable[[LMConfig], dict]
    build: Callable[..., nnx.Module] = Transformer
    ignored: Callable[[str, LMConfig], bool] = lambda name, cfg: (
        name.endswith(".rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_embeddings))


FAMILIES: dict[str, HFFamily] = {}
#: model_type -> module that registers it when imported (loaded on first use)
LAZY_FAMILIES = {"deepseek_v3": "jaxrl_reason.models.lm.hf_deepseek"}


def register_family(model_type: str, family: HFFamily) -> None:
    """Make ``model_type`` importable (and exportable) with ``family``; replaces an earlier entry."""
    FAMILIES[model_type] = family


def get_family(model_type: str, source: str = "config.json") -> HFFamily:
    """The registered family of ``model_type`` (importing its module if lazy), else ``HFImportError``."""
    if not isinstance(model_type, str):
        raise HFImportError(f"{source}: field 'model_type' must be a string, got {model_type!r}")
    if model_type not in FAMILIES and model_type in LAZY_FAMILIES:
        try:
            importlib.import_module(LAZY_FAMILIES[model_type])
        except ModuleNotFoundError as e:
            if e.name != LAZY_FAMILIES[model_type]:
                raise
    if model_type not in FAMILIES:
        raise HFImportError(f"{source}: unsupported model_type {model_type!r}; supported: {tuple(sorted(FAMILIES))}")
    return FAMILIES[model_type]


# ---------------------------------------------------------------- config.json fields

_REQUIRED = object()
_KINDS = {  # kind -> (test, description)
    "size": (lambda v: type(v) is int and v > 0, "a positive integer"),
    "number": (lambda v: type(v) in (int, float) and 0 < v <= sys.float_info.max, "a positive finite number"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "object": (lambda v: type(v) is dict, "a JSON object"),
    "string": (lambda v: type(v) is str, "a string"),
}


def hf_field(d: dict, key: str, kind: str, source: str, default=_REQUIRED, prefix: str = ""):
    """``d[key]`` checked against ``kind`` (size / number / bool / object / string); absent or null ->
    ``default`` (``HFImportError`` naming ``source`` and ``prefix + key`` if required or mistyped)."""
    v = d.get(key)
    if v is None:
        if default is _REQUIRED:
            raise HFImportError(f"{source}: required field {prefix + key!r} is missing")
        return default
    ok, what = _KINDS[kind]
    if not ok(v):
        raise HFImportError(f"{source}: field {prefix + key!r} must be {what}, got {v!r} ({type(v).__name__})")
    return v


def hf_rope(hf: dict, source: str) -> tuple[float, dict, str]:
    """(rope_theta, the rope scaling dict, its config key) from ``rope_scaling`` (transformers < 5) or
    ``rope_parameters`` (>= 5, which also holds rope_theta)."""
    key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    rope = hf_field(hf, key, "object", source, {})
    theta = hf_field(hf, "rope_theta", "number", source, None)
    theta = hf_field(rope, "rope_theta", "number", source, 10000.0, f"{key}.") if theta is None else theta
    return float(theta), rope, key


def config_from_hf(hf: dict, *, source: str = "config.json", **overrides) -> LMConfig:
    """HF config.json dict -> LMConfig, by the family of its ``model_type`` (see ``FAMILIES``).

    Every field used is checked (present when required, of the right JSON type, sizes > 0) and every
    unsupported feature refused: a malformed config raises one ``HFImportError`` naming ``source``
    (the file) and the field.
    """
    if type(hf) is not dict:
        raise HFImportError(f"{source}: must hold a JSON object, got {type(hf).__name__}")
    kw = get_family(hf.get("model_type"), source).config_from_hf(hf, source)
    kw.update(overrides)
    try:
        return LMConfig(**kw)
    except ValueError as e:  # a combination LMConfig rejects (e.g. heads not a multiple of kv heads)
        raise HFImportError(f"{source}: {e}") from e


# ---------------------------------------------------------------- dense families (qwen2, qwen3, llama, mistral)

_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _dense_config(model_type: str, hf: dict, source: str) -> dict:
    rope_theta, rope, rope_key = hf_rope(hf, source)
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype == "llama3":
        scaling = {"rope_type": "llama3"}
        for k in _ROPE_KEYS:
            scaling[k] = hf_field(rope, k, "number", source, prefix=f"{rope_key}.")
        if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise HFImportError(f"{source}: {rope_key}.high_freq_factor must exceed low_freq_factor, got {rope}")
        scaling = tuple(sorted(scaling.items()))
    elif rtype in ("default", None):
        scaling = None
    else:
        raise HFImportError(f"{source}: RoPE scaling type {rtype!r} ({rope_key}.rope_type) is not supported "
                            "(plain RoPE and 'llama3' are)")
    prf = hf_field(rope, "partial_rotary_factor", "number", source, None, f"{rope_key}.")
    if (prf or hf_field(hf, "partial_rotary_factor", "number", source, 1.0)) != 1.0:
        raise HFImportError(f"{source}: partial_rotary_factor != 1 (partial RoPE) is not supported")
    if hf_field(hf, "mlp_bias", "bool", source, False):
        raise HFImportError(f"{source}: mlp_bias=true checkpoints are not supported")
    act = hf_field(hf, "hidden_act", "string", source, "silu")
    if act != "silu":
        raise HFImportError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if model_type != "qwen2" and hf_field(hf, "attention_bias", "bool", source, False):
        raise HFImportError(f"{source}: attention_bias=true (biases on q/k/v and o_proj) is not supported for "
                            f"{model_type}")
    if model_type in ("qwen2", "qwen3") and hf_field(hf, "use_sliding_window", "bool", source, False):
        raise HFImportError(f"{source}: use_sliding_window=true (sliding window on some layers) is not supported")
    size = lambda key, default=_REQUIRED: hf_field(hf, key, "size", source, default)
    n_heads, d_model, head_dim = size("num_attention_heads"), size("hidden_size"), size("head_dim", None)
    if head_dim is not None and head_dim * n_heads == d_model:
        head_dim = None  # the default: keeps import(export(cfg)) == cfg
    return dict(
        vocab_size=size("vocab_size"),
        d_model=d_model,
        n_layers=size("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=size("num_key_value_heads", n_heads),
        head_dim=head_dim,  # None: hidden_size // n_heads (LMConfig checks that it divides)
        d_ff=size("intermediate_size"),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        tie_embeddings=hf_field(hf, "tie_word_embeddings", "bool", source, False),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        norm_eps=float(hf_field(hf, "rms_norm_eps", "number", source, 1e-6)),
        max_seq_len=size("max_position_embeddings", 4096),
        sliding_window=size("sliding_window", None) if model_type == "mistral" else None,
    )


def _dense_tensors(cfg: LMConfig) -> dict[str, HFTensor]:
    layer = lambda name, transpose=False: HFTensor(f"model.layers.{{i}}.{name}", ("layer",), transpose)
    m = {
        "embed": HFTensor("model.embed_tokens.weight"),
        "final_norm/scale": HFTensor("model.norm.weight"),
        "blocks/input_norm/scale": layer("input_layernorm.weight"),
        "blocks/post_attn_norm/scale": layer("post_attention_layernorm.weight"),
    }
    for p in ("q", "k", "v", "o"):
        m[f"blocks/attn/{p}_proj/kernel"] = layer(f"self_attn.{p}_proj.weight", True)
        if cfg.qkv_bias and p != "o":
            m[f"blocks/attn/{p}_proj/bias"] = layer(f"self_attn.{p}_proj.bias")
    if cfg.qk_norm:
        m["blocks/attn/q_norm/scale"] = layer("self_attn.q_norm.weight")
        m["blocks/attn/k_norm/scale"] = layer("self_attn.k_norm.weight")
    for p in ("gate", "up", "down"):
        m[f"blocks/mlp/{p}/kernel"] = layer(f"mlp.{p}_proj.weight", True)
    if not cfg.tie_embeddings:
        m["lm_head/kernel"] = HFTensor("lm_head.weight", transpose=True)
    return m


_ARCH = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
         "mistral": "MistralForCausalLM"}


def _dense_hf_config(model_type: str, cfg: LMConfig) -> dict:
    """LMConfig -> config.json of a dense family (HFImportError naming a field it cannot express)."""
    need = {"qwen2": dict(qkv_bias=True, qk_norm=False), "qwen3": dict(qkv_bias=False, qk_norm=True)}.get(
        model_type, dict(qkv_bias=False, qk_norm=False))
    if model_type != "mistral":
        need["sliding_window"] = None
    for field, value in need.items():
        if getattr(cfg, field) != value:
            raise HFImportError(f"LMConfig.{field}={getattr(cfg, field)!r} cannot be expressed as model_type "
                                f"{model_type!r} (needs {field}={value!r})")
    if cfg.attention != "gqa" or cfg.is_moe or cfg.mtp_depth or cfg.fp8:
        raise HFImportError(f"{model_type} is a dense GQA architecture: no MLA, MoE, MTP or fp8")
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope = {**dict(cfg.rope_scaling), "rope_theta": cfg.rope_theta}
    hf = dict(
        model_type=model_type, architectures=[_ARCH[model_type]], vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.hd, intermediate_size=cfg.d_ff, hidden_act="silu", tie_word_embeddings=cfg.tie_embeddings,
        rms_norm_eps=cfg.norm_eps, max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std,
        rope_theta=cfg.rope_theta, rope_parameters=rope, rope_scaling=None if cfg.rope_scaling is None else rope,
        attention_dropout=0.0, use_cache=True,
    )
    if model_type in ("llama", "qwen3"):
        hf.update(attention_bias=False, mlp_bias=False)
    if model_type in ("qwen2", "qwen3"):
        hf.update(use_sliding_window=False, sliding_window=None)
    if model_type == "mistral":
        hf["sliding_window"] = cfg.sliding_window
    return hf


for _mt in _ARCH:
    register_family(_mt, HFFamily(config_from_hf=functools.partial(_dense_config, _mt), tensor_map=_dense_tensors,
                                  hf_config_from_lm=functools.partial(_dense_hf_config, _mt)))


# ---------------------------------------------------------------- reading and checking the checkpoint

_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
INDEX = "model.safetensors.index.json"


class _Files:
    """name -> file for one or several safetensors files (memory-mapped, opened lazily). With
    model.safetensors.index.json, exactly the files its ``weight_map`` lists (each must exist and hold
    the tensors the map puts in it); else every *.safetensors in the directory."""

    def __init__(self, path: pathlib.Path):
        index = path / INDEX
        weight_map = None
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                assert type(weight_map) is dict and all(type(v) is str for v in weight_map.values())
            except (json.JSONDecodeError, KeyError, TypeError, AssertionError, UnicodeDecodeError) as e:
                raise HFImportError(f"{index}: not a safetensors index (a JSON object with a 'weight_map' of "
                                    f"tensor name -> file name): {e!r}") from e
            self.files = [path / f for f in sorted(set(weight_map.values()))]
            absent = [f.name for f in self.files if not f.is_file()]
            if absent:
                raise HFImportError(f"{index}: lists {len(absent)} file(s) not in {path}: {_few(absent)}")
        else:
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
        if weight_map is not None:
            wrong = [f"{k} (listed in {v}, found in {self.where[k].name if k in self.where else 'no file'})"
                     for k, v in weight_map.items() if k not in self.where or self.where[k].name != v]
            if wrong:
                raise HFImportError(f"{index}: {len(wrong)} tensor(s) not where the weight_map says: {_few(wrong)}")
        self._open: dict[pathlib.Path, Any] = {}

    def read(self, name: str, index: tuple) -> np.ndarray:
        f = self.where[name]
        if f not in self._open:
            self._open[f] = safe_open(f, "np")
        return self._open[f].get_slice(name)[index]


def _few(items: list[str], k: int = 8) -> str:
    return ", ".join(items[:k]) + (f", ... ({len(items)} in all)" if len(items) > k else "")


def _check(cfg: LMConfig, family: HFFamily, files: _Files, tmap: dict, shapes: dict, root: pathlib.Path) -> None:
    """Every tensor the model needs (every layer's) is present, floating point and of the expected
    shape, and no unused tensor is left over; else one ``HFImportError`` naming each tensor and file."""
    want = {}  # HF name -> shape as stored
    for path, t in tmap.items():
        for name in t.names(shapes[path]).values():
            want[name] = t.hf_shape(shapes[path])
    at = lambda n: f"{n} ({files.where[n].name})"
    present = [n for n in want if n in files.shape]
    missing = [n for n in want if n not in files.shape]
    wrong_shape = [f"{at(n)} has shape {files.shape[n]}, expected {want[n]}" for n in present if files.shape[n] != want[n]]
    not_float = [f"{at(n)} has dtype {files.dtype[n]}, not floating point" for n in present
                 if files.dtype[n] not in _FLOAT_DTYPES]
    unused = [f"{at(n)} is not a parameter of this config" for n in files.shape
              if n not in want and not family.ignored(n, cfg)]
    problems = [_few(p) for p in (wrong_shape, not_float, unused) if p]
    if missing:
        problems.insert(0, f"missing {len(missing)} tensor(s) (not in {_few([f.name for f in files.files])}): {_few(missing)}")
    emb = files.shape.get(tmap["embed"].name) if "embed" in tmap else None
    if emb and emb[0] != cfg.vocab_size:
        problems.insert(0, f"vocab mismatch: checkpoint embedding has {emb[0]} rows, config vocab_size={cfg.vocab_size}")
    if problems:
        raise HFImportError(f"checkpoint {root} does not match its config: " + "; ".join(problems))


def param_path(kp) -> str:
    """nnx state key path -> our '/'-joined parameter path (the keys of `HFFamily.tensor_map`)."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in kp if getattr(k, "name", None) != "value")


def read_hf_config(path: pathlib.Path) -> dict:
    """config.json of a checkpoint directory as a dict (``HFImportError`` naming the file otherwise)."""
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise HFImportError(f"no config.json in {path}")
    try:
        return json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise HFImportError(f"{cfg_file}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise HFImportError(f"{cfg_file}: cannot read it as UTF-8 text: {e}") from e


def _check_vocab(path: pathlib.Path, cfg: LMConfig, source: str, expected: int | None) -> None:
    """The model's vocab must hold every tokenizer id: ``expected`` if given, else the size of the
    directory's ``tokenizer.json`` (added tokens included) when there is one."""
    what = "the tokenizer you passed"
    if expected is None and (path / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        try:
            expected = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own Exception type
            raise HFImportError(f"{path / 'tokenizer.json'}: not a readable tokenizer file: {e}") from e
        what = str(path / "tokenizer.json")
    if expected is not None and expected > cfg.vocab_size:
        raise HFImportError(f"vocab mismatch: {what} has {expected} ids but {source} says vocab_size="
                            f"{cfg.vocab_size}; the embedding cannot hold every token")


def load_hf_model(path, mesh=None, *, dtype: str | None = None, expected_vocab_size: int | None = None, **overrides):
    """Load a checkpoint directory into a model (a `Transformer` for the dense families); shard it over `mesh`
    while loading. ``overrides``: LMConfig fields to change (e.g. ``max_seq_len``). A llama.cpp ``.gguf`` file
    or a packaged checkpoint's name: ``models.lm.pretrained.load_model``."""
    path = pathlib.Path(path)
    if path.suffix == ".gguf":
        raise HFImportError(f"{path} is a llama.cpp GGUF file: load it with jaxrl_reason.models.lm.load_model "
                            "(any checkpoint: HF directory, .gguf file or packaged name)")
    if dtype:
        overrides.setdefault("param_dtype", dtype)
        overrides.setdefault("dtype", dtype)
    hf = read_hf_config(path)
    source = str(path / "config.json")
    cfg = config_from_hf(hf, source=source, **overrides)
    family = get_family(hf.get("model_type"), source)
    _check_vocab(path, cfg, source, expected_vocab_size)
    return load_tensors(cfg, family, _Files(path), path, mesh)


def load_tensors(cfg: LMConfig, family: HFFamily, files, root: pathlib.Path, mesh=None) -> nnx.Module:
    """``family.build(cfg)`` with every parameter read from ``files`` under its HF name (a `_Files`, or any
    object with its ``files``, ``where``, ``shape``, ``dtype`` and ``read(name, index)``), checked first
    (`_check`, naming ``root``) and sharded over ``mesh`` while loading."""
    abstract = nnx.eval_shape(lambda: family.build(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shapes = {param_path(kp): x.shape for kp, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    tmap = family.tensor_map(cfg)
    extra = set(shapes) - set(tmap)
    if extra:
        raise ValueError(f"no HF source for parameters {sorted(extra)}")
    _check(cfg, family, files, tmap, shapes, root)
    specs = param_specs(state, mesh) if mesh is not None else None
    specs_by_path = {} if specs is None else {
        param_path(kp): s for kp, s in jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0]
    }

    def build(kp, leaf):
        p = param_path(kp)
        t, k = tmap[p], len(tmap[p].stacked)
        names = t.names(leaf.shape)
        sharding = (
            NamedSharding(mesh, specs_by_path[p]) if mesh is not None else jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        )

        def read(idx: tuple) -> np.ndarray:
            idx = tuple(idx) + (slice(None),) * (len(leaf.shape) - len(idx))
            inner = idx[k:]
            if t.transpose:
                inner = inner[:-2] + inner[:-3:-1]
            ranges = [range(*s.indices(n)) for s, n in zip(idx[:k], leaf.shape)]
            out = np.stack([t.to_hf(files.read(names[ix], inner)) for ix in itertools.product(*ranges)])
            return out.reshape(tuple(map(len, ranges)) + out.shape[1:]).astype(leaf.dtype)

        return jax.make_array_from_callback(leaf.shape, sharding, read)

    loaded = jax.tree_util.tree_map_with_path(build, state)
    return nnx.merge(graphdef, loaded)


__all__ = ["FAMILIES", "HFFamily", "HFImportError", "HFTensor", "config_from_hf", "get_family", "hf_field",
           "hf_rope", "load_hf_model", "load_tensors", "register_family"]
