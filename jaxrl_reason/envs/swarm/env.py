"""UAV swarm pursuit-evasion / coverage environment (RALLY setting), simultaneous moves.

``N`` UAVs in the arena ``[-1, 1]^d`` (``d`` = 2, or 3 with ``dim=3``) must cover ``M``
static targets, each with an urgency weight in ``[0.2, 1]`` and a need of 1..``max_need``
UAVs, while ``K`` pursuers hunt them; ``O`` optional spherical obstacles.

Dynamics (every step lasts ``dt``):
  * ``dynamics="double_integrator"``: ``v' = clip(v + a dt, max_speed)``, ``p' = p + v' dt``
    with ``|a| <= max_accel``;
  * ``dynamics="point_mass"``: the command is a desired velocity, tracked with the same
    acceleration limit (first-order response).
  UAVs are clipped to the arena (velocity into a wall zeroed) and pushed out of obstacles.

Actions of the UAVs (agents ``0..N-1``):
  * ``control="discrete"`` (default): ``num_actions = M * 3``; action ``a`` means
    (target ``a // 3``, role ``a % 3``) with roles Commander (0: flies to the target and
    evades visible pursuers), Coordinator (1: takes its formation slot on a ring around
    the target) and Executor (2: flies straight to the target centre). The built-in
    low-level controller turns the intention into a velocity command. Out-of-range
    actions are clipped into ``[0, num_actions)``; every action is legal (rule "none").
  * ``control="continuous"``: ``action_dim = d``, ``action [A, d]`` in ``[-1, 1]`` (clipped),
    scaled by ``max_accel`` (double integrator) or ``max_speed`` (point mass);
    ``num_actions = 1`` and the mask is all True. A non-finite component (NaN, +-inf) counts
    as 0 (no acceleration / zero desired velocity) and ``info["nonfinite_action"]`` (``[A]`` bool)
    flags the agents that sent one, so positions never become NaN from actions.

Pursuers, at ``adversary_speed`` (< ``max_speed``):
  * ``adversary_control="scripted"`` (default): each chases the nearest active UAV within
    ``detect_radius``, else guards the most urgent unserved target;
  * ``adversary_control="learned"``: the pursuers are extra agents ``N..N+K-1``
    (``num_agents = N + K``) with their own actions. Discrete: ``0`` = the scripted chase,
    ``1`` = guard the most urgent unserved target, ``a >= 2`` = fly along heading
    ``2 pi (a - 2) / (num_actions - 2)`` in the x-y plane (clipped like the UAVs'
    actions). Continuous: a desired velocity ``action * adversary_speed``.
    A pursuer's reward is ``w_capture`` per UAV captured this step minus the team's
    coverage/completion term (zero-sum against the mission). Pursuers are never removed.
A UAV within ``capture_radius`` of a pursuer is captured: frozen and inactive for the
rest of the episode.

Rewards (``[A]`` float32, all weights configurable), UAVs:
  * team, to every UAV: ``w_cover * sum_j u_j c_j / sum_j u_j`` over unserved targets,
    with coverage ``c_j = min(#UAVs within cover_radius, need_j) / need_j``;
    ``w_complete * u_j`` when target ``j`` becomes served (its accumulated coverage
    reaches ``serve_steps``);
  * individual: ``-w_capture`` on capture; ``-w_collision`` per step while within
    ``collision_radius`` of another active UAV or inside an obstacle.
  With ``team_reward=True`` the UAVs' individual penalties are summed and shared, so every
  UAV gets the same reward (what QMIX-style value mixing assumes).

Episode end: ``terminated`` when every target is served (mission complete) or every
UAV is captured; ``truncated`` after ``max_steps`` steps otherwise.

Observation of agent ``i`` (flat float32 vector; ``Swarm.obs_slices`` names the parts):
own state (position, velocity / max_speed, active flag, time fraction, formation slot
direction, own last intention), then per target (relative position, urgency, served,
coverage achieved in the last step, visible), per pursuer (relative position and velocity,
visible), per obstacle (relative position, visible) - all zero unless within
``obs_radius`` - and the ``num_neighbors`` nearest other UAVs within ``comm_radius``
(relative position and velocity, active flag, their message = last (target, role)
one-hots, present). A learned pursuer sees the same layout from its own position; its
"neighbours" are the nearest UAVs within ``obs_radius`` (their broadcasts intercepted).

``ts.info``: ``coverage`` (urgency-weighted coverage of the last step), ``num_captured``,
``num_served`` and ``nonfinite_action`` (``[A]`` bool, always False for discrete control)
describe the last transition; ``global_state`` (``[state_dim]`` for
centralised critics) and ``neighbors`` (``[A, k]`` int32 UAV indices, -1 where none)
describe the state the observation shows (after an auto-reset: the new episode's).

Written as a ``SplitEnvironment`` (``reset_state`` / ``transition`` / ``observe``), so
``envs.AutoReset`` encodes the observation once per step.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.envs.core import Observation, SplitEnvironment, TimeStep, Transition
from jaxrl_reason.envs.swarm import dynamics as dyn
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class SwarmConfig:
    num_agents: int = 4  # UAVs (learned pursuers are added to the env's agents)
    num_targets: int = 3
    num_adversaries: int = 1
    num_obstacles: int = 0
    dim: int = 2
    dynamics: str = "double_integrator"  # or "point_mass"
    control: str = "discrete"  # or "continuous"
    adversary_control: str = "scripted"  # or "learned"
    num_neighbors: int = 3  # messages from at most this many nearest neighbours
    max_steps: int = 100
    dt: float = 0.1
    max_speed: float = 0.5
    max_accel: float = 2.0
    adversary_speed: float = 0.3
    detect_radius: float = 0.4
    obs_radius: float = 0.6
    comm_radius: float = 0.8
    cover_radius: float = 0.15
    capture_radius: float = 0.06
    collision_radius: float = 0.04
    obstacle_radius: float = 0.1
    max_need: int = 2
    serve_steps: float = 10.0
    w_cover: float = 1.0
    w_complete: float = 2.0
    w_capture: float = 2.0
    w_collision: float = 0.2
    team_reward: bool = False

    def __post_init__(self):
        check_hyperparameters(self)
        for name in ("num_agents", "num_targets", "max_steps", "max_need"):
            if getattr(self, name) < 1:
                raise ValueError(f"SwarmConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_adversaries", "num_obstacles", "num_neighbors"):
            if getattr(self, name) < 0:
                raise ValueError(f"SwarmConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.dim not in (2, 3):
            raise ValueError(f"SwarmConfig.dim must be 2 or 3, got {self.dim}")
        if self.dynamics not in ("double_integrator", "point_mass"):
            raise ValueError(f"SwarmConfig.dynamics must be 'double_integrator' or 'point_mass', got {self.dynamics!r}")
        if self.control not in ("discrete", "continuous"):
            raise ValueError(f"SwarmConfig.control must be 'discrete' or 'continuous', got {self.control!r}")
        if self.adversary_control not in ("scripted", "learned"):
            raise ValueError("SwarmConfig.adversary_control must be 'scripted' or 'learned', "
                             f"got {self.adversary_control!r}")
        if self.adversary_control == "learned" and self.num_adversaries < 1:
            raise ValueError("SwarmConfig.adversary_control='learned' needs num_adversaries >= 1")
        for name in ("dt", "max_speed", "max_accel", "obs_radius", "comm_radius", "cover_radius",
                     "serve_steps", "detect_radius"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SwarmConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("adversary_speed", "capture_radius", "collision_radius", "obstacle_radius"):
            if getattr(self, name) < 0:
                raise ValueError(f"SwarmConfig.{name} must be >= 0, got {getattr(self, name)}")


@struct.dataclass
class SwarmState:
    pos: jax.Array  # [N, d]
    vel: jax.Array  # [N, d]
    alive: jax.Array  # [N] bool, False once captured
    last_action: jax.Array  # [N] int32 last discrete intention (-1: none)
    target_pos: jax.Array  # [M, d]
    urgency: jax.Array  # [M] in [0.2, 1]
    need: jax.Array  # [M] float32 UAVs needed for full coverage
    progress: jax.Array  # [M] accumulated coverage
    cover: jax.Array  # [M] coverage achieved in the last step (0 at reset)
    served: jax.Array  # [M] bool
    adv_pos: jax.Array  # [K, d]
    adv_vel: jax.Array  # [K, d]
    obstacles: jax.Array  # [O, d]
    t: jax.Array  # int32 steps taken


def _sqdist(a, b):
    """``[..., P, d], [..., Q, d] -> [..., P, Q]`` squared distances."""
    return dyn.sq_norm(b[..., None, :, :] - a[..., :, None, :])


class Swarm(SplitEnvironment):
    """See the module docstring. Build with ``envs.make("swarm", **SwarmConfig fields)``."""

    turn_based = False
    illegal_action_rule = "none"
    deterministic_transition = True  # all chance is in the reset: AutoReset skips the per-step key split
    conformance_variants = (
        {},
        {"control": "continuous", "dynamics": "point_mass", "num_obstacles": 1, "max_steps": 20},
        {"adversary_control": "learned", "num_adversaries": 2, "max_steps": 20},
    )

    def info_metrics(self, info: dict) -> dict:
        """``coverage``: urgency-weighted coverage of the last step."""
        return {"coverage": info["coverage"]}

    def __init__(self, **kwargs):
        self.config = c = SwarmConfig(**kwargs)
        self.num_uavs = c.num_agents
        self.learned_adversaries = c.adversary_control == "learned"
        self.num_agents = c.num_agents + (c.num_adversaries if self.learned_adversaries else 0)
        self.num_targets = c.num_targets
        self.max_episode_steps = c.max_steps
        self.action_dim = c.dim if c.control == "continuous" else None
        self.num_actions = c.num_targets * dyn.NUM_ROLES if c.control == "discrete" else 1
        self.k = min(c.num_neighbors, c.num_agents - 1)
        self.msg_dim = c.num_targets + dyn.NUM_ROLES
        d, M, K, O = c.dim, c.num_targets, c.num_adversaries, c.num_obstacles
        parts = [("own", 2 * d + 4 + self.msg_dim), ("targets", M * (d + 4)),
                 ("adversaries", K * (2 * d + 1)), ("obstacles", O * (d + 1)),
                 ("neighbors", self.k * (2 * d + 2 + self.msg_dim))]
        self.obs_slices, start = {}, 0
        for name, size in parts:
            self.obs_slices[name] = slice(start, start + size)
            start += size
        self.obs_shape = (start,)
        self.state_dim = c.num_agents * (2 * d + 1) + M * (d + 4) + K * 2 * d + O * d + 1
        angles = 2.0 * np.pi * np.arange(c.num_agents) / c.num_agents
        slot = np.zeros((c.num_agents, d), np.float32)
        slot[:, 0], slot[:, 1] = np.cos(angles), np.sin(angles)
        self.slot_dir = slot
        others = np.array([[j for j in range(c.num_agents) if j != i] for i in range(c.num_agents)],
                          np.int32).reshape(c.num_agents, c.num_agents - 1)
        self._others = others if self.k == c.num_agents - 1 else None

    @classmethod
    def from_config(cls, config: SwarmConfig) -> "Swarm":
        return cls(**dataclasses.asdict(config))

    # ------------------------------------------------------------------ reset
    def reset_state(self, key) -> SwarmState:
        c = self.config
        d, N, M, K, O = c.dim, c.num_agents, c.num_targets, c.num_adversaries, c.num_obstacles
        # one uniform draw sliced into every field: a single PRNG call keeps the reset cheap
        # (under vmap, AutoReset runs it every step)
        sizes = [N * d, M * d, M, M, K * d, O * d]
        u = jax.random.uniform(key, (sum(sizes),), jnp.float32)
        pos_u, tgt_u, urg_u, need_u, adv_u, obs_u = jnp.split(u, np.cumsum(sizes)[:-1])
        f32 = jnp.float32
        return SwarmState(
            pos=(pos_u.reshape(N, d) * 1.8 - 0.9),
            vel=jnp.zeros((N, d), f32),
            alive=jnp.ones((N,), bool),
            last_action=jnp.full((N,), -1, jnp.int32),
            target_pos=tgt_u.reshape(M, d) * 1.6 - 0.8,
            urgency=0.2 + 0.8 * urg_u,
            need=jnp.floor(1.0 + need_u * c.max_need).clip(1, c.max_need),
            progress=jnp.zeros((M,), f32),
            cover=jnp.zeros((M,), f32),
            served=jnp.zeros((M,), bool),
            adv_pos=adv_u.reshape(K, d) * 1.8 - 0.9,
            adv_vel=jnp.zeros((K, d), f32),
            obstacles=obs_u.reshape(O, d) * 1.4 - 0.7,
            t=jnp.int32(0),
        )

    def reset_info(self, state: SwarmState) -> dict:
        return self._outcome_info(state, jnp.float32(0.0), jnp.zeros((self.num_agents,), bool))

    # ------------------------------------------------------------------- step
    def transition(self, key, state: SwarmState, action) -> Transition:
        c = self.config
        N = c.num_agents
        alive = state.alive
        if c.control == "continuous":  # a non-finite component counts as 0, flagged per agent
            finite = jnp.isfinite(action)
            action, nonfinite = jnp.where(finite, action, 0.0), ~jnp.all(finite, -1)
        else:
            nonfinite = jnp.zeros((self.num_agents,), bool)
        uav_action = action[:N]
        if c.control == "discrete":
            uav_action = jnp.clip(jnp.asarray(uav_action, jnp.int32), 0, self.num_actions - 1)
            tgt, role = uav_action // dyn.NUM_ROLES, uav_action % dyn.NUM_ROLES
            adv_vis = _sqdist(state.pos, state.adv_pos) < c.obs_radius**2  # [N, K]
            goal = dyn.role_goals(state.target_pos, tgt, role, self.slot_dir, 0.7 * c.cover_radius)
            v_des = dyn.controller_velocity(
                state.pos, goal, state.adv_pos, adv_vis, evade=role == dyn.COMMANDER,
                max_speed=c.max_speed, slow_radius=0.1, evade_radius=c.obs_radius, evade_gain=1.5)
            accel = dyn.velocity_command_accel(state.vel, v_des, c.dt, c.max_accel)
            last_action = uav_action
        else:
            u = jnp.clip(jnp.asarray(uav_action, jnp.float32), -1.0, 1.0)
            if c.dynamics == "double_integrator":
                accel = u * c.max_accel
            else:
                accel = dyn.velocity_command_accel(state.vel, u * c.max_speed, c.dt, c.max_accel)
            last_action = state.last_action
        pos, vel = dyn.integrate(state.pos, state.vel, accel, c.dt, c.max_speed, c.max_accel)
        if c.num_obstacles:
            pos, hit_obstacle = dyn.project_out_of_spheres(pos, state.obstacles, c.obstacle_radius)
        else:
            hit_obstacle = jnp.zeros((N,), bool)
        pos, vel = dyn.clip_to_arena(pos, vel, 1.0)
        pos = jnp.where(alive[:, None], pos, state.pos)
        vel = jnp.where(alive[:, None], vel, 0.0)

        adv_v = self._pursuer_velocity(state, pos, action[N:] if self.learned_adversaries else None)
        adv_acc = dyn.velocity_command_accel(state.adv_vel, adv_v, c.dt, c.max_accel)
        adv_pos, adv_vel = dyn.integrate(state.adv_pos, state.adv_vel, adv_acc, c.dt,
                                         c.adversary_speed, c.max_accel)
        adv_pos, adv_vel = dyn.clip_to_arena(adv_pos, adv_vel, 1.0)

        captured = alive & jnp.any(_sqdist(pos, adv_pos) < c.capture_radius**2, -1)
        alive_next = alive & ~captured
        d_uav = _sqdist(pos, pos)
        close = (d_uav < c.collision_radius**2) & ~jnp.eye(N, dtype=bool) & alive_next[None, :]
        collided = alive_next & (jnp.any(close, -1) | hit_obstacle)

        near = (_sqdist(state.target_pos, pos) < c.cover_radius**2) & alive_next[None, :]
        covering = dyn.small_sum(near.astype(jnp.float32))  # UAVs within reach of each target
        cover = jnp.where(state.served, 0.0, jnp.minimum(covering, state.need) / state.need)
        progress = state.progress + cover
        newly_served = ~state.served & (progress >= c.serve_steps)
        served = state.served | newly_served
        u = state.urgency
        weighted_cover = dyn.small_sum(u * cover) / dyn.small_sum(u)
        team = c.w_cover * weighted_cover + c.w_complete * dyn.small_sum(u * newly_served)
        individual = -c.w_capture * captured - c.w_collision * collided
        if c.team_reward:
            individual = jnp.broadcast_to(individual.sum(), (N,))
        reward = team + individual
        if self.learned_adversaries:
            pursuer = c.w_capture * captured.sum() - team
            reward = jnp.concatenate([reward, jnp.broadcast_to(pursuer, (c.num_adversaries,))])

        t = state.t + 1
        terminated = jnp.all(served) | ~jnp.any(alive_next)
        truncated = (t >= c.max_steps) & ~terminated
        new_state = SwarmState(pos, vel, alive_next, last_action, state.target_pos, u, state.need,
                               progress, cover, served, adv_pos, adv_vel, state.obstacles, t)
        return Transition(new_state, reward.astype(jnp.float32), terminated, truncated,
                          self._outcome_info(new_state, weighted_cover, nonfinite))

    def _pursuer_velocity(self, state: SwarmState, pos, action):
        """Desired pursuer velocities ``[K, d]`` (``action``: learned pursuers' actions, or None)."""
        c = self.config
        d_adv = _sqdist(state.adv_pos, pos) + jnp.where(state.alive, 0.0, 1e9)[None, :]  # [K, N]
        nearest = jnp.argmin(d_adv, -1)
        chase = jnp.min(d_adv, -1) < c.detect_radius**2
        guard = state.target_pos[jnp.argmax(state.urgency - 2.0 * state.served)]
        chase_goal = jnp.where(chase[:, None], pos[nearest], guard[None, :])
        seek = lambda goal: dyn.seek_velocity(state.adv_pos, goal, c.adversary_speed, 0.05)
        if action is None:
            return seek(chase_goal)
        if c.control == "continuous":
            u = jnp.clip(jnp.asarray(action, jnp.float32), -1.0, 1.0)
            return dyn.clip_norm(u, 1.0) * c.adversary_speed
        a = jnp.clip(jnp.asarray(action, jnp.int32), 0, self.num_actions - 1)
        goal = jnp.where((a == 0)[:, None], chase_goal, guard[None, :])
        angle = 2.0 * jnp.pi * (a - 2) / max(self.num_actions - 2, 1)
        return jnp.where((a >= 2)[:, None], dyn.heading(angle, c.dim) * c.adversary_speed, seek(goal))

    def _outcome_info(self, state: SwarmState, weighted_cover, nonfinite) -> dict:
        return {"coverage": jnp.asarray(weighted_cover, jnp.float32),
                "num_captured": dyn.small_sum((~state.alive).astype(jnp.int32)),
                "num_served": dyn.small_sum(state.served.astype(jnp.int32)),
                "nonfinite_action": nonfinite}

    # ------------------------------------------------------------ observation
    def messages(self, state: SwarmState) -> jax.Array:
        """``[N, M + 3]`` each UAV's broadcast: one-hot target and role of its last intention."""
        a = state.last_action
        valid = (a >= 0) & state.alive
        tgt = jax.nn.one_hot(jnp.where(valid, a // dyn.NUM_ROLES, -1), self.num_targets)
        role = jax.nn.one_hot(jnp.where(valid, a % dyn.NUM_ROLES, -1), dyn.NUM_ROLES)
        return jnp.concatenate([tgt, role], -1)

    def neighbors(self, state: SwarmState):
        """``(idx [N, k] int32, present [N, k] bool)``: nearest other UAVs within comm_radius."""
        c = self.config
        N = c.num_agents
        if self.k == 0:
            return jnp.zeros((N, 0), jnp.int32), jnp.zeros((N, 0), bool)
        if self._others is not None:
            idx = jnp.asarray(self._others)
            rel = state.pos[idx] - state.pos[:, None, :]
            d2 = dyn.sq_norm(rel)
        else:
            d2_all = _sqdist(state.pos, state.pos) + jnp.where(jnp.eye(N, dtype=bool), jnp.inf, 0.0)
            neg, idx = jax.lax.top_k(-d2_all, self.k)
            d2 = -neg
        present = (d2 < c.comm_radius**2) & state.alive[idx] & state.alive[:, None]
        return idx.astype(jnp.int32), present

    def _view(self, state, me_pos, me_vel, me_active, own_extra, nb_idx, nb_present, msg):
        """Observations ``[P, obs_dim]`` of ``P`` observers at ``me_pos``/``me_vel`` ``[P, d]``
        (``me_active`` ``[P]`` float, ``own_extra`` ``[P, 2 + msg_dim]`` slot and message,
        neighbour UAV indices/presence ``[P, k]``)."""
        c = self.config
        P = me_pos.shape[0]
        me = me_active[:, None]

        def sensed(rel, extra):  # rel [P, Q, d], extra [P, Q, e] -> [P, Q*(d+e+1)]
            vis = (dyn.sq_norm(rel, True) < c.obs_radius**2) * me[:, None, :]
            return (jnp.concatenate([rel, extra, jnp.ones_like(vis)], -1) * vis).reshape(P, -1)

        t_frac = jnp.broadcast_to(state.t / c.max_steps, (P, 1)).astype(jnp.float32)
        parts = [me_pos, me_vel / c.max_speed, me, t_frac, own_extra]
        tgt_extra = jnp.stack([state.urgency, state.served.astype(jnp.float32), state.cover], -1)
        parts.append(sensed(state.target_pos[None] - me_pos[:, None],
                            jnp.broadcast_to(tgt_extra, (P, *tgt_extra.shape))))
        if c.num_adversaries:
            parts.append(sensed(state.adv_pos[None] - me_pos[:, None],
                                (state.adv_vel[None] - me_vel[:, None]) / c.max_speed))
        if c.num_obstacles:
            parts.append(sensed(state.obstacles[None] - me_pos[:, None],
                                jnp.zeros((P, c.num_obstacles, 0), jnp.float32)))
        if self.k:
            nb = jnp.concatenate([state.pos[nb_idx] - me_pos[:, None],
                                  (state.vel[nb_idx] - me_vel[:, None]) / c.max_speed,
                                  state.alive[nb_idx][..., None].astype(jnp.float32), msg[nb_idx],
                                  jnp.ones((P, self.k, 1), jnp.float32)], -1)
            parts.append((nb * nb_present[..., None]).reshape(P, -1))
        return jnp.concatenate(parts, -1)

    def encode(self, state: SwarmState):
        """``(obs [A, obs_dim], neighbor_idx [A, k])`` (index -1 where no neighbour)."""
        c = self.config
        msg = self.messages(state)
        idx, present = self.neighbors(state)
        own_extra = jnp.concatenate([jnp.asarray(self.slot_dir[:, :2]), msg], -1)
        obs = self._view(state, state.pos, state.vel, state.alive.astype(jnp.float32), own_extra, idx, present, msg)
        nbrs = jnp.where(present, idx, -1)
        if self.learned_adversaries:
            K = c.num_adversaries
            d2 = _sqdist(state.adv_pos, state.pos) + jnp.where(state.alive, 0.0, jnp.inf)[None]  # [K, N]
            neg, a_idx = jax.lax.top_k(-d2, self.k)
            a_present = -neg < c.obs_radius**2
            a_obs = self._view(state, state.adv_pos, state.adv_vel, jnp.ones((K,), jnp.float32),
                               jnp.zeros((K, 2 + self.msg_dim), jnp.float32), a_idx, a_present, msg)
            obs = jnp.concatenate([obs, a_obs], 0)
            nbrs = jnp.concatenate([nbrs, jnp.where(a_present, a_idx, -1).astype(jnp.int32)], 0)
        return obs, nbrs

    def observe(self, state: SwarmState) -> Observation:
        return Observation(self.encode(state)[0], self._legal(), jnp.int32(-1))

    def _legal(self):
        return jnp.ones((self.num_agents, self.num_actions), bool)

    def global_state(self, state: SwarmState) -> jax.Array:
        """``[state_dim]`` full state for centralised critics and mixers."""
        c = self.config
        return jnp.concatenate([
            state.pos.ravel(), (state.vel / c.max_speed).ravel(), state.alive.astype(jnp.float32),
            state.target_pos.ravel(), state.urgency, state.need / c.max_need,
            state.served.astype(jnp.float32), state.progress / c.serve_steps,
            state.adv_pos.ravel(), (state.adv_vel / c.max_speed).ravel(), state.obstacles.ravel(),
            jnp.reshape(state.t / c.max_steps, (1,)).astype(jnp.float32),
        ])

    def timestep(self, state, reward, terminated, truncated, info) -> TimeStep:
        """The observation plus the state-side info (``global_state``, ``neighbors``) of ``state``."""
        obs, nbrs = self.encode(state)
        return TimeStep(
            obs=obs,
            reward=jnp.asarray(reward, jnp.float32),
            terminated=jnp.asarray(terminated, bool),
            truncated=jnp.asarray(truncated, bool),
            legal_action_mask=self._legal(),
            current_player=jnp.int32(-1),
            info={**info, "global_state": self.global_state(state), "neighbors": nbrs},
        )


# make(): the accepted keyword arguments are SwarmConfig's fields.
Swarm.__init__.__signature__ = inspect.Signature(
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + list(inspect.signature(SwarmConfig).parameters.values())
)
