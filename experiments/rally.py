"""RALLY study on the UAV swarm: scripted prior vs IPPO vs MAPPO vs QMIX vs RMIX-from-prior
vs LLM + consensus, at one environment-step budget with fixed seeds.

Every learner gets ``budget`` environment steps (RMIX's prior-collected prefill counts);
each method is then evaluated on the same ``eval_episodes`` episodes (same key):
mean episode return (mean over agents), mean urgency-weighted coverage, targets served,
UAVs captured. Writes learning curves, a results table and a frame strip of one
episode of the best learned method. Per-method training is not checkpointed (each run
is minutes on CPU); the run directory keeps the metrics and results.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxrl_reason import envs
from jaxrl_reason.agents.rally import evaluate as rally_eval
from jaxrl_reason.agents.rally import rmix
from jaxrl_reason.agents.rally.intent import RulePrior, act
from jaxrl_reason.envs.swarm import render
from jaxrl_reason.rl import ppo
from jaxrl_reason.rl.marl import mappo, qmix
from jaxrl_reason.utils.experiment import RunDir

METHODS = ("prior", "ippo", "mappo", "qmix", "rmix", "llm")
LLM_TRACE_ENVS, LLM_TRACE_STEPS = 16, 50  # prior traces for the LLM's SFT (env steps = product)


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    methods: tuple[str, ...] = ("prior", "ippo", "mappo", "qmix", "rmix", "llm")
    num_agents: int = 4
    num_targets: int = 3
    max_steps: int = 50
    budget: int = 100_000  # environment steps per learner
    ppo: ppo.PPOConfig = ppo.PPOConfig(num_envs=32, num_steps=25, total_timesteps=100_000,
                                       updates_per_chunk=10, lr=1e-3)
    qmix: qmix.QMIXConfig = qmix.QMIXConfig(num_envs=16, total_timesteps=100_000, prefill_steps=4096,
                                            iters_per_chunk=100)
    rmix_offline_updates: int = 500
    rmix_bc_online: float = 1.0
    rmix_margin: float = 0.05
    rmix_roles_only: bool = True  # keep the prior's target, RMIX picks the role (as in RALLY)
    eval_episodes: int = 512
    llm_sft_steps: int = 200

    def __post_init__(self):
        bad = sorted(set(self.methods) - set(METHODS))
        if bad or not self.methods:
            raise ValueError(f"unknown method(s) {bad}; choose from {METHODS}")
        if self.budget < 1 or self.eval_episodes < 1:
            raise ValueError("budget and eval_episodes must be >= 1")
        if self.ppo.total_timesteps != self.budget or self.qmix.total_timesteps != self.budget:
            raise ValueError(f"ppo.total_timesteps ({self.ppo.total_timesteps}) and qmix.total_timesteps "
                             f"({self.qmix.total_timesteps}) must equal budget ({self.budget})")

    def env_kwargs(self) -> dict:
        return dict(num_agents=self.num_agents, num_targets=self.num_targets, max_steps=self.max_steps)


PRESETS = {
    "cpu": Config(),
    "small": Config(budget=20_000, ppo=ppo.PPOConfig(num_envs=16, num_steps=25, total_timesteps=20_000,
                                                     updates_per_chunk=10, lr=1e-3),
                    qmix=qmix.QMIXConfig(num_envs=16, total_timesteps=20_000, prefill_steps=2048,
                                         iters_per_chunk=100),
                    rmix_offline_updates=200, eval_episodes=128, llm_sft_steps=50),
    "gpu": Config(budget=5_000_000, num_agents=8, num_targets=4,
                  ppo=ppo.PPOConfig(num_envs=1024, num_steps=25, total_timesteps=5_000_000,
                                    updates_per_chunk=20, lr=1e-3, hidden=128),
                  qmix=qmix.QMIXConfig(num_envs=256, total_timesteps=5_000_000, prefill_steps=100_000,
                                       buffer_size=1_000_000, batch_size=1024, iters_per_chunk=200,
                                       hidden=128),
                  rmix_offline_updates=5000, eval_episodes=4096, llm_sft_steps=2000),
}


def train_chunks(run_dir, name, init_state, chunk_fn, num_chunks):
    state = init_state
    for _ in tqdm(range(num_chunks), desc=name):
        state, metrics = chunk_fn(state)
        metrics = jax.device_get(metrics)
        for i in range(len(metrics["env_steps"])):
            run_dir.log(int(metrics["env_steps"][i]),
                        {f"{name}/{k}": v[i] for k, v in metrics.items() if k != "env_steps"})
    return state


def run(config: Config, run_dir: RunDir) -> dict:
    env = envs.make("swarm", **config.env_kwargs())
    prior = RulePrior(env)
    prior_fn = lambda carry, key, ts: (carry, act(prior, key, ts))
    key = jax.random.key(config.seed)
    k_train, k_eval, k_show = jax.random.split(key, 3)
    policies = {}  # name -> (policy_fn, init_carry)

    if "prior" in config.methods:
        policies["prior"] = (prior_fn, jnp.zeros(()))
    for name, module in (("ippo", ppo), ("mappo", mappo)):
        if name in config.methods:
            trainer = module.make_chunked(config.ppo, env)
            state = train_chunks(run_dir, name, jax.jit(trainer.init)(k_train), jax.jit(trainer.update_chunk),
                                 config.ppo.num_chunks)
            policies[name] = module.evaluation_policy(env, trainer.graphdef, state.params, greedy=False)
    if "qmix" in config.methods:
        trainer = qmix.make_chunked(config.qmix, env)
        state = train_chunks(run_dir, "qmix", jax.jit(trainer.init)(k_train), jax.jit(trainer.update_chunk),
                             config.qmix.num_chunks)
        policies["qmix"] = qmix.greedy_policy(config.qmix, env, trainer.graphdef, state.params)
    if "rmix" in config.methods:
        cfg = dataclasses.replace(rmix.rmix_config(config.qmix, offline_updates=config.rmix_offline_updates),
                                  bc_online=config.rmix_bc_online, margin=config.rmix_margin)
        trainer = rmix.make_chunked(cfg, env, prior, roles_only=config.rmix_roles_only)
        state = train_chunks(run_dir, "rmix", jax.jit(trainer.init)(k_train), jax.jit(trainer.update_chunk),
                             cfg.num_chunks)
        policies["rmix"] = rmix.greedy_policy(cfg, env, trainer.graphdef, state.params, prior,
                                              roles_only=config.rmix_roles_only)
    if "llm" in config.methods:
        from jaxrl_reason.agents.rally import llm

        lm_policy = llm.train_llm_policy(env, prior, k_train, sft_steps=config.llm_sft_steps, run_dir=run_dir,
                                         trace_envs=LLM_TRACE_ENVS, trace_steps=LLM_TRACE_STEPS)
        policies["llm"] = (lambda carry, key, ts: (carry, act(lm_policy, key, ts)), jnp.zeros(()))

    rows = []
    for name, (fn, carry) in policies.items():
        stats = jax.jit(functools.partial(rally_eval.play, env, fn, num_episodes=config.eval_episodes))(
            carry, k_eval)
        stats = {k: np.asarray(v) for k, v in stats.items()}
        steps = {"prior": 0, "llm": LLM_TRACE_ENVS * LLM_TRACE_STEPS}.get(name, config.budget)
        rows.append({"method": name, "env_steps": steps,
                     "mean_return": float(stats["return"].mean()),
                     "return_sem": float(stats["return"].std() / np.sqrt(config.eval_episodes)),
                     "coverage": float(stats["coverage"].mean()), "served": float(stats["served"].mean()),
                     "captured": float(stats["captured"].mean())})
    print(run_dir.write_table("results", rows))
    curves = [f"{m}/episode_return" for m in ("ippo", "mappo", "qmix", "rmix") if m in policies]
    if curves:
        _plot_curves(run_dir, curves, config.budget)
    _plot_bars(run_dir, rows)
    learned = [r for r in rows if r["method"] != "prior"] or rows
    best = max(learned, key=lambda r: r["mean_return"])["method"]
    fn, carry = policies[best]
    states, actions, alive = jax.jit(functools.partial(rally_eval.record, env, fn))(carry, k_show)
    render.frame_strip(env, jax.device_get(states), np.asarray(actions), run_dir.path / "episode_strip.png",
                       alive=np.asarray(alive), title=f"one episode, {best}")
    summary = {"results": rows, "best": best, "run_dir": str(run_dir.path)}
    run_dir.save_json("summary.json", summary)
    return summary


def _plot_curves(run_dir: RunDir, keys, budget):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = run_dir.read_metrics()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for key in keys:
        pts = sorted((r["step"], r[key]) for r in rows if key in r)
        if pts:
            x, y = map(np.asarray, zip(*pts))
            k = max(1, len(y) // 20)
            ax.plot(x[k - 1:], np.convolve(y, np.ones(k) / k, "valid"), label=key.split("/")[0])
    ax.set(xlabel="environment steps", ylabel="training episode return", xlim=(0, budget))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run_dir.path / "learning_curves.png", dpi=120)
    plt.close(fig)


def _plot_bars(run_dir: RunDir, rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    names = [r["method"] for r in rows]
    for ax, key in zip(axes, ("mean_return", "coverage", "captured")):
        ax.bar(names, [r[key] for r in rows],
               yerr=[r["return_sem"] for r in rows] if key == "mean_return" else None)
        ax.set_title(key)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(run_dir.path / "results.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
