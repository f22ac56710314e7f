"""Every LM capability on the real SmolLM2-135M-Instruct (``conftest.real_model``: one load per session): the
smallest piece of each experiment's ``--model`` code path (its own config, shrunk to a handful of samples and
new tokens), checking shapes, finiteness, the sampler / learner log-prob agreement, and that text comes out."""

import dataclasses
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.cli import load_experiment
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.agent import grpo_for_tasks

pytestmark = pytest.mark.slow  # the real 135M model: ~30-120 s a test on the 2-core machine

NAME = "smollm2-135m-instruct"
TINY_GRPO = dict(prompts_per_step=1, group_size=4, max_new_tokens=4, minibatches=1, remat="block")


def max_change(before: nnx.State, after: nnx.State) -> float:
    """The largest |after - before| over every leaf of two states of the same shapes."""
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
               zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def grpo_family(name: str):
    """(config with --model, its GRPOConfig shrunk, its tasks) of a GRPO-family experiment's cpu preset."""
    module = load_experiment(name)
    # the R1 system prompt in the chat template is ~104 tokens: the presets' raw-prompt length (24) is too short
    config = dataclasses.replace(module.PRESETS["cpu"], model=NAME, prompt_len=128)
    grpo = dataclasses.replace(config.grpo, **TINY_GRPO)
    if name == "lora":  # the LoRA arm
        grpo = dataclasses.replace(grpo, lora=config.lora, lr=config.lora_lr)
    if name == "spurious_rewards":  # the output-independent reward: a group whose rewards differ
        grpo = dataclasses.replace(grpo, reward=dataclasses.replace(grpo.reward, variant="random"))
    return config, grpo, [config.task] if hasattr(config, "task") else list(module.MIX)


@pytest.mark.parametrize("name", ["r1_zero", "prorl", "spurious_rewards", "lora"])
def test_grpo_family_step(real_model, name):
    config, grpo, tasks = grpo_family(name)
    source = recipes.PolicySource(config.model, config.arch, max_seq_len=config.prompt_len + grpo.max_new_tokens)
    model, tok, fmt = recipes.load_policy(source, config.lm, config.warm_start, tasks, config.seed)
    assert tok is real_model.tokenizer and fmt.kind == "chat"  # the checkpoint's own tokenizer and chat template
    learner, agent = grpo_for_tasks(grpo, model, tok, tasks, config.prompt_len, fmt=fmt)
    before, state, m = one_step(learner, agent, seed=config.seed)
    for k in ("loss", "grad_norm", "reward", "response_length", "entropy"):
        assert np.isfinite(float(m[k])), k
    assert float(m["logp_mismatch"]) <= 1e-5  # the sampler's log-probs are the learner's (issue 41)
    completions = agent.last_samples["completion"]
    assert len(completions) % grpo.group_size == 0 and any(c.strip() for c in completions)  # (+ oversampled groups)
    assert all(p.startswith("<|im_start|>system") for p in agent.last_samples["prompt"])
    rewards = np.asarray(agent.last_samples["reward"])
    changed = max_change(before, state.params)
    assert (changed > 0) == (float(m["grad_norm"]) > 0)  # an update moves the weights unless every advantage is 0
    if name == "spurious_rewards":
        assert rewards.std() > 0 and changed > 0  # (seeded) a group of differing rewards: a real update
    if name == "lora":  # only the adapters are trained; the base weights stay the checkpoint's
        assert all("lora" in jax.tree_util.keystr(p).lower() for p, _ in jax.tree_util.tree_leaves_with_path(state.params))


def one_step(learner, agent, data=None, seed: int = 0):
    """(params before as numpy, the state after one learner step of ``agent`` on ``data(0)``, its metrics)."""
    state = learner.init(jax.random.key(seed), agent)
    before = jax.tree.map(np.asarray, state.params)
    state, m = learner.step_fn(agent, data)(state)
    return before, state, m


def test_memagent_step(real_model):
    """MemAgent's Multi-Conv RL: one question, a group of 2 conversations over the real model."""
    from jaxrl_reason.agents.memagent.agent import MemAgent
    from jaxrl_reason.agents.memagent.data import doc_batch
    from jaxrl_reason.agents.memagent.trainer import multiconv_learner

    from jaxrl_reason.agents.memagent import study

    module = load_experiment("memagent")
    config = dataclasses.replace(module.PRESETS["cpu"], model=NAME)
    tok = study.load_tokenizer(config)
    agent = MemAgent(config.agent, tok)
    model = study.build_lm(config, tok, agent.seq_len)
    assert model.cfg.max_seq_len == agent.seq_len and model.cfg.vocab_size == tok.vocab_size == 49152
    questions = lambda s: doc_batch(config.task.generate_batch(np.random.default_rng([0, s]), 1), agent)
    before, state, m = one_step(*multiconv_learner(dataclasses.replace(config.rl, group_size=2), agent, model,
                                                   questions))
    assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
    assert (max_change(before, state.params) > 0) == (float(m["grad_norm"]) > 0)


