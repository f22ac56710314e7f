"""RALLY study on the UAV swarm: scripted prior vs IPPO vs MAPPO vs QMIX vs RMIX-from-prior
vs LLM + consensus (SFT on prior traces, then GRPO on episode return), at one
environment-step budget with fixed seeds.

Every learner takes exactly ``budget`` environment steps (checked; RMIX's prior-collected
prefill counts); the LLM rows report their own (smaller) count: SFT trace steps, plus GRPO
episode steps. Each method is then evaluated on the same ``eval_episodes`` episodes (same
key): mean episode return (mean over agents), mean urgency-weighted coverage, targets served,
UAVs captured, and the paired difference of each method's return to the prior's on the same
episodes (``vs_<baseline>`` for each of ``baselines``, mean and standard error). ``rmix`` learns
from the scripted prior's transitions, ``rmix_llm`` from the SFT'd LLM intent policy's (RALLY's own
setting; that prior is weak, so RMIX may change targets and is not pulled towards it online).
``prior_lookahead`` is a privileged reference,
not a learner: the prior improved by one step of exact lookahead over single-UAV role changes
(``agents.rally.lookahead``; it reads the state and simulates), i.e. what the policy improvement
RMIX's role values aim at could gain over the prior. Writes per-method learning curves, a
results table (``results.md``), bar plots and a frame strip of one episode of the best
learned method.

Long runs: each learner trains in ``<run_dir>/<method>/`` through ``utils.loop.run_chunks``
(orbax checkpoint after every chunk); ``--resume`` restores each method's latest checkpoint
and continues (finished methods are just re-evaluated). The LLM stages are not checkpointed
(seconds to a few minutes on CPU).

The LLM intent policy's LM is a small one from scratch (byte tokenizer), or ``--model`` a checkpoint (a directory
or a packaged name) with its own tokenizer, e.g.
``jaxrl-reason run rally --methods prior llm_sft llm_grpo --baselines prior --model smollm2-135m-instruct
--llm-lr 1e-5 --llm-batch 8`` (the real SmolLM2-135M-Instruct, issue 40).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_reason import envs
from jaxrl_reason.agents.rally import llm_grpo, rmix, study
from jaxrl_reason.agents.rally.intent import RulePrior, act
from jaxrl_reason.agents.rally.lookahead import lookahead_policy
from jaxrl_reason.rl import ppo
from jaxrl_reason.rl.marl import mappo, qmix
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

METHODS = ("prior", "prior_lookahead", "ippo", "mappo", "qmix", "rmix", "llm_sft", "llm_grpo", "rmix_llm")
LEARNERS = ("ippo", "mappo", "qmix", "rmix", "rmix_llm")
# reads the environment state and simulates (agents.rally.lookahead): a reference for what one step of policy
# improvement over the prior's roles can gain, not a method a swarm could run
PRIVILEGED = ("prior_lookahead",)


@dataclasses.dataclass(frozen=True)
class RMIXSettings:
    """The semi-offline recipe on top of ``Config.qmix`` (``rmix.rmix_config`` + these fields)."""

    offline_updates: int = 500
    bc_online: float = 1.0  # large-margin loss towards the prior's actions during the online phase
    margin: float = 0.05
    roles_only: bool = True  # keep the prior's target, RMIX picks the role (as in RALLY)
    td_target: str = "max"  # or "prior": evaluate the prior (SARSA), greedy acting = policy improvement
    prior_bonus: float = 0.1  # keep the prior's choice unless an action is better by this much

    def __post_init__(self):
        check_hyperparameters(self)

    def qmix_config(self, base: qmix.QMIXConfig) -> rmix.RMIXConfig:
        return dataclasses.replace(rmix.rmix_config(base, offline_updates=self.offline_updates),
                                   bc_online=self.bc_online, margin=self.margin, td_target=self.td_target,
                                   prior_bonus=self.prior_bonus)


#: RMIX from the LLM prior (RALLY's setting): the SFT'd LLM is a weak prior, so free targets, no pull towards it
FROM_WEAK_PRIOR = RMIXSettings(bc_online=0.0, roles_only=False, prior_bonus=0.0)


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    methods: tuple[str, ...] = METHODS
    num_agents: int = 4
    num_targets: int = 3
    max_steps: int = 50
    budget: int = 100_000  # environment steps per learner
    ppo: ppo.PPOConfig = ppo.PPOConfig(num_envs=32, num_steps=25, total_timesteps=100_000,
                                       updates_per_chunk=5, lr=1e-3)
    qmix: qmix.QMIXConfig = qmix.QMIXConfig(num_envs=16, total_timesteps=100_000, prefill_steps=4096,
                                            iters_per_chunk=100)
    rmix: RMIXSettings = RMIXSettings()  # RMIX from the scripted prior (near-optimal: stay close to it)
    rmix_llm: RMIXSettings = FROM_WEAK_PRIOR
    baselines: tuple[str, ...] = ("prior", "llm_sft", "qmix")  # paired return differences to these methods
    eval_episodes: int = 512
    # the LLM intent policy's LM: None, a small LM from scratch with the byte tokenizer; else a checkpoint (a
    # directory or a packaged name, e.g. smollm2-135m-instruct: models.lm.load_model) with its own tokenizer
    model: str | None = None
    llm_sft_steps: int = 200
    llm_batch: int = 64
    llm_lr: float = 3e-3  # the SFT's learning rate (a pretrained --model wants a lower one, e.g. 1e-5)
    llm_trace_envs: int = 16
    llm_trace_steps: int = 50
    llm_grpo: llm_grpo.IntentGRPOConfig = llm_grpo.IntentGRPOConfig()

    def __post_init__(self):
        check_hyperparameters(self)
        bad = sorted(set(self.methods) - set(METHODS)) + sorted(set(self.baselines) - set(METHODS))
        if bad or not self.methods:
            raise ValueError(f"unknown method(s) {bad}; choose from {METHODS}")
        if self.budget < 1 or self.eval_episodes < 1:
            raise ValueError("budget and eval_episodes must be >= 1")
        if self.ppo.total_timesteps != self.budget or self.qmix.total_timesteps != self.budget:
            raise ValueError(f"ppo.total_timesteps ({self.ppo.total_timesteps}) and qmix.total_timesteps "
                             f"({self.qmix.total_timesteps}) must equal budget ({self.budget})")
        ppo_steps = self.ppo.num_updates * self.ppo.num_envs * self.ppo.num_steps
        if ppo_steps != self.budget:  # PPO rounds up to whole chunks: the budget must fit them exactly
            raise ValueError(f"PPO would take {ppo_steps} env steps, not budget={self.budget}: make budget a "
                             "multiple of ppo.num_envs * ppo.num_steps * ppo.updates_per_chunk")
        for needs_llm in ("llm_grpo", "rmix_llm"):
            if needs_llm in self.methods and "llm_sft" not in self.methods:
                raise ValueError(f"method {needs_llm!r} starts from the 'llm_sft' policy: list both")

    def env_kwargs(self) -> dict:
        return dict(num_agents=self.num_agents, num_targets=self.num_targets, max_steps=self.max_steps)


PRESETS = {
    "cpu": Config(),
    "small": Config(budget=20_000, ppo=ppo.PPOConfig(num_envs=16, num_steps=25, total_timesteps=20_000,
                                                     updates_per_chunk=10, lr=1e-3),
                    qmix=qmix.QMIXConfig(num_envs=16, total_timesteps=20_000, prefill_steps=2048,
                                         iters_per_chunk=100),
                    rmix=RMIXSettings(offline_updates=200),
                    rmix_llm=dataclasses.replace(FROM_WEAK_PRIOR, offline_updates=200),
                    eval_episodes=128, llm_sft_steps=50,
                    llm_grpo=llm_grpo.IntentGRPOConfig(iterations=3, updates=4)),
    "gpu": Config(budget=5_120_000, num_agents=8, num_targets=4,
                  ppo=ppo.PPOConfig(num_envs=1024, num_steps=25, total_timesteps=5_120_000,
                                    updates_per_chunk=20, lr=1e-3, hidden=128),
                  qmix=qmix.QMIXConfig(num_envs=256, total_timesteps=5_120_000, prefill_steps=100_000,
                                       buffer_size=1_000_000, batch_size=1024, iters_per_chunk=200,
                                       hidden=128),
                  rmix=RMIXSettings(offline_updates=5000),
                  rmix_llm=dataclasses.replace(FROM_WEAK_PRIOR, offline_updates=5000),
                  eval_episodes=4096, llm_sft_steps=2000,
                  llm_trace_envs=256, llm_grpo=llm_grpo.IntentGRPOConfig(iterations=100, num_groups=32, group_size=8,
                                                                   updates=16, minibatch=1024)),
}


def run(config: Config, run_dir: RunDir) -> dict:
    env = envs.make("swarm", **config.env_kwargs())
    prior = RulePrior(env)
    prior_fn = lambda carry, key, ts: (carry, act(prior, key, ts))
    key = jax.random.key(config.seed)
    k_train, k_eval, k_show = jax.random.split(key, 3)
    policies, env_steps = {}, {}  # name -> (policy_fn, init_carry), env steps used

    if "prior" in config.methods:
        policies["prior"], env_steps["prior"] = (prior_fn, jnp.zeros(())), 0
    if "prior_lookahead" in config.methods:
        policies["prior_lookahead"], env_steps["prior_lookahead"] = (lookahead_policy(env, prior), jnp.zeros(())), 0
    for name, module in (("ippo", ppo), ("mappo", mappo)):
        if name in config.methods:
            trainer = module.make_chunked(config.ppo, env)
            state = study.train(run_dir, name, trainer, k_train, config.ppo.num_chunks,
                                config.ppo.updates_per_chunk)
            policies[name] = module.evaluation_policy(env, trainer.graphdef, state.params, greedy=False)
            env_steps[name] = int(state.update) * config.ppo.num_envs * config.ppo.num_steps
    if "qmix" in config.methods:
        trainer = qmix.make_chunked(config.qmix, env)
        state = study.train(run_dir, "qmix", trainer, k_train, config.qmix.num_chunks, config.qmix.iters_per_chunk)
        policies["qmix"] = qmix.greedy_policy(trainer.graphdef, state.params)
        env_steps["qmix"] = int(state.env_steps)
    if "rmix" in config.methods:
        policies["rmix"], env_steps["rmix"] = study.train_rmix(config, config.rmix, run_dir, "rmix", env, prior,
                                                               k_train)
    if "llm_sft" in config.methods:
        from jaxrl_reason.agents.rally import llm

        sub = run_dir.child("llm")
        sub.truncate_metrics(-1)  # not checkpointed: a resumed run redoes the LLM stages
        k_sft, k_rl = jax.random.split(k_train)
        lm_policy = llm.train_llm_policy(env, prior, k_sft, sft_steps=config.llm_sft_steps, batch=config.llm_batch,
                                         lr=config.llm_lr, run_dir=sub, trace_envs=config.llm_trace_envs,
                                         trace_steps=config.llm_trace_steps, **study.intent_lm(config))
        sft_steps = config.llm_trace_envs * config.llm_trace_steps
        policies["llm_sft"], env_steps["llm_sft"] = study.intent_fn(lm_policy), sft_steps
        if "llm_grpo" in config.methods:
            tuned, stats = llm_grpo.grpo_finetune(lm_policy, k_rl, config.llm_grpo, run_dir=sub,
                                                  log_offset=config.llm_sft_steps)
            policies["llm_grpo"], env_steps["llm_grpo"] = study.intent_fn(tuned), sft_steps + stats["env_steps"]
        sub.close()
        if "rmix_llm" in config.methods:  # RALLY's own setting: RMIX from the LLM prior's transitions
            policies["rmix_llm"], env_steps["rmix_llm"] = study.train_rmix(config, config.rmix_llm, run_dir,
                                                                           "rmix_llm", env, lm_policy, k_train)
    for name in LEARNERS:
        if name in env_steps and env_steps[name] != config.budget:
            raise RuntimeError(f"{name} took {env_steps[name]} env steps, not the budget {config.budget}")

    rows = study.compare(config, env, policies, env_steps, k_eval, privileged=PRIVILEGED)
    print(run_dir.write_table("results", rows))
    learners = [m for m in LEARNERS if m in policies]
    if learners:
        study.plot_curves(run_dir, learners, config.budget)
    study.plot_bars(run_dir, rows)
    best = study.show_best(run_dir, env, rows, policies, k_show, exclude=("prior", *PRIVILEGED))
    summary = {"results": rows, "best": best, "run_dir": str(run_dir.path)}
    run_dir.save_json("summary.json", summary)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
