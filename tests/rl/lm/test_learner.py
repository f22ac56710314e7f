"""The one learner: its registries reach every agent: an advantage estimator and a policy objective registered here, outside the
package, run one learner step of each LM agent (GRPO, tool use, SPIRAL, MemAgent, JoyAgents both modes, RALLY's
intent model, a user's agent from its file). The functions count their traces: each agent's step used both."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.lm import ESTIMATORS, OBJECTIVES, LossConfig, register_estimator, register_objective

EST, OBJ = "_test_learner_max_baseline", "_test_learner_plain_pg"
TRACED = {"estimator": 0, "objective": 0}


def max_baseline(rewards, group_ids, num_groups, valid=None, carry=None):
    """r - the best valid reward of the group."""
    TRACED["estimator"] += 1
    r = rewards if valid is None else jnp.where(valid, rewards, -jnp.inf)
    best = jax.ops.segment_max(r, group_ids, num_segments=num_groups)[group_ids]
    return jnp.where(jnp.isfinite(r), rewards - best, 0.0), carry


def plain_pg(logp, old_logp, adv, mask, config):
    """log pi * A, no ratio and no clipping."""
    TRACED["objective"] += 1
    return logp * adv[:, None], jnp.zeros(mask.shape, bool), jnp.exp(logp - old_logp)


@pytest.fixture(scope="module", autouse=True)
def registered():
    """Registered for this module's tests only (configs check the names when they are made)."""
    register_estimator(EST)(max_baseline)
    register_objective(OBJ)(plain_pg)
    yield
    del ESTIMATORS[EST], OBJECTIVES[OBJ]


def loss_kw() -> dict:
    return dict(loss=LossConfig(objective=OBJ, aggregation="token_mean"), advantage=EST)


def _lm(tok, seq=64):
    return Transformer(LMConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                                max_seq_len=seq), rngs=nnx.Rngs(0))


def grpo():
    from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
    from jaxrl_reason.tasks import RandomCalculation
    from jaxrl_reason.tasks.rewards import RewardConfig

    tok = CharTokenizer()
    cfg = GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, reward=RewardConfig("random"), **loss_kw())
    learner, agent = grpo_for_tasks(cfg, _lm(tok, 32), tok, [RandomCalculation(max_difficulty=1, ops="+-")], 12)
    return learner, agent, None


def tool_use():
    from jaxrl_reason.agents.tool_use import tool_use_learner, tool_use_model
    from jaxrl_reason.experiments.tool_use import Config

    cfg = dataclasses.replace(Config(), prompts_per_step=2, group_size=2, eval_problems=4, **loss_kw())
    return (*tool_use_learner(cfg, tool_use_model(cfg)), None)


def spiral():
    from jaxrl_reason.agents.spiral.agent import SpiralConfig, spiral_learner
    from jaxrl_reason.agents.spiral.tokenizer import spiral_tokenizer

    tok = spiral_tokenizer()
    cfg = SpiralConfig(games=("kuhn_poker",), episodes_per_game=2, max_new_tokens=4, **loss_kw())
    return (*spiral_learner(cfg, _lm(tok, 512), tokenizer=tok), None)


def rally():
    from jaxrl_reason import envs
    from jaxrl_reason.agents.rally import llm, llm_grpo
    from jaxrl_reason.models.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    env = envs.make("swarm", num_agents=2, num_targets=2, max_steps=4)
    model = Transformer(dataclasses.replace(llm.default_lm_config(tok), d_model=16, n_layers=1, n_heads=2,
                                            n_kv_heads=1, d_ff=16), rngs=nnx.Rngs(0))
    policy = llm.LLMIntentPolicy(env, nnx.graphdef(model), nnx.state(model), tokenizer=tok)
    cfg = llm_grpo.IntentGRPOConfig(iterations=1, num_groups=2, group_size=2, updates=1, minibatch=8, **loss_kw())
    return (*llm_grpo.intent_learner(policy, cfg), None)


