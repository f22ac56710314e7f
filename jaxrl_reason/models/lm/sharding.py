"""Partition rules for the LM over mesh axes data / fsdp / tensor / expert.

Rules are (regex, PartitionSpec) pairs for `jaxrl_reason.parallel.mesh.match_partition_rules`
(first `re.search` match on the '/'-joined parameter path wins). Parameters under ``blocks/`` carry
a leading layer axis (scanned layers), hence the leading ``None``. Any mesh axis absent from the
mesh, or whose size does not divide the dimension, is dropped (replicated on that dim) by
`fit_spec`, so one rule list serves every mesh. Batches are split over ``BATCH_AXES``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_reason.parallel.distributed import to_global
from jaxrl_reason.parallel.mesh import match_partition_rules

BATCH_AXES = ("data", "fsdp", "expert")

LM_RULES: list[tuple[str, P]] = [
    (r"embed", P("tensor", "fsdp")),
    (r"lm_head/kernel", P("fsdp", "tensor")),
    (r"blocks/.*w_(gate|up)", P(None, "expert", "fsdp", "tensor")),
    (r"blocks/.*w_down", P(None, "expert", "tensor", "fsdp")),
    (r"blocks/.*(o_proj|down)/kernel", P(None, "tensor", "fsdp")),
    (r"blocks/.*(proj|gate|up|q_a|q_b|kv_a|kv_b)/kernel", P(None, "fsdp", "tensor")),
    (r"blocks/.*(proj|gate|up|q_b|kv_b)/bias", P(None, "tensor")),
    (r"mtp/.*(o_proj|down)/kernel", P("tensor", "fsdp")),
    (r"mtp/.*w_(gate|up)", P("expert", "fsdp", "tensor")),
    (r"mtp/.*w_down", P("expert", "tensor", "fsdp")),
    (r"mtp/.*kernel", P("fsdp", "tensor")),
]


def _lora_rules(rules):
    """LoRA adapters of a Linear (see `lora`): A [..., d_in, r] takes the kernel's input-dim axis, B
    [..., r, d_out] its output-dim one; the rank dim is replicated."""
    out = []
    for pat, spec in rules:
        if pat.endswith("/kernel"):
            out.append((pat[: -len("kernel")] + "lora/a", P(*spec[:-1], None)))
            out.append((pat[: -len("kernel")] + "lora/b", P(*spec[:-2], None, spec[-1])))
    return out


LM_RULES = _lora_rules(LM_RULES) + LM_RULES


def fit_spec(spec: P, shape: tuple[int, ...], axis_sizes: dict[str, int]) -> P:
    """Drop mesh axes that the mesh lacks or whose size does not divide the dim."""
    out = []
    for i, entry in enumerate(tuple(spec)[: len(shape)]):
        names = entry if isinstance(entry, tuple) else (entry,) if entry else ()
        kept = tuple(n for n in names if n in axis_sizes)
        while kept and shape[i] % math.prod(axis_sizes[n] for n in kept):
            kept = kept[:-1]
        out.append(kept if len(kept) > 1 else (kept[0] if kept else None))
    return P(*out)


def param_specs(state: Any, mesh: Mesh, rules=LM_RULES) -> Any:
    """PartitionSpec pytree for an nnx.State / param pytree, fitted to `mesh`."""
    specs = match_partition_rules(rules, state)
    sizes = dict(mesh.shape)
    return jax.tree.map(
        lambda s, x: fit_spec(s, x.shape, sizes), specs, state, is_leaf=lambda x: isinstance(x, P)
    )


def shard_state(state: Any, mesh: Mesh, rules=LM_RULES) -> Any:
    """Every leaf placed with its fitted NamedSharding (a mesh across processes: each process puts its
    own shards of the value it holds, the same on every process)."""
    specs = param_specs(state, mesh, rules)
    return jax.tree.map(
        lambda x, s: to_global(x, NamedSharding(mesh, s)), state, specs, is_leaf=lambda x: isinstance(x, P)
    )


def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Shard dim 0 of a batch array over the batch axes present in `mesh`."""
    return NamedSharding(mesh, fit_spec(P(BATCH_AXES), shape, dict(mesh.shape)))


def constrain(x: jax.Array, spec: tuple) -> jax.Array:
    """with_sharding_constraint under an active mesh (jax.set_mesh); a no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, fit_spec(P(*spec), x.shape, dict(mesh.shape)))
