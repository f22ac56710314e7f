"""Import llama.cpp GGUF files: one ``.gguf`` holds the config (its metadata), the weights (often quantised)
and the tokenizer (its own vocabulary, merges, special ids and chat template).

    model = load_gguf_model("SmolLM2-135M-Instruct.Q4_1.gguf")  # or models.lm.load_model(path or name)
    tok = gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")    # an HFTokenizer
    save_hf_model(model, "out/dir", tok)                        # an ordinary safetensors checkpoint

Architectures: llama, qwen2, qwen3 and mistral (llama.cpp writes Mistral as ``llama``; a ``llama`` file whose
``general.name`` says mistral imports as model_type mistral). The metadata becomes a HF config.json dict
(`gguf_hf_config`) and llama.cpp's tensor names HF ones, so the HF family of `hf_import` builds the LMConfig
and checks every tensor exactly as for a safetensors checkpoint. llama.cpp's converter interleaves the two
RoPE halves of each q/k head (rows permuted) for llama/mistral, not qwen2/qwen3: we read the rows back in
HF order. Llama 3.1+'s ``rope_freqs.weight`` becomes HF's llama3 RoPE scaling. Every device dequantises
(`gguf.quants.dequantize`, to float32, then the model's param dtype) only the rows of its own slice, from
the memory-mapped file.

Tokenizers (built by ``models.tokenizer.gguf``): byte-level BPE (``tokenizer.ggml.model`` gpt2; the split of
``tokenizer.ggml.pre``, see ``PRE_TOKENIZERS``) and SentencePiece BPE (``llama``: byte fallback, merges from the
file or from the token scores). CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens.
"""

from __future__ import annotations

import functools
import pathlib
import re
import types

import numpy as np

from jaxrl_reason.models.lm.hf_import import HFImportError, config_from_hf, get_family, load_tensors
from jaxrl_reason.models.tokenizer import HFTokenizer
from jaxrl_reason.models.tokenizer.gguf import PRE_TOKENIZERS, gguf_file_tokenizer

#: general.architecture -> HF model_type (llama.cpp writes Mistral as llama: a llama file named "...mistral..."
#: becomes mistral)
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_PERMUTED = ("llama", "mistral")  # model types whose q/k rows llama.cpp's converter interleaves

_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_tensor_name(name: str) -> str:
    """llama.cpp tensor name -> HF name (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``);
    unknown names are returned unchanged (the import then reports them as unexpected tensors)."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m[2] in _LAYER:
        return f"model.layers.{m[1]}.{_LAYER[m[2]]}.{m[3]}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
    return f"{_GLOBAL[m[1]]}.{m[2]}" if m and m[1] in _GLOBAL else name


# ---------------------------------------------------------------- the file


@functools.cache
def dequantizable_types() -> tuple[str, ...]:
    """GGML tensor types `gguf.quants.dequantize` reads (F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K, IQ*, ...)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    ok = []
    for q in GGMLQuantizationType:
        try:
            dequantize(np.zeros((1, GGML_QUANT_SIZES[q][1]), np.uint8), q)
            ok.append(q.name)
        except (NotImplementedError, KeyError, ValueError):  # gguf cannot dequantise this type: not listed
            pass
    return tuple(ok)


class GGUFFile:
    """A parsed .gguf file (memory-mapped): ``meta`` (key -> value, read-only; arrays as lists, strings as str) and
    ``tensors`` (llama.cpp name -> `gguf.ReaderTensor`). ``HFImportError`` if it is not a readable GGUF. A file
    is parsed once per process while it is unchanged (``gguf.GGUFReader`` reads every metadata field up front:
    ~4 s for a 49k-token vocabulary), so loading a model and then its tokenizer reads it once."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        if not self.path.is_file():
            raise HFImportError(f"{self.path}: no such GGUF file")
        stat = self.path.stat()
        self.meta, self.tensors = _parse_gguf(str(self.path.resolve()), stat.st_mtime_ns, stat.st_size)

    def get(self, key: str, default=None):
        return self.meta.get(key, default)


@functools.lru_cache(maxsize=4)
def _parse_gguf(path: str, mtime_ns: int, size: int) -> tuple[types.MappingProxyType, types.MappingProxyType]:
    """(meta, tensors) of the file at ``path`` as it was at (``mtime_ns``, ``size``): a changed file is parsed anew."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError, struct.error, IndexError ...
        raise HFImportError(f"{path}: not a readable GGUF file (truncated or corrupt?): {e}") from e
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return types.MappingProxyType(meta), types.MappingProxyType({t.name: t for t in reader.tensors})


