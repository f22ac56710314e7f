"""The paper's RL task (Keramati & Jazayeri 2025): choose the block size of a block-Jacobi
preconditioner inside FGMRES from the residual state.

One episode = one linear system drawn from a fixed pool of generated finance systems
(``family`` in black_scholes / markowitz / heston / mixed; ``split="test"`` uses disjoint
seeds). One step = one FGMRES(``restart``) cycle whose preconditioner is block-Jacobi with
block size ``block_sizes[action]`` (FGMRES, so changing it between cycles is legal).

Reward (residual reduction per unit of work, in Lagrangian form, so that slow policies
are not paid for lasting longer): ``reward = dlog10 - price * its * (1 + work_weight * k / k_max)``
where ``dlog10`` is the residual reduction in decades this cycle (counted down to the
tolerance), ``its`` the inner iterations used and ``k`` the chosen block size. The episode
terminates when ``||r|| <= rtol ||b||`` and is truncated after ``max_cycles`` cycles.

Observation ``[1, 5 + K]`` float32: log10 relative residual / 8, last-cycle reduction
(decades), last-cycle iterations / restart, cycles / max_cycles, a diagonal-dominance
feature of the system, one-hot previous action. Arithmetic is float32 (hence the default
``rtol = 1e-5``: float32 round-off stalls the true residual near 1e-5 on some systems). Every action is always legal (``illegal_action_rule = "none"``; action ids
are clipped).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_reason.envs.core import Environment, TimeStep
from jaxrl_reason.solvers import finance
from jaxrl_reason.solvers.krylov import fgmres_cycle

FAMILIES = ("black_scholes", "markowitz", "heston", "mixed")
NUM_STATE_FEATURES = 5  # observation features before the one-hot previous action


def system_family(family: str, seed: int) -> str:
    """The family of pool system ``seed``: ``mixed`` cycles through the other three by seed."""
    return FAMILIES[seed % 3] if family == "mixed" else family


def make_system(family: str, n: int, seed: int) -> finance.LinearSystem:
    """One system of size ``n`` with seed-drawn difficulty knobs."""
    rng = np.random.default_rng(10_000 + seed)
    if family == "black_scholes":
        return finance.black_scholes(seed, n=n, dt=float(rng.uniform(0.05, 1.0)), theta=float(rng.choice([0.5, 1.0])))
    if family == "markowitz":
        return finance.markowitz_kkt(seed, n_assets=n - 2, n_factors=int(rng.integers(2, 8)),
                                     idio_scale=float(rng.uniform(0.2, 0.6)))
    if family == "heston":
        nv = 8
        if n % nv:
            raise ValueError(f"heston family needs n divisible by {nv}, got n={n}")
        return finance.heston(seed, ns=n // nv, nv=nv, dt=float(rng.uniform(0.1, 1.0)))
    if family == "mixed":
        return make_system(system_family(family, seed), n, seed)
    raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")


def make_pool(family: str, n: int, seeds) -> tuple[np.ndarray, np.ndarray]:
    """Dense float32 pool ``A [P, n, n]`` and normalised right-hand sides ``b [P, n]``."""
    systems = [make_system(family, n, int(s)) for s in seeds]
    A = np.stack([np.asarray(s.A.toarray() if hasattr(s.A, "toarray") else s.A) for s in systems])
    b = np.stack([s.b / np.linalg.norm(s.b) for s in systems])
    return A.astype(np.float32), b.astype(np.float32)


def _inv_diag_blocks(A: np.ndarray, k: int) -> np.ndarray:
    """numpy twin of ``preconditioners.block_jacobi`` for a pool ``[P, n, n]`` -> ``[P, nb, k, k]``
    (set-up off the hot path: one LAPACK call instead of one compilation per block size). Inverts in
    float64; a block is singular when ``|det| <= 1e-12 max|block|^k`` (the JAX version: when its
    inverse is not finite) and is then shifted like ``safe_block_inverse`` (``sqrt(eps) max|block|``,
    ``sqrt(eps)`` for an all-zero block)."""
    P, n, _ = A.shape
    nb = -(-n // k)
    Ap = np.zeros((P, nb * k, nb * k), A.dtype)
    Ap[:, :n, :n] = A
    Ap[:, np.arange(n, nb * k), np.arange(n, nb * k)] = 1
    blocks = Ap.reshape(P, nb, k, nb, k)[:, np.arange(nb), :, np.arange(nb), :].transpose(1, 0, 2, 3)
    scale = np.abs(blocks).max(axis=(2, 3), keepdims=True).astype(np.float64)
    scale = np.where(scale > 0, scale, 1.0)  # an all-zero block is shifted by sqrt(eps), as in safe_block_inverse
    # singular: |det| <= 1e-12 scale^k, in logs (scale^k overflows float32 for k = 16 and entries above ~250)
    sign, logdet = np.linalg.slogdet(blocks.astype(np.float64))
    singular = ((sign == 0) | (logdet <= np.log(1e-12) + k * np.log(scale[..., 0, 0])))[..., None, None]
    blocks = blocks + singular * np.sqrt(np.finfo(np.float32).eps) * scale * np.eye(k)
    return np.linalg.inv(blocks.astype(np.float64)).astype(A.dtype)


@struct.dataclass
class BlockSizeState:
    idx: jax.Array  # int32 pool index
    x: jax.Array  # [n]
    rnorm: jax.Array
    cycles: jax.Array
    iterations: jax.Array
    work: jax.Array
    last_red: jax.Array
    last_its: jax.Array
    last_action: jax.Array


class BlockSizeEnv(Environment):
    turn_based = True
    illegal_action_rule = "none"
    conformance_variants = ({"n": 24, "pool_size": 3, "block_sizes": (1, 4), "restart": 8, "max_cycles": 4},)

    def __init__(self, family: str = "mixed", n: int = 64, block_sizes: tuple = (1, 2, 4, 8, 16),
                 restart: int = 16, max_cycles: int = 16, rtol: float = 1e-5, price: float = 0.05,
                 work_weight: float = 1.0, pool_size: int = 32, split: str = "train", seed: int = 0):
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")
        if any(isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) for k in block_sizes):
            raise TypeError(f"block_sizes must be integers, got {tuple(block_sizes)}")
        block_sizes = tuple(int(k) for k in block_sizes)
        if not block_sizes or any(not 1 <= k <= n for k in block_sizes):
            raise ValueError(f"block_sizes must be non-empty, each in [1, n={n}], got {block_sizes}")
        if not 1 <= restart <= n:
            raise ValueError(f"restart must be in [1, n={n}], got {restart}")
        if max_cycles < 1 or pool_size < 1 or rtol <= 0 or price < 0 or work_weight < 0:
            raise ValueError("need max_cycles >= 1, pool_size >= 1, rtol > 0, price >= 0, work_weight >= 0")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.family, self.n, self.block_sizes, self.restart = family, n, block_sizes, restart
        self.max_cycles, self.rtol, self.price, self.work_weight = max_cycles, rtol, price, work_weight
        offset = seed * 100_000 + (0 if split == "train" else 50_000)
        A, b = make_pool(family, n, range(offset, offset + pool_size))
        #: family name of each pool system
        self.families = tuple(system_family(family, offset + i) for i in range(pool_size))
        self.A, self.b = jnp.asarray(A), jnp.asarray(b)
        self.inv_blocks = tuple(jnp.asarray(_inv_diag_blocks(A, k)) for k in block_sizes)
        absA = np.abs(A)
        diag = np.abs(np.diagonal(A, axis1=1, axis2=2))
        self.dominance = jnp.asarray((diag / np.maximum(absA.sum(-1), 1e-30)).mean(-1), jnp.float32)
        self.pool_size = pool_size
        self.num_agents = 1
        self.num_actions = len(block_sizes)
        self.obs_shape = (NUM_STATE_FEATURES + self.num_actions,)
        self.max_episode_steps = max_cycles

    def _obs(self, s: BlockSizeState) -> jax.Array:
        feats = jnp.stack([
            jnp.log10(jnp.maximum(s.rnorm, 1e-30)) / 8.0,
            jnp.clip(s.last_red, -2.0, 8.0),
            s.last_its.astype(jnp.float32) / self.restart,
            s.cycles.astype(jnp.float32) / self.max_cycles,
            self.dominance[s.idx],
        ])
        onehot = jax.nn.one_hot(s.last_action, self.num_actions) * (s.cycles > 0)
        return jnp.concatenate([feats, onehot]).astype(jnp.float32)[None]

    def _timestep(self, s, reward, terminated, truncated) -> TimeStep:
        return TimeStep(
            obs=self._obs(s), reward=jnp.full((1,), reward, jnp.float32),
            terminated=jnp.asarray(terminated, bool), truncated=jnp.asarray(truncated, bool),
            legal_action_mask=jnp.ones((1, self.num_actions), bool), current_player=jnp.int32(0),
            info={"iterations": s.iterations, "work": s.work, "relres": s.rnorm},
        )

    def reset_to(self, idx) -> tuple[BlockSizeState, TimeStep]:
        """Start an episode on pool system ``idx`` (for evaluation)."""
        idx = jnp.asarray(idx, jnp.int32)
        s = BlockSizeState(idx=idx, x=jnp.zeros(self.n, jnp.float32), rnorm=jnp.float32(1.0),
                           cycles=jnp.int32(0), iterations=jnp.int32(0), work=jnp.float32(0.0),
                           last_red=jnp.float32(0.0), last_its=jnp.int32(0), last_action=jnp.int32(0))
        return s, self._timestep(s, 0.0, False, False)

    def reset(self, key):
        return self.reset_to(jax.random.randint(key, (), 0, self.pool_size))

    def step(self, key, state: BlockSizeState, action):
        a = jnp.clip(jnp.asarray(action, jnp.int32), 0, self.num_actions - 1)
        A, b = self.A[state.idx], self.b[state.idx]
        n = self.n

        def branch(inv):
            nb, k, _ = inv.shape[1:]
            return lambda v: jnp.einsum("bij,bj->bi", inv[state.idx],
                                        jnp.pad(v, (0, nb * k - n)).reshape(nb, k)).reshape(-1)[:n]

        branches = [branch(inv) for inv in self.inv_blocks]
        precond = lambda v: jax.lax.switch(a, branches, v)
        tol = jnp.float32(self.rtol)  # b is normalised: ||b|| = 1
        x, its, rn = fgmres_cycle(lambda v: A @ v, b, state.x, precond, self.restart, tol)
        rn = jnp.where(jnp.isfinite(rn), rn, state.rnorm)
        red = jnp.log10(jnp.maximum(state.rnorm, tol)) - jnp.log10(jnp.maximum(rn, tol))
        k = jnp.asarray(self.block_sizes, jnp.float32)[a]
        work = its.astype(jnp.float32) * (1.0 + self.work_weight * k / max(self.block_sizes))
        reward = red - self.price * work
        s = BlockSizeState(idx=state.idx, x=x, rnorm=rn, cycles=state.cycles + 1,
                           iterations=state.iterations + its, work=state.work + work, last_red=red,
                           last_its=its, last_action=a)
        terminated = rn <= tol
        truncated = (s.cycles >= self.max_cycles) & ~terminated
        return s, self._timestep(s, reward, terminated, truncated)


def previous_action(ts: TimeStep) -> jax.Array:
    """The action of the last cycle read from an observation (int32, -1 before the first cycle)."""
    onehot = ts.obs[0, NUM_STATE_FEATURES:]
    return jnp.where(onehot.sum() > 0, jnp.argmax(onehot), -1).astype(jnp.int32)


def alternate(a: int, b: int):
    """A scripted ``choose`` for ``evaluate``: action ``a`` on the first cycle, then ``a`` and ``b`` in turn."""
    return lambda ts: jnp.where(previous_action(ts) == a, b, a).astype(jnp.int32)


def evaluate(env: BlockSizeEnv, choose, idxs) -> dict:
    """Run ``choose(ts) -> action`` on pool systems ``idxs`` until done; returns arrays over systems:
    iterations, work, converged, relres, return. ``choose`` is traced (jit/vmap-friendly)."""

    def one(idx):
        s, ts = env.reset_to(idx)

        def body(c, _):
            s, ts, done, ret = c
            s2, ts2 = env.step(jax.random.key(0), s, choose(ts))
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(done, b, a), new, old)
            ret = ret + jnp.where(done, 0.0, ts2.reward[0])
            return (keep(s2, s), keep(ts2, ts), done | ts2.done, ret), None

        (s, ts, _, ret), _ = jax.lax.scan(body, (s, ts, jnp.bool_(False), jnp.float32(0)), None,
                                          length=env.max_cycles)
        return dict(iterations=s.iterations, work=s.work, converged=s.rnorm <= env.rtol, relres=s.rnorm, ret=ret)

    return jax.jit(jax.vmap(one))(jnp.asarray(idxs, jnp.int32))


def policy_rows(results: dict, families, fixed_names) -> list[dict]:
    """Table rows: mean iterations / work / converged over held-out systems, iterations per family, and the
    paired per-system difference of iterations to the best single fixed size (mean, standard error)."""
    families = np.asarray(families)
    mean_its = {name: float(np.asarray(results[name]["iterations"]).mean()) for name in fixed_names}
    best_fixed = np.asarray(results[min(fixed_names, key=lambda n: (not np.all(results[n]["converged"]), mean_its[n]))]
                            ["iterations"], np.float64)
    rows = []
    for name, r in results.items():
        its = np.asarray(r["iterations"], np.float64)
        d = its - best_fixed
        rows.append(dict(policy=name, iterations=float(its.mean()), work=float(np.asarray(r["work"]).mean()),
                         converged=float(np.asarray(r["converged"]).mean()),
                         **{f"its_{f}": float(its[families == f].mean()) for f in dict.fromkeys(families)},
                         vs_best_fixed=float(d.mean()), vs_best_fixed_se=float(d.std(ddof=1) / np.sqrt(d.size))))
    return rows
