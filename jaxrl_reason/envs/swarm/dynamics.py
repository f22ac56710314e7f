"""Pure kinematics of the swarm: norm clipping, limited integration, the low-level
controller that turns a (target, role) intention into a desired velocity, and
obstacle / arena projection. Every function works on any leading batch shape.

Sums over the coordinate axis (2 or 3 entries) and other short static axes go through ``small_sum``.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp

#: Role indices of the discrete high-level action ``action = target * NUM_ROLES + role``.
COMMANDER, COORDINATOR, EXECUTOR = 0, 1, 2
ROLE_NAMES = ("Commander", "Coordinator", "Executor")
NUM_ROLES = 3
_EPS = 1e-6
#: axes up to this length are summed by ``small_sum`` as elementwise adds
SMALL_AXIS = 4


def small_sum(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
    """``x.sum(axis, keepdims=keepdims)``, written as adds of the entries when the axis has at most
    ``SMALL_AXIS`` of them (a coordinate axis, a few pursuers): XLA on CPU runs a reduction that short as
    a reduce loop of its own (the swarm step spent most of its time in them), while adds fuse with the
    elementwise work around them."""
    n = x.shape[axis]
    if n > SMALL_AXIS or n == 0:
        return jnp.sum(x, axis, keepdims=keepdims)
    total = functools.reduce(operator.add, [jnp.take(x, i, axis) for i in range(n)])
    return jnp.expand_dims(total, axis) if keepdims else total


def sq_norm(v: jax.Array, keepdims: bool = False) -> jax.Array:
    """Squared Euclidean norm over the last axis of ``v`` ``[..., d]``."""
    return small_sum(v * v, -1, keepdims)


def clip_norm(v: jax.Array, max_norm) -> jax.Array:
    """Scale vectors ``[..., d]`` so that their Euclidean norm is at most ``max_norm``."""
    n = jnp.sqrt(sq_norm(v, True) + _EPS * _EPS)
    return v * jnp.minimum(1.0, max_norm / n)


def unit(v: jax.Array) -> jax.Array:
    return v / jnp.sqrt(sq_norm(v, True) + _EPS * _EPS)


def integrate(pos, vel, accel, dt: float, max_speed: float, max_accel: float):
    """Double integrator with limits: ``|a| <= max_accel``, ``|v'| <= max_speed``.

    ``pos, vel, accel``: ``[..., d]``. Returns ``(pos', vel')``.
    """
    accel = clip_norm(accel, max_accel)
    vel = clip_norm(vel + accel * dt, max_speed)
    return pos + vel * dt, vel


def velocity_command_accel(vel, v_des, dt: float, max_accel: float):
    """Acceleration that tracks a desired velocity within the acceleration limit."""
    return clip_norm((v_des - vel) / dt, max_accel)


def seek_velocity(pos, goal, max_speed: float, slow_radius: float):
    """Desired velocity ``[..., d]`` towards ``goal``, slowing down within ``slow_radius``."""
    to_goal = goal - pos
    dist = jnp.sqrt(sq_norm(to_goal, True) + _EPS * _EPS)
    return to_goal / dist * jnp.minimum(1.0, dist / slow_radius) * max_speed


def heading(angle: jax.Array, dim: int) -> jax.Array:
    """Unit vectors ``[..., dim]`` in the x-y plane at ``angle`` (radians)."""
    xy = jnp.stack([jnp.cos(angle), jnp.sin(angle)], -1)
    return jnp.pad(xy, [(0, 0)] * (xy.ndim - 1) + [(0, dim - 2)])


def controller_velocity(pos, goal, threats, threat_visible, *, evade: jax.Array,
                        max_speed: float, slow_radius: float, evade_radius: float,
                        evade_gain: float):
    """Desired velocity ``[N, d]``: fly to ``goal`` ``[N, d]``, slowing within ``slow_radius``;
    where ``evade`` ``[N]`` is set, add repulsion from visible ``threats`` ``[K, d]``
    (``threat_visible`` ``[N, K]``) that grows as they come within ``evade_radius``."""
    to_goal = goal - pos
    dist = jnp.sqrt(sq_norm(to_goal, True) + _EPS * _EPS)
    attract = to_goal / dist * jnp.minimum(1.0, dist / slow_radius)
    away = pos[:, None, :] - threats[None, :, :]  # [N, K, d]
    d_threat = jnp.sqrt(sq_norm(away) + _EPS * _EPS)  # [N, K]
    push = jnp.clip(1.0 - d_threat / evade_radius, 0.0, 1.0) * threat_visible
    repulse = small_sum(away / d_threat[..., None] * push[..., None], 1)
    direction = attract + evade_gain * evade[:, None] * repulse
    return clip_norm(direction, 1.0) * max_speed


def role_goals(pos_targets, target_idx, role, slot_dir, ring_radius: float):
    """Goal point per UAV ``[N, d]`` for the chosen target and role.

    Executor and Commander fly to the target centre (the Commander evades on the way,
    see ``controller_velocity``); the Coordinator takes its formation slot on a ring of
    ``ring_radius`` around the target (``slot_dir`` ``[N, d]`` unit vectors), which
    covers the target without crowding its centre.
    """
    centre = pos_targets[target_idx]
    return centre + jnp.where((role == COORDINATOR)[:, None], ring_radius * slot_dir, 0.0)


def project_out_of_spheres(pos, centres, radius: float):
    """Push points ``[N, d]`` out of spheres ``[O, d]`` of ``radius``.

    Returns ``(pos', inside [N] bool)``: ``inside`` marks points that were inside
    one (a collision with an obstacle).
    """
    rel = pos[:, None, :] - centres[None, :, :]
    d = jnp.sqrt(sq_norm(rel) + _EPS * _EPS)  # [N, O]
    pen = jnp.maximum(radius - d, 0.0)
    pos = pos + small_sum(rel / d[..., None] * pen[..., None], 1)
    return pos, jnp.any(pen > 0.0, -1)


def clip_to_arena(pos, vel, half_size: float):
    """Keep points in ``[-half_size, half_size]^d``; the velocity into a wall is zeroed."""
    out = jnp.abs(pos) > half_size
    return jnp.clip(pos, -half_size, half_size), jnp.where(out, 0.0, vel)