# ---------------------------------------------------------------- metadata -> config.json


def _model_type(f: GGUFFile) -> str:
    arch = f.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise HFImportError(f"{f.path}: unsupported GGUF architecture {arch!r}; supported: {tuple(ARCHITECTURES)} "
                            "(Mistral is written as llama)")
    if arch == "llama" and "mistral" in str(f.get("general.name", "")).lower():
        return "mistral"
    return ARCHITECTURES[arch]


ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's divisors of each RoPE frequency (Llama 3.1+), read as config
_LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)


def _llama3_rope(f: GGUFFile, head_dim, theta: float) -> dict:
    """``rope_freqs.weight`` as HF's llama3 rope scaling: Meta's parameters (Llama 3.1 to 3.3: low/high
    frequency factors 1 and 4, original context 8192) with factor = the largest divisor, accepted only if
    they reproduce every divisor (HFImportError otherwise)."""
    from gguf.quants import dequantize

    from jaxrl_reason.models.lm.layers import rope_inv_freq

    t = f.tensors[ROPE_FREQS]
    divisors = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float64)
    scaling = {**_LLAMA3_ROPE, "factor": float(divisors.max())}
    if not (type(head_dim) is int and divisors.shape == (head_dim // 2,) and np.allclose(
            rope_inv_freq(head_dim, theta, tuple(sorted(scaling.items()))), rope_inv_freq(head_dim, theta) / divisors,
            rtol=1e-5)):
        raise HFImportError(f"{f.path}: tensor {ROPE_FREQS} (RoPE frequency divisors) is not Llama 3's llama3 scaling "
                            f"{_LLAMA3_ROPE} with some factor; other RoPE frequencies are not supported")
    return scaling


def gguf_hf_config(f: GGUFFile) -> dict:
    """The file's metadata as a HF config.json dict (model_type llama / mistral / qwen2 / qwen3); features
    the dense families cannot express are refused here or by their ``config_from_hf``."""
    arch, model_type = f.get("general.architecture"), _model_type(f)

    def key(name, required=True):
        if required and f"{arch}.{name}" not in f.meta:
            raise HFImportError(f"{f.path}: required GGUF metadata {arch}.{name} is missing")
        return f.get(f"{arch}.{name}")

    if f.get("split.count", 1) != 1:
        raise HFImportError(f"{f.path}: a split GGUF (split.count={f.get('split.count')}) is not supported; merge "
                            "the parts first (llama-gguf-split --merge)")
    if key("expert_count", False):
        raise HFImportError(f"{f.path}: {arch}.expert_count={key('expert_count')}: mixture-of-experts GGUF files are "
                            "not supported")
    heads, d_model = key("attention.head_count"), key("embedding_length")
    head_dim = key("attention.key_length", False) or key("rope.dimension_count", False)
    if head_dim is None and type(heads) is int and type(d_model) is int and heads > 0:
        head_dim = d_model // heads
    value_dim = key("attention.value_length", False)
    if value_dim is not None and value_dim != head_dim:
        raise HFImportError(f"{f.path}: {arch}.attention.value_length={value_dim} != key length {head_dim} is not "
                            "supported")
    rotary = key("rope.dimension_count", False)
    hf = {
        "model_type": model_type,
        "vocab_size": key("vocab_size", False) or len(f.get("tokenizer.ggml.tokens", ())) or None,
        "hidden_size": d_model,
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", False),
        "head_dim": head_dim,
        "intermediate_size": key("feed_forward_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base", False),
        "max_position_embeddings": key("context_length", False),
        "tie_word_embeddings": "output.weight" not in f.tensors,
    }
    if rotary is not None and type(head_dim) is int and rotary != head_dim:
        hf["partial_rotary_factor"] = rotary / head_dim
    scaling = key("rope.scaling.type", False)
    if scaling not in (None, "none"):
        hf["rope_scaling"] = {"rope_type": scaling, "factor": key("rope.scaling.factor", False)}
    if ROPE_FREQS in f.tensors:
        hf["rope_scaling"] = _llama3_rope(f, head_dim, hf["rope_theta"] or 10000.0)
    if model_type == "mistral":
        hf["sliding_window"] = key("attention.sliding_window", False)
    return {k: v for k, v in hf.items() if v is not None}


# ---------------------------------------------------------------- tensors


