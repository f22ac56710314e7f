"""Meshes from a spec string, partition rules for pytrees, and a sharded train step.

``make_mesh("data=2,fsdp=2,tensor=2")`` builds a ``jax.sharding.Mesh`` over the
available devices (one axis may be ``-1`` to take what is left). Parameters are
placed with ``match_partition_rules``: a list of ``(regex, PartitionSpec)`` whose
first regex found (``re.search``) in a leaf's '/'-joined path wins; scalars are
always replicated. The same rules apply to optimizer states because their paths
end in the parameter paths.

``config_mesh(spec)`` is the rule behind the trainers' ``mesh`` config fields: a given spec, else a
``data`` axis over every device of every process in a multi-process run, else no mesh (one device).
``data_mesh(spec, sizes, who)`` is that mesh checked for a batch split over ``data``; ``split_batch`` /
``replicate`` place host values on it (each process its own slice / a full copy), and
``split_along(tree, mesh, dim)`` constrains batch leaves inside jit (dim ``dim`` over ``data``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_reason.parallel import distributed

Rules = Sequence[tuple[str, P]]


def parse_mesh_spec(spec: str | Mapping[str, int]) -> dict[str, int]:
    """``"data=2,tensor=4"`` -> ``{"data": 2, "tensor": 4}`` (order kept)."""
    if isinstance(spec, Mapping):
        return {str(k): int(v) for k, v in spec.items()}
    axes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, size = part.partition("=")
        if not sep or not name.strip() or not re.fullmatch(r"-?\d+", size.strip()):
            raise ValueError(f"bad mesh spec {spec!r}: expected comma-separated axis=size, e.g. 'data=2,tensor=4'")
        if name.strip() in axes:
            raise ValueError(f"bad mesh spec {spec!r}: axis {name.strip()!r} appears twice")
        axes[name.strip()] = int(size)
    if not axes:
        raise ValueError(f"empty mesh spec {spec!r}; e.g. 'data=8'")
    return axes


def make_mesh(spec: str | Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh with the named axes; the sizes must multiply to the device count."""
    devices = list(jax.devices() if devices is None else devices)
    axes = parse_mesh_spec(spec)
    free = [k for k, v in axes.items() if v == -1]
    if len(free) > 1:
        raise ValueError(f"mesh spec {spec!r}: at most one axis may be -1")
    fixed = math.prod(v for v in axes.values() if v != -1)
    if any(v < 1 and v != -1 for v in axes.values()):
        raise ValueError(f"mesh spec {spec!r}: axis sizes must be >= 1 (or -1 for the rest)")
    if free:
        if len(devices) % fixed:
            raise ValueError(f"mesh spec {spec!r}: {len(devices)} devices are not divisible by {fixed}")
        axes[free[0]] = len(devices) // fixed
    if math.prod(axes.values()) != len(devices):
        raise ValueError(
            f"mesh spec {spec!r} needs {math.prod(axes.values())} devices but {len(devices)} are "
            f"available; make the sizes multiply to {len(devices)} (e.g. 'data={len(devices)}') "
            "or use -1 for one axis"
        )
    grid = np.asarray(devices).reshape(tuple(axes.values()))
    return Mesh(grid, tuple(axes))


def config_mesh(spec: str | None) -> Mesh | None:
    """The mesh of a trainer's ``mesh`` field: ``make_mesh(spec)``; with ``spec=None``, ``data=-1`` over all
    devices when the run spans processes (each process computes its slice of the batch), else None."""
    if spec is None:
        return make_mesh("data=-1") if distributed.process_count() > 1 else None
    return make_mesh(spec)


def data_mesh(spec: str | None, sizes: Mapping[str, int], who: str) -> Mesh | None:
    """``config_mesh(spec)`` for a trainer that splits its batch over the mesh's ``data`` axis, checked: the
    axis exists and every size in ``sizes`` (``{what: rows}``) divides over it. None: one device, no split."""
    mesh = config_mesh(spec)
    if mesh is None:
        return None
    if "data" not in mesh.shape:
        raise ValueError(f"{who}.mesh {spec!r} has no 'data' axis to split the batch over")
    check_data_split(mesh, sizes, who)
    return mesh


