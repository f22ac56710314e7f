"""LoRA adapters for the LM stack (native or imported models), as nnx variables of type `LoRAParam`.

    model = apply_lora(model, LoRAConfig(rank=8, alpha=16.0, targets=("q_proj", "v_proj")))
    graphdef, adapters, base = nnx.split(model, LoRAParam, ...)   # train `adapters` only
    y = model(tokens)              # each adapted Linear: x @ W + (alpha / rank) * dropout(x) @ A @ B
    ref = lora_off(adapters)       # zeroed adapters: with `base` exactly the base model (KL reference)
    merged = merge_lora(model)     # W <- W + alpha/rank * A @ B, adapters removed (before export)

An adapted ``Linear`` (kernel [..., d_in, d_out]; blocks carry a leading layer axis) gains a
``lora`` submodule with ``a`` [..., d_in, r] (normal, std 1/sqrt(d_in)) and ``b`` [..., r, d_out]
(zeros, so a fresh adapter changes nothing), both float32 whatever the kernel's dtype. Paths are
``<linear>/lora/a`` and ``<linear>/lora/b``; the sharding rules (`sharding.LM_RULES`) give A the
kernel's input-dim axis and B its output one. `LoRAParam` (flax's) is a subclass of ``nnx.Param``:
code that splits on ``nnx.Param`` trains adapters and base together; splitting on ``LoRAParam``
trains the adapters only (``GRPOConfig.lora``, ``train.init_train_state(..., wrt=LoRAParam)``).
``hf_export.save_hf_model`` merges adapters itself; ``peft_export.save_peft_adapter`` writes them as a PEFT
adapter directory (``peft.PeftModel.from_pretrained(base, dir)``).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import LoRAParam

from jaxrl_reason.models.lm.layers import Linear
from jaxrl_reason.utils.validation import NONNEGATIVE, VALID, check_hyperparameters

ALL_LINEAR = "all_linear"  # targets=(ALL_LINEAR,): every Linear except lm_head


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """rank r, alpha (scale alpha / r), dropout on the adapter's input (training forward passes only),
    targets: regexes, each fully matching a Linear's own name (e.g. "q_proj", "(q|k|v|o)_proj",
    "gate|up|down"), or "all_linear"; seed: initialisation of A."""

    rank: int = 8
    alpha: float = dataclasses.field(default=16.0, metadata={VALID: NONNEGATIVE})
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    seed: int = 0

    def __post_init__(self):
        check_hyperparameters(self)
        if self.rank < 1:
            raise ValueError(f"LoRAConfig.rank must be >= 1, got {self.rank}")
        if not self.dropout < 1.0:
            raise ValueError(f"LoRAConfig.dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.targets, str) or not self.targets:
            raise ValueError(f"LoRAConfig.targets must be a non-empty tuple of names, got {self.targets!r}")
        for t in self.targets:
            try:
                re.compile(t)
            except re.error as e:
                raise ValueError(f"LoRAConfig.targets: bad pattern {t!r}: {e}") from None

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRA(nnx.Module):
    """delta(x) = scaling * dropout(x) @ a @ b. a [..., d_in, r], b [..., r, d_out] (leading layer axes
    when stacked). Dropout runs only while ``dropout_key`` (raw key data, set by `set_dropout`) is present."""

    def __init__(self, a: jax.Array, b: jax.Array, scaling: float, dropout: float):
        self.a, self.b = LoRAParam(a), LoRAParam(b)
        self.scaling, self.dropout = scaling, dropout
        self.dropout_key = nnx.data(None)

    def __call__(self, x: jax.Array, dtype) -> jax.Array:
        if self.dropout_key is not None:
            keep = jax.random.bernoulli(jax.random.wrap_key_data(self.dropout_key[...]), 1.0 - self.dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - self.dropout), 0.0)
        xa = jnp.dot(x.astype(dtype), self.a[...].astype(dtype), preferred_element_type=jnp.float32)
        y = jnp.dot(xa.astype(dtype), self.b[...].astype(dtype), preferred_element_type=jnp.float32)
        return (self.scaling * y).astype(dtype)


def _linears(model: nnx.Module):
    """[(path string, Linear)] of every Linear in the model."""
    return [("/".join(map(str, p)), m) for p, m in nnx.iter_modules(model) if isinstance(m, Linear)]


def _matches(path: str, targets: tuple[str, ...]) -> bool:
    name = path.rsplit("/", 1)[-1]
    if ALL_LINEAR in targets and name != "lm_head":
        return True
    return any(re.fullmatch(t, name) for t in targets if t != ALL_LINEAR)


def has_lora(model: nnx.Module) -> bool:
    return any(m.lora is not None for _, m in _linears(model))


def adapted_linears(model: nnx.Module) -> list[tuple[str, Linear]]:
    """[(path, Linear)] of every Linear carrying an adapter, paths '/'-joined (e.g. "blocks/attn/q_proj")."""
    return [(p, m) for p, m in _linears(model) if m.lora is not None]


def apply_lora(model: nnx.Module, config: LoRAConfig) -> nnx.Module:
    """A copy of ``model`` (sharing the base arrays, no weight copy) with adapters on the matching Linears."""
    if has_lora(model):
        raise ValueError("apply_lora: the model already has LoRA adapters (merge_lora first)")
    model = nnx.merge(*nnx.split(model))
    hits = [(p, m) for p, m in _linears(model) if _matches(p, config.targets)]
    if not hits:
        names = sorted({p.rsplit("/", 1)[-1] for p, _ in _linears(model)})
        raise ValueError(f"apply_lora: targets {config.targets} match no Linear; names are {names}")
    key = jax.random.key(config.seed)
    for i, (_, m) in enumerate(hits):
        *lead, d_in, d_out = m.kernel.shape
        a = jax.random.normal(jax.random.fold_in(key, i), (*lead, d_in, config.rank), jnp.float32) / d_in**0.5
        m.lora = nnx.data(LoRA(a, jnp.zeros((*lead, config.rank, d_out), jnp.float32), config.scaling, config.dropout))
    return model


def lora_off(adapters: nnx.State) -> nnx.State:
    """Adapter state with every B zeroed (A kept): merged with the base state it is the base model."""
    def off(path, x):
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return jnp.zeros_like(x) if keys[-1] == "b" else x

    return jax.tree_util.tree_map_with_path(off, adapters)


def set_dropout(model: nnx.Module, key: jax.Array | None) -> None:
    """In place (on a merged, possibly traced model): turn adapter dropout on with fresh masks drawn
    from ``key`` (one independent stream per adapter and layer), or off with ``key=None``."""
    for i, (_, m) in enumerate(_linears(model)):
        if m.lora is None or m.lora.dropout == 0.0:
            continue
        if key is None:
            m.lora.dropout_key = None
        else:
            lead = m.kernel.shape[:-2]
            k = jax.random.fold_in(key, i)
            ks = jax.random.split(k, lead) if lead else k
            m.lora.dropout_key = nnx.data(nnx.Variable(jax.random.key_data(ks)))


def merge_lora(model: nnx.Module) -> nnx.Module:
    """A copy of ``model`` with each adapter folded in (kernel + alpha/r * A @ B, in float32, cast back
    to the kernel's dtype) and removed; a model without adapters comes back unchanged (a copy)."""
    model = nnx.merge(*nnx.split(model))  # new modules, shared Variables: replace kernels, never write them
    for _, m in _linears(model):
        if m.lora is not None:
            w = m.kernel[...]
            delta = jnp.matmul(m.lora.a[...].astype(jnp.float32), m.lora.b[...].astype(jnp.float32))
            m.kernel = m.kernel.replace(value=(w.astype(jnp.float32) + m.lora.scaling * delta).astype(w.dtype))
            m.lora = None
    return model


def state_bytes(tree) -> int:
    """Total bytes of the array leaves of a pytree (e.g. an optimiser state)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))