def memagent():
    from jaxrl_reason.agents.memagent.agent import MemAgent, MemAgentConfig
    from jaxrl_reason.agents.memagent.data import doc_batch
    from jaxrl_reason.agents.memagent.trainer import MultiConvConfig, multiconv_learner
    from jaxrl_reason.tasks.longcontext import LongContextTask

    tok = CharTokenizer()
    task = LongContextTask(num_facts=4, facts_per_chunk=1)
    agent = MemAgent(MemAgentConfig(chunk_tokens=task.chunk_chars, memory_tokens=4, question_tokens=6,
                                    answer_tokens=4), tok)
    batch = doc_batch(task.generate_batch(np.random.default_rng(0), 2), agent)
    return (*multiconv_learner(MultiConvConfig(group_size=2, **loss_kw()), agent, _lm(tok, 32)), lambda s: batch)


def joyagents(mode: str):
    from jaxrl_reason.agents.joyagents.system import SystemConfig, requests_from_arrays
    from jaxrl_reason.agents.joyagents.trainer import JoyConfig, build_models, joy_learner
    from jaxrl_reason.rl.grpo.recipes import TinyLM
    from jaxrl_reason.tasks.assistant import AssistantTask, request_arrays

    tok = CharTokenizer()
    task = AssistantTask(weights=(1.0, 1.0, 1.0, 0.0))
    system = SystemConfig(request_tokens=task.request_chars, step_tokens=task.call_chars,
                          answer_tokens=task.answer_chars)
    models = build_models(TinyLM(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=system.seq_len), system, 0,
                          tokenizer=tok)
    req = requests_from_arrays(request_arrays(task.generate_batch(np.random.default_rng(2), 2), system.request_tokens,
                                              system.answer_tokens, tok))
    cfg = JoyConfig(mode=mode, group_size=2, top_k=2, **loss_kw())
    return (*joy_learner(cfg, system, models, tokenizer=tok), lambda s: req)


def copy_letter():
    from jaxrl_reason.rl.lm import Learner, LearnerConfig
    from jaxrl_reason.rl.lm.agents import load_agent_factory

    tok = CharTokenizer()
    learner = Learner(LearnerConfig(**loss_kw()), _lm(tok, 16))
    return learner, load_agent_factory("examples/copy_letter.py:make_agent")(learner.graphdef, tok), None


AGENTS = {"grpo": grpo, "tool_use": tool_use, "spiral": spiral, "memagent": memagent,
          "joyagents_joint": lambda: joyagents("joint"), "joyagents_nodewise": lambda: joyagents("nodewise"),
          "rally": rally, "copy_letter": copy_letter}


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_a_registered_estimator_and_objective_run_one_step_of_every_agent(name):
    before = dict(TRACED)
    learner, agent, data = AGENTS[name]()
    assert learner.config.advantage == EST and learner.config.loss.objective == OBJ
    try:
        state = learner.init(jax.random.key(0), agent)
        state, m = learner.step_fn(agent, data)(state)
    finally:
        if hasattr(agent, "close"):
            agent.close()
    assert int(state.step) == 1 and np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
    assert TRACED["estimator"] > before["estimator"] and TRACED["objective"] > before["objective"], TRACED


def test_save_restore_export_and_plan(tmp_path):
    """A step, then ``save`` / ``restore`` give the state back leaf for leaf; ``export`` writes a HF directory that
    ``load_model`` reads back to the same logits; ``plan`` of a pure agent compiles its one step program."""
    from jaxrl_reason.models.lm import load_model
    from jaxrl_reason.rl.lm import Learner, LearnerConfig
    from jaxrl_reason.rl.lm.agents import load_agent_factory

    tok = CharTokenizer()
    learner = Learner(LearnerConfig(lr=1e-2), _lm(tok, 16))
    agent = load_agent_factory("examples/copy_letter.py:make_agent")(learner.graphdef, tok)
    state, _ = learner.step(learner.init(jax.random.key(0), agent), agent)
    learner.save(state, tmp_path / "ckpt")
    back = learner.restore(tmp_path / "ckpt", agent)
    key_data = lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(key_data(a)), np.asarray(key_data(b)))
    assert int(back.step) == 1
    out = learner.export(state, tmp_path / "hf")
    ids = jnp.asarray([tok.encode("ab=")])
    np.testing.assert_allclose(np.asarray(load_model(out["hf"])(ids)[0]), np.asarray(learner.model(state)(ids)[0]),
                               rtol=1e-5, atol=1e-5)
    assert out["adapter"] is None  # (LoRA runs only)
    plan = learner.plan(agent)
    assert set(plan.programs) == {"update"} and plan.params > 0 and "peak" in plan.summary()