def test_spiral_step(real_model):
    """SPIRAL self-play (RAE) on Kuhn Poker: 2 episodes of the real model against itself, one update."""
    from jaxrl_reason.agents.spiral.agent import spiral_learner

    from jaxrl_reason.agents.spiral import study

    module = load_experiment("spiral")
    config = dataclasses.replace(module.PRESETS["smollm2"], max_seq_len=256)
    model, tok, task_tok = study.load_lm(config)
    assert tok is real_model.tokenizer and task_tok is None and model.cfg.remat
    vcfg = dataclasses.replace(config.variant_config("rae:kuhn_poker"), episodes_per_game=2, max_new_tokens=8)
    before, state, m = one_step(*spiral_learner(vcfg, model, tokenizer=tok))
    assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
    assert 0 < float(m["kuhn_poker/response_length"]) <= 8 and 0 <= float(m["kuhn_poker/format_error"]) <= 1
    assert (max_change(before, state.params) > 0) == (float(m["grad_norm"]) > 0)


def test_joyagents_step(real_model):
    """JoyAgents: the agents from the real model (the CPU preset: one shared model with role prompts; the gpu
    preset's one copy per agent needs four models' Adam state, ~8 GB more than a test worker can hold beside
    another), one node-wise update."""
    from jaxrl_reason.agents.joyagents.trainer import joy_learner

    from jaxrl_reason.agents.joyagents import study

    module = load_experiment("joyagents")
    config = module.PRESETS["smollm2"]
    tok = study.load_tokenizer(config)
    loads = real_model.loads
    models = study.initial_models(config, tok)
    assert len(models) == config.system.num_models and real_model.loads == loads + 1  # loaded once
    requests = lambda s: study.requests(config, config.task.generate_batch(np.random.default_rng([0, s]), 1), tok)
    rl = dataclasses.replace(config.rl, group_size=2)
    before, state, m = one_step(*joy_learner(rl, config.system, models, tokenizer=tok, requests=requests))
    assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
    assert (max_change(before, state.params) > 0) == (float(m["grad_norm"]) > 0)


def test_astro_r1_tags_as_the_checkpoints_words_or_added(real_model):
    """ASTRO's in-jit search needs the R1 tags as single tokens: SmolLM2's tokenizer has none. The preset reads and
    writes them as four words SmolLM2 already has (``tag_words``: its own rows, the vocabulary unchanged); without
    them --model is refused with one error naming the tags; ``add_r1_tags`` adds them and grows the tied embedding."""
    from jaxrl_reason.models.lm import HFImportError

    from jaxrl_reason.agents import astro

    config = load_experiment("astro").PRESETS["smollm2"]
    text = "<think>3+4=7</think><answer>7</answer>"
    tok = astro.make_tokenizer(config)
    words = [tok.inner.single_token_id(w) for w in config.tag_words]
    assert list(tok.tag_ids()) == words and tok.vocab_size == 49152
    ids = tok.encode(text, allow_special=True)
    assert tok.decode(ids) == text and tok.inner.decode(ids) == "".join(
        w + part for w, part in zip(config.tag_words, ("3+4=7", "", "7", "")))  # " Steps3+4=7 So answer7 Done"
    assert astro.policy_model(config, tok).cfg.vocab_size == 49152

    with pytest.raises(HFImportError, match="does not have the R1 tags .*--tag-words"):
        astro.make_tokenizer(dataclasses.replace(config, tag_words=None))
    added = dataclasses.replace(config, tag_words=None, add_r1_tags=True)
    tok = astro.make_tokenizer(added)
    tags = [tok.single_token_id(t) for t in ("<think>", "</think>", "<answer>", "</answer>")]
    assert tags == list(range(49152, 49156)) and tok.vocab_size == 49156
    model = astro.policy_model(added, tok)
    embed = np.asarray(model.embed[...])
    assert embed.shape == (49156, 576)
    np.testing.assert_array_equal(embed[:49152], np.asarray(real_model.model.embed[...]))
    np.testing.assert_allclose(embed[49152:], np.broadcast_to(embed[:49152].mean(0), (4, 576)), atol=1e-5)
    assert tok.decode(tok.encode(text, allow_special=True)) == text