def check_data_split(mesh: Mesh | None, sizes: Mapping[str, int], who: str) -> None:
    """A clear ``ValueError`` unless every size in ``sizes`` (``{what: rows}``) divides over the ``data`` axis."""
    n = mesh.shape["data"] if mesh is not None else 1
    for what, size in sizes.items():
        if size % n:
            raise ValueError(
                f"{who} {what} = {size} is not divisible by the {n} devices of the 'data' mesh axis "
                f"({distributed.process_count()} process(es) x {jax.local_device_count()} device(s)); "
                f"use a multiple of {n}"
            )


def replicate(tree: Any, mesh: Mesh | None) -> Any:
    """Every leaf of ``tree`` (host or local arrays, the same on every process) replicated over ``mesh``'s
    devices (all processes' ones). No-op without a mesh."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: distributed.to_global(x, sharding), tree)


def split_batch(tree: Any, mesh: Mesh | None, axes: Sequence[str] = ("data",)) -> Any:
    """Outside jit: every leaf of ``tree`` (host values, the same on every process) split along dim 0 over
    the mesh ``axes`` (scalars replicated); each process places only its own slice. No-op without a mesh."""
    if mesh is None:
        return tree
    spec = lambda x: P(tuple(axes)) if np.ndim(x) else P()
    return jax.tree.map(lambda x: distributed.to_global(x, NamedSharding(mesh, spec(x))), tree)


def split_along(tree: Any, mesh: Mesh | None, dim: int | None, axes: Sequence[str] = ("data",)) -> Any:
    """Inside jit: every leaf of ``tree`` split along ``dim`` over the mesh ``axes`` (``dim=None``, or a
    leaf of rank <= dim: replicated). No-op without a mesh."""
    if mesh is None:
        return tree

    def one(x):
        spec = P() if dim is None or np.ndim(x) <= dim else P(*([None] * dim), tuple(axes))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return jax.tree.map(one, tree)


def _path_str(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def match_partition_rules(rules: Rules, tree: Any, default: P = P()) -> Any:
    """Pytree of ``PartitionSpec`` for ``tree``: first matching rule, else ``default``."""
    compiled = [(re.compile(r), spec) for r, spec in rules]

    def spec_for(path, leaf):
        if np.ndim(leaf) == 0:
            return P()
        name = _path_str(path)
        for regex, spec in compiled:
            if regex.search(name):
                if len(spec) > np.ndim(leaf):
                    raise ValueError(f"rule {regex.pattern!r} gives {spec} for {name} of rank {np.ndim(leaf)}")
                return spec
        return default

    return jax.tree_util.tree_map_with_path(spec_for, tree)


def named_shardings(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def shard_pytree(tree: Any, mesh: Mesh, specs: Any) -> Any:
    """``device_put`` every leaf with its ``NamedSharding``."""
    return jax.device_put(tree, named_shardings(mesh, specs))


def check_batch_divides(batch_size: int, mesh: Mesh, axes: Sequence[str]) -> None:
    n = math.prod(mesh.shape[a] for a in axes)
    if batch_size % n:
        raise ValueError(
            f"batch size {batch_size} is not divisible by the {'x'.join(axes)} mesh axes ({n} devices); "
            f"use a multiple of {n}"
        )


def make_sharded_train_step(
    loss_fn: Callable[[Any, Any], jax.Array],
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    param_specs: Any,
    opt_specs: Any,
    batch_axes: Sequence[str] = ("data",),
):
    """Jitted ``step(params, opt_state, batch) -> (params, opt_state, loss)``.

    Params and optimizer state keep their shardings (explicit in/out
    shardings); every batch leaf is split along its first dimension over
    ``batch_axes``; the loss comes back replicated. The gradient all-reduce
    over the data axes is inserted by XLA from the shardings.
    """
    batch_spec = P(tuple(batch_axes))
    param_sh, opt_sh = named_shardings(mesh, param_specs), named_shardings(mesh, opt_specs)
    batch_sh = NamedSharding(mesh, batch_spec)
    replicated = NamedSharding(mesh, P())

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, in_shardings=(param_sh, opt_sh, batch_sh), out_shardings=(param_sh, opt_sh, replicated))

    def checked(params, opt_state, batch):
        check_batch_divides(jax.tree.leaves(batch)[0].shape[0], mesh, batch_axes)
        return jitted(params, opt_state, batch)

    return checked