@functools.lru_cache(maxsize=8)
def _gguf_rows(rows: int, n_heads: int) -> np.ndarray:
    """For each row of a HF q/k projection [n_heads * hd, ...], its row in llama.cpp's permuted tensor, whose
    heads hold the two RoPE halves interleaved ([hd/2, 2] instead of [2, hd/2])."""
    return np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).transpose(0, 2, 1).reshape(-1)


class _GGUFTensors:
    """The tensors of a GGUF file under HF names, as `hf_import.load_tensors` reads them (the interface of
    `hf_import._Files`): ``shape`` in HF layout ([out, in]), ``read(name, index)`` dequantises to float32."""

    def __init__(self, f: GGUFFile, permuted_heads: dict[str, int]):
        """permuted_heads: HF name -> head count, for the q/k tensors whose rows llama.cpp permuted."""
        supported = dequantizable_types()
        bad = sorted({f"{t.tensor_type.name} ({name})" for name, t in f.tensors.items()
                      if t.tensor_type.name not in supported})
        if bad:
            raise HFImportError(f"{f.path}: unsupported GGUF tensor type(s) {', '.join(bad[:4])}; supported: "
                                f"{supported}")
        self.files = [f.path]
        self._tensors = {hf_tensor_name(n): t for n, t in f.tensors.items() if n != ROPE_FREQS}
        self.where = dict.fromkeys(self._tensors, f.path)
        self.shape = {n: tuple(int(d) for d in reversed(t.shape)) for n, t in self._tensors.items()}
        self.dtype = dict.fromkeys(self._tensors, "F32")  # as dequantised
        self._heads = {n: h for n, h in permuted_heads.items() if n in self._tensors}

    def read(self, name: str, index: tuple) -> np.ndarray:
        """``tensor[index]`` (HF layout) as float32, dequantising only the selected rows (quantisation
        blocks run along a row)."""
        from gguf.quants import dequantize

        t = self._tensors[name]
        index = tuple(index) + (slice(None),) * (len(self.shape[name]) - len(index))
        if len(index) == 1:
            return dequantize(t.data, t.tensor_type)[index]
        if name in self._heads:  # (its shape is checked before any read)
            index = (_gguf_rows(self.shape[name][0], self._heads[name])[index[0]],) + index[1:]
        return dequantize(t.data[index[0]], t.tensor_type)[(slice(None),) + index[1:]]


def load_gguf_model(path, mesh=None, *, dtype: str | None = None, expected_vocab_size: int | None = None,
                    **overrides):
    """A llama.cpp .gguf file -> our model (a `Transformer`), sharded over ``mesh`` while loading; as
    `hf_import.load_hf_model` (which dispatches here for a ``.gguf`` path). ``path``: a file or a `GGUFFile`
    (parsed once for model and tokenizer). ``expected_vocab_size``: default the file's own vocabulary size."""
    f = path if isinstance(path, GGUFFile) else GGUFFile(path)
    if dtype:
        overrides.setdefault("param_dtype", dtype)
        overrides.setdefault("dtype", dtype)
    hf, source = gguf_hf_config(f), f"{f.path} (GGUF metadata)"
    cfg = config_from_hf(hf, source=source, **overrides)
    family = get_family(hf["model_type"], source)
    vocab = expected_vocab_size or len(f.get("tokenizer.ggml.tokens", ()))
    if vocab > cfg.vocab_size:
        raise HFImportError(f"vocab mismatch: the tokenizer has {vocab} ids but {source} says vocab_size="
                            f"{cfg.vocab_size}; the embedding cannot hold every token")
    permuted = {}
    if hf["model_type"] in _PERMUTED:
        permuted = {f"model.layers.{i}.self_attn.{p}_proj.{w}": n for i in range(cfg.n_layers)
                    for w in ("weight", "bias")
                    for p, n in (("q", cfg.n_heads), ("k", cfg.n_kv_heads))}
    return load_tensors(cfg, family, _GGUFTensors(f, permuted), f.path, mesh)


# ---------------------------------------------------------------- tokenizer


def gguf_tokenizer(path) -> HFTokenizer:
    """The tokenizer of a .gguf file or `GGUFFile` as an `HFTokenizer` (``models.tokenizer.gguf``: the file's
    vocabulary, named special tokens, ``add_bos_token`` and chat template(s)); ``HFImportError`` for a tokenizer
    model or pre-tokenizer we do not read."""
    return gguf_file_tokenizer(path if isinstance(path, GGUFFile) else GGUFFile(path))


__all__ = ["ARCHITECTURES", "PRE_TOKENIZERS", "GGUFFile", "dequantizable_types", "gguf_hf_config", "gguf_tokenizer",
           "hf_tensor_name", "load_gguf_model"]