# ------------------------------------------------------------------ the issue-40 claim presets, 2 steps each, tiny
@pytest.fixture(scope="module")
def smollm2_vocab_checkpoint(smollm2, tmp_path_factory):
    """A tiny random Qwen3 (hidden 32, one layer) of SmolLM2's own vocabulary, saved with SmolLM2's tokenizer and
    chat template: the claim presets' wiring (prompts, templates, tags, lengths) at a tiny model's cost; the 135M
    weights go through every agent in the step tests above."""
    from testutil import tiny_hf_checkpoint

    return str(tiny_hf_checkpoint(tmp_path_factory.mktemp("smollm2_vocab"), smollm2.tokenizer, max_positions=1024))


def run_preset(name: str, tmp_path, *flags: str) -> dict:
    """``jaxrl-reason run NAME --preset smollm2 FLAGS`` in ``tmp_path``, in a subprocess of its own (it loads its
    checkpoint itself: programs compiled for a large model take memory only the process's end gives back)."""
    code = ("import json, sys; from jaxrl_reason.cli import run_experiment; "
            "s = run_experiment(sys.argv[1], sys.argv[2:]); "
            "print('SUMMARY' + json.dumps(s, default=lambda o: o.item() if getattr(o, 'ndim', 1) == 0 else str(o)))")
    out = subprocess.run([sys.executable, "-c", code, name, "--preset", "smollm2", "--run-root", str(tmp_path),
                          "--logger", "none", *flags], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("SUMMARY")][-1][len("SUMMARY"):])


def test_spiral_smollm2_preset_two_steps(smollm2_vocab_checkpoint, tmp_path):
    """The SPIRAL claim's preset end to end on one game and one variant (SmolLM2's tokenizer, a tiny model): warm
    start (the checkpoint before it not evaluated), 2 self-play steps (trained turns only: ``update_rows``) with
    win / forfeit rates vs every fixed opponent, reward variance, the final evaluation."""
    summary = run_preset("spiral", tmp_path, "--model", smollm2_vocab_checkpoint, "--variants", "rae:kuhn_poker", "--steps", "2", "--eval-every", "2",
                         "--warm.steps", "1", "--warm.games-per-game", "2", "--warm.batch-size", "2",
                         "--spiral.episodes-per-game", "2", "--spiral.max-new-tokens", "4", "--eval-episodes", "2",
                         "--final-eval-episodes", "2", "--infoset-samples", "1", "--transfer-problems", "1",
                         "--transfer-max-new-tokens", "2")
    variants = {k.split(" | ")[0] for k in summary if " | " in k}
    assert variants == {"sft (warm start)", "rae:kuhn_poker"}
    rows = [r for r in (tmp_path / "spiral").rglob("metrics.jsonl")]
    steps = [json.loads(line) for p in rows for line in p.read_text().splitlines()]
    train = [s for s in steps if "grad_norm" in s]
    assert len(train) == 2 and all(np.isfinite(s["loss"]) and 0 < s["kuhn_poker/response_length"] <= 4 for s in train)
    assert all(0 <= s["kuhn_poker/reward_var"] <= 4 for s in train)
    evals = [s for s in steps if "kuhn_poker/eval_win_vs_nash" in s]
    assert [s["step"] for s in evals] == [0, 2] and all("kuhn_poker/eval_forfeit_vs_random" in s for s in evals)


def test_joyagents_smollm2_preset_two_steps(smollm2_vocab_checkpoint, tmp_path):
    """The JoyAgents claim's preset (SmolLM2's tokenizer, a tiny model): protocol SFT, then 2 updates of each arm
    (joint, node-wise), one seed."""
    summary = run_preset("joyagents", tmp_path, "--model", smollm2_vocab_checkpoint, "--seeds", "1", "--sft.steps", "1", "--sft.problems", "8",
                         "--sft.batch-size", "2", "--rl.group-size", "2", "--requests-per-step", "1", "--rl-steps", "2",
                         "--eval-every", "2", "--heldout", "4")
    assert summary and all(np.isfinite(v) for v in summary.values() if isinstance(v, float))


def test_astro_smollm2_preset_two_steps(smollm2_vocab_checkpoint, tmp_path):
    """The ASTRO claim's preset (SmolLM2's tokenizer, the R1 tags four of its words, a tiny model): base SFT, search
    traces, procedure cloning, 2 RL steps on each arm; the format gate off (a random model formats nothing)."""
    summary = run_preset("astro", tmp_path, "--model", smollm2_vocab_checkpoint, "--base-sft.steps", "1", "--base-sft.problems", "8",
                         "--base-sft.batch-size", "2", "--search.num-simulations", "2", "--search.branching", "2",
                         "--search.max-depth", "2", "--search.step-tokens", "4", "--search.rollout-tokens", "4",
                         "--search-batch", "2", "--search-problems", "2", "--compare-problems", "2",
                         "--trace-sft-steps", "1", "--grpo.prompts-per-step", "1", "--grpo.group-size", "2",
                         "--grpo.max-new-tokens", "4", "--rl-steps", "2", "--eval-every", "2",
                         "--heldout-problems", "8", "--min-base-format-rate", "0")
    assert summary and all(np.isfinite(v) for v in summary.values() if isinstance(v, float))
    assert summary["heldout_n"] == summary["base_n"] == 8 and "astro_minus_direct_se" in summary


