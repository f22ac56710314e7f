"""UAV swarm pursuit-evasion / coverage environment (RALLY setting), simultaneous moves.

``N`` UAVs in the arena ``[-1, 1]^d`` (``d`` = 2, or 3 with ``dim=3``) must cover ``M``
static targets, each with an urgency weight in ``[0.2, 1]`` and a need of 1..``max_need``
UAVs, while ``K`` scripted pursuers hunt them; ``O`` optional spherical obstacles.

Dynamics (every step lasts ``dt``):
  * ``dynamics="double_integrator"``: ``v' = clip(v + a dt, max_speed)``, ``p' = p + v' dt``
    with ``|a| <= max_accel``;
  * ``dynamics="point_mass"``: the command is a desired velocity, tracked with the same
    acceleration limit (first-order response).
  UAVs are clipped to the arena (velocity into a wall zeroed) and pushed out of obstacles.

Actions:
  * ``control="discrete"`` (default): ``num_actions = M * 3``; action ``a`` means
    (target ``a // 3``, role ``a % 3``) with roles Commander (0: flies to the target and
    evades visible pursuers), Coordinator (1: takes its formation slot on a ring around
    the target) and Executor (2: flies straight to the target centre). The built-in
    low-level controller turns the intention into a velocity command. Out-of-range
    actions are clipped into ``[0, num_actions)``; every action is legal (rule "none").
  * ``control="continuous"``: ``action_dim = d``, ``action [N, d]`` in ``[-1, 1]`` (clipped),
    scaled by ``max_accel`` (double integrator) or ``max_speed`` (point mass);
    ``num_actions = 1`` and the mask is all True.

Pursuers (scripted): each chases the nearest alive UAV within ``detect_radius``, else
guards the most urgent unserved target, at ``adversary_speed`` (< ``max_speed``).
A UAV within ``capture_radius`` of a pursuer is captured: frozen and inactive for
the rest of the episode.

Rewards (``[N]`` float32, all weights configurable):
  * team, to every agent: ``w_cover * sum_j u_j c_j / sum_j u_j`` over unserved targets,
    with coverage ``c_j = min(#UAVs within cover_radius, need_j) / need_j``;
    ``w_complete * u_j`` when target ``j`` becomes served (its accumulated coverage
    reaches ``serve_steps``);
  * individual: ``-w_capture`` on capture; ``-w_collision`` per step while within
    ``collision_radius`` of another active UAV or inside an obstacle.
  With ``team_reward=True`` the individual penalties are summed and shared, so every
  agent gets the same reward (what QMIX-style value mixing assumes).

Episode end: ``terminated`` when every target is served (mission complete) or every
UAV is captured; ``truncated`` after ``max_steps`` steps otherwise.

Observation of UAV ``i`` (flat float32 vector; ``Swarm.obs_slices`` names the parts):
own state (position, velocity / max_speed, active flag, time fraction, formation slot
direction, own last intention), then per target (relative position, urgency, served,
coverage, visible), per pursuer (relative position and velocity, visible), per obstacle
(relative position, visible) - all zero unless within ``obs_radius`` - and the
``num_neighbors`` nearest other UAVs within ``comm_radius`` (relative position and
velocity, active flag, their message = last (target, role) one-hots, present).
``ts.info`` holds ``global_state`` (``[state_dim]`` for centralised critics),
``neighbors`` (``[N, k]`` int32 indices, -1 where no neighbour), ``coverage``,
``num_captured`` and ``num_served``.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.envs.core import Environment, TimeStep
from jaxrl_reason.envs.swarm import dynamics as dyn


@dataclasses.dataclass(frozen=True)
class SwarmConfig:
    num_agents: int = 4
    num_targets: int = 3
    num_adversaries: int = 1
    num_obstacles: int = 0
    dim: int = 2
    dynamics: str = "double_integrator"  # or "point_mass"
    control: str = "discrete"  # or "continuous"
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
    served: jax.Array  # [M] bool
    adv_pos: jax.Array  # [K, d]
    adv_vel: jax.Array  # [K, d]
    obstacles: jax.Array  # [O, d]
    t: jax.Array  # int32 steps taken


def _sqdist(a, b):
    """``[..., P, d], [..., Q, d] -> [..., P, Q]`` squared distances."""
    rel = b[..., None, :, :] - a[..., :, None, :]
    return jnp.sum(rel * rel, -1)


class Swarm(Environment):
    """See the module docstring. Build with ``envs.make("swarm", **SwarmConfig fields)``."""

    turn_based = False
    illegal_action_rule = "none"
    conformance_variants = (
        {},
        {"control": "continuous", "dynamics": "point_mass", "num_obstacles": 1, "max_steps": 20},
    )

    def __init__(self, **kwargs):
        self.config = c = SwarmConfig(**kwargs)
        self.num_agents = c.num_agents
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
    def reset(self, key):
        c = self.config
        d, N, M, K, O = c.dim, c.num_agents, c.num_targets, c.num_adversaries, c.num_obstacles
        # one uniform draw sliced into every field: a single PRNG call keeps the reset cheap
        # (under vmap, AutoReset runs it every step)
        sizes = [N * d, M * d, M, M, K * d, O * d]
        u = jax.random.uniform(key, (sum(sizes),), jnp.float32)
        pos_u, tgt_u, urg_u, need_u, adv_u, obs_u = jnp.split(u, np.cumsum(sizes)[:-1])
        f32 = jnp.float32
        state = SwarmState(
            pos=(pos_u.reshape(N, d) * 1.8 - 0.9),
            vel=jnp.zeros((N, d), f32),
            alive=jnp.ones((N,), bool),
            last_action=jnp.full((N,), -1, jnp.int32),
            target_pos=tgt_u.reshape(M, d) * 1.6 - 0.8,
            urgency=0.2 + 0.8 * urg_u,
            need=jnp.floor(1.0 + need_u * c.max_need).clip(1, c.max_need),
            progress=jnp.zeros((M,), f32),
            served=jnp.zeros((M,), bool),
            adv_pos=adv_u.reshape(K, d) * 1.8 - 0.9,
            adv_vel=jnp.zeros((K, d), f32),
            obstacles=obs_u.reshape(O, d) * 1.4 - 0.7,
            t=jnp.int32(0),
        )
        return state, self._timestep(state, jnp.zeros((N,), f32), jnp.bool_(False), jnp.bool_(False))

    # ------------------------------------------------------------------- step
    def step(self, key, state: SwarmState, action):
        c = self.config
        N = c.num_agents
        alive = state.alive
        adv_vis = _sqdist(state.pos, state.adv_pos) < c.obs_radius**2  # [N, K]
        if c.control == "discrete":
            action = jnp.clip(jnp.asarray(action, jnp.int32), 0, self.num_actions - 1)
            tgt, role = action // dyn.NUM_ROLES, action % dyn.NUM_ROLES
            goal = dyn.role_goals(state.target_pos, tgt, role, self.slot_dir, 0.7 * c.cover_radius)
            v_des = dyn.controller_velocity(
                state.pos, goal, state.adv_pos, adv_vis, evade=role == dyn.COMMANDER,
                max_speed=c.max_speed, slow_radius=0.1, evade_radius=c.obs_radius, evade_gain=1.5)
            accel = dyn.velocity_command_accel(state.vel, v_des, c.dt, c.max_accel)
            last_action = action
        else:
            u = jnp.clip(jnp.asarray(action, jnp.float32), -1.0, 1.0)
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

        # scripted pursuers: chase the nearest active UAV within detect_radius, else guard
        d_adv = _sqdist(state.adv_pos, pos) + jnp.where(alive, 0.0, 1e9)[None, :]  # [K, N]
        nearest = jnp.argmin(d_adv, -1)
        chase = jnp.min(d_adv, -1) < c.detect_radius**2
        guard = state.target_pos[jnp.argmax(state.urgency - 2.0 * state.served)]
        adv_goal = jnp.where(chase[:, None], pos[nearest], guard[None, :])
        adv_v = dyn.controller_velocity(
            state.adv_pos, adv_goal, state.adv_pos[:0], jnp.zeros((c.num_adversaries, 0)),
            evade=jnp.zeros((c.num_adversaries,), bool), max_speed=c.adversary_speed,
            slow_radius=0.05, evade_radius=1.0, evade_gain=0.0)
        adv_acc = dyn.velocity_command_accel(state.adv_vel, adv_v, c.dt, c.max_accel)
        adv_pos, adv_vel = dyn.integrate(state.adv_pos, state.adv_vel, adv_acc, c.dt,
                                         c.adversary_speed, c.max_accel)
        adv_pos, adv_vel = dyn.clip_to_arena(adv_pos, adv_vel, 1.0)

        captured = alive & jnp.any(_sqdist(pos, adv_pos) < c.capture_radius**2, -1)
        alive_next = alive & ~captured
        d_uav = _sqdist(pos, pos)
        close = (d_uav < c.collision_radius**2) & ~jnp.eye(N, dtype=bool) & alive_next[None, :]
        collided = alive_next & (jnp.any(close, -1) | hit_obstacle)

        cover = self._coverage(pos, alive_next, state.target_pos, state.need, state.served)
        progress = state.progress + cover
        newly_served = ~state.served & (progress >= c.serve_steps)
        served = state.served | newly_served
        u = state.urgency
        team = (c.w_cover * jnp.sum(u * cover) / jnp.sum(u)
                + c.w_complete * jnp.sum(u * newly_served))
        individual = -c.w_capture * captured - c.w_collision * collided
        if c.team_reward:
            individual = jnp.broadcast_to(individual.sum(), (N,))
        reward = (team + individual).astype(jnp.float32)

        t = state.t + 1
        terminated = jnp.all(served) | ~jnp.any(alive_next)
        truncated = (t >= c.max_steps) & ~terminated
        new_state = SwarmState(pos, vel, alive_next, last_action, state.target_pos, u, state.need,
                               progress, served, adv_pos, adv_vel, state.obstacles, t)
        return new_state, self._timestep(new_state, reward, terminated, truncated,
                                         weighted_cover=jnp.sum(u * cover) / jnp.sum(u))

    # ------------------------------------------------------------ observation
    def _coverage(self, pos, alive, target_pos, need, served):
        """``[M]`` coverage ``min(#active UAVs within cover_radius, need) / need`` (0 once served)."""
        near = (_sqdist(target_pos, pos) < self.config.cover_radius**2) & alive[None, :]
        return jnp.where(served, 0.0, jnp.minimum(near.sum(-1), need) / need)

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
            d2 = jnp.sum(rel * rel, -1)
        else:
            d2_all = _sqdist(state.pos, state.pos) + jnp.where(jnp.eye(N, dtype=bool), jnp.inf, 0.0)
            neg, idx = jax.lax.top_k(-d2_all, self.k)
            d2 = -neg
        present = (d2 < c.comm_radius**2) & state.alive[idx] & state.alive[:, None]
        return idx.astype(jnp.int32), present

    def observe(self, state: SwarmState):
        """``(obs [N, obs_dim], neighbor_idx [N, k])`` (index -1 where no neighbour)."""
        c = self.config
        N, d, r2 = c.num_agents, c.dim, c.obs_radius**2
        me = state.alive[:, None].astype(jnp.float32)
        msg = self.messages(state)

        def sensed(rel, extra):  # rel [N, P, d], extra [N, P, e] -> [N, P*(d+e+1)]
            vis = (jnp.sum(rel * rel, -1, keepdims=True) < r2) * me[:, None, :]
            return (jnp.concatenate([rel, extra, jnp.ones_like(vis)], -1) * vis).reshape(N, -1)

        t_frac = jnp.broadcast_to(state.t / c.max_steps, (N, 1)).astype(jnp.float32)
        own = jnp.concatenate([state.pos, state.vel / c.max_speed, me, t_frac,
                               self.slot_dir[:, :2], msg], -1)
        cov = self._coverage(state.pos, state.alive, state.target_pos, state.need, state.served)
        tgt_extra = jnp.stack([state.urgency, state.served.astype(jnp.float32), cov], -1)
        parts = [own, sensed(state.target_pos[None] - state.pos[:, None],
                             jnp.broadcast_to(tgt_extra, (N, *tgt_extra.shape)))]
        if c.num_adversaries:
            parts.append(sensed(state.adv_pos[None] - state.pos[:, None],
                                (state.adv_vel[None] - state.vel[:, None]) / c.max_speed))
        if c.num_obstacles:
            parts.append(sensed(state.obstacles[None] - state.pos[:, None],
                                jnp.zeros((N, c.num_obstacles, 0), jnp.float32)))
        idx, present = self.neighbors(state)
        if self.k:
            nb = jnp.concatenate([state.pos[idx] - state.pos[:, None], (state.vel[idx] - state.vel[:, None]) / c.max_speed,
                                  state.alive[idx][..., None].astype(jnp.float32), msg[idx],
                                  jnp.ones((N, self.k, 1), jnp.float32)], -1)
            parts.append((nb * present[..., None]).reshape(N, -1))
        return jnp.concatenate(parts, -1), jnp.where(present, idx, -1)

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

    def _timestep(self, state, reward, terminated, truncated, weighted_cover=None):
        obs, nbrs = self.observe(state)
        if weighted_cover is None:
            weighted_cover = jnp.float32(0.0)
        info = {
            "global_state": self.global_state(state),
            "neighbors": nbrs,
            "coverage": weighted_cover.astype(jnp.float32),
            "num_captured": jnp.sum(~state.alive).astype(jnp.int32),
            "num_served": jnp.sum(state.served).astype(jnp.int32),
        }
        return TimeStep(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            legal_action_mask=jnp.ones((self.num_agents, self.num_actions), bool),
            current_player=jnp.int32(-1),
            info=info,
        )


# make(): the accepted keyword arguments are SwarmConfig's fields.
Swarm.__init__.__signature__ = inspect.Signature(
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + list(inspect.signature(SwarmConfig).parameters.values())
)