def test_rally_llm_intent_policy_from_the_real_model(real_model, tmp_path):
    """RALLY --model: the LLM intent policy's SFT on the prior's traces and one GRPO iteration start from the real
    model with its own tokenizer (digits and letters a-z single tokens), and the policy acts."""
    from jaxrl_reason.agents.rally import llm, llm_grpo
    from jaxrl_reason.agents.rally.intent import RulePrior
    from jaxrl_reason import envs

    from jaxrl_reason.agents.rally import study

    module = load_experiment("rally")
    config = dataclasses.replace(module.PRESETS["cpu"], model=NAME, llm_lr=1e-5)
    env = envs.make("swarm", **dataclasses.replace(config, max_steps=4).env_kwargs())
    lm = study.intent_lm(config)
    assert lm["tokenizer"] is real_model.tokenizer and lm["model"].cfg.vocab_size == 49152
    before = nnx.state(real_model.model, nnx.Param)  # the checkpoint's weights (2 SFT steps: the first's lr is 0)
    policy = llm.train_llm_policy(env, RulePrior(env), jax.random.key(0), sft_steps=2, batch=2, lr=config.llm_lr,
                                  trace_envs=1, trace_steps=2, **lm)
    assert max_change(before, nnx.state(nnx.merge(policy.graphdef, policy.params), nnx.Param)) > 0
    tuned, stats = llm_grpo.grpo_finetune(policy, jax.random.key(1), llm_grpo.IntentGRPOConfig(
        iterations=1, num_groups=1, group_size=2, updates=1, minibatch=4, lr=1e-6))
    assert stats["env_steps"] > 0 and np.isfinite(stats["mean_return"]).all()
    ts = env.reset(jax.random.key(2))[1]
    action = jax.jit(lambda p, k, t: llm.act(p, k, t))(tuned, jax.random.key(3), ts)
    assert action.shape[0] == env.num_agents


def test_multiturn_rollout_carries_its_kv_cache_exactly(smollm2):
    """#54: a multi-turn rollout of the real model with each episode's KV cache carried across turns (only the
    observations prefilled) draws the tokens that re-prefilling the whole context draws, with the same log-probs
    (float tolerance): sampling, episodes that end early, observations of 0..4 tokens, per-turn limits."""
    import jax.numpy as jnp

    from jaxrl_reason.models.lm.sampler import SamplerConfig
    from jaxrl_reason.rl.lm.multiturn import TextEnv, TextStep, lm_responder, make_rollout

    tok = smollm2.tokenizer
    prompts = [tok.encode(t) for t in ("Count to ten:", "Name a colour.", "Say hello to", "The sky is")]
    obs_ids = tok.encode(" then more.")[:4]
    p, n = max(map(len, prompts)), 6

    class Chat(TextEnv):  # episode i lasts 1 + i % 3 turns; observation t of episode i: its first (i + t) % 5 ids
        max_turns, prompt_tokens, obs_tokens = 3, p, len(obs_ids)

        def reset(self, key, data):
            ids = jnp.asarray([q + [0] * (p - len(q)) for q in prompts], jnp.int32)
            lens = jnp.asarray([len(q) for q in prompts], jnp.int32)
            return {"t": jnp.zeros_like(data)}, TextStep(ids, lens, jnp.zeros(data.shape), jnp.zeros(data.shape, bool),
                                                         max_new=jnp.full(data.shape, n, jnp.int32))

        def step(self, key, state, turn, turn_len):
            t = state["t"] + 1
            obs = jnp.broadcast_to(jnp.asarray(obs_ids, jnp.int32), (t.shape[0], len(obs_ids)))
            d = jnp.arange(t.shape[0])
            return {"t": t}, TextStep(obs, (d + t) % (len(obs_ids) + 1), turn_len / 10.0, t >= 1 + d % 3,
                                      max_new=2 + (d + t) % (n - 1))

    graphdef, state = nnx.split(smollm2.model)
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=n, temperature=1.0, pad_id=tok.pad_id),
                           [tok.eos_id])
    data, key = jnp.arange(4, dtype=jnp.int32), jax.random.key(0)
    a, b = (jax.jit(make_rollout(Chat(), respond, n, tok.pad_id, carry_cache=c))(state, key, data) for c in (True, False))
    for f in ("seqs", "lengths", "loss_mask", "turns", "done"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(a.sample_logp), np.asarray(b.sample_logp), atol=2e-4)
    np.testing.assert_array_equal(np.asarray(a.turns), [1, 2, 3, 1])
