"""LoRA: config errors, adapter-off == base exactly, merge == adapted, optimiser state holds only the
adapters (MLA's absorbed attention too), SFT and GRPO steps move only the adapters (SFT loss falls), sharded
placement on a mesh, and export merges the adapters (the PEFT adapter export: test_peft_export.py)."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.lora import (
    LoRAConfig,
    LoRAParam,
    apply_lora,
    has_lora,
    lora_off,
    merge_lora,
    state_bytes,
)
from jaxrl_reason.models.lm.sharding import param_specs, shard_state
from jaxrl_reason.models.lm.train import init_train_state, make_train_step
from jaxrl_reason.parallel.mesh import make_mesh
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig

TOK = CharTokenizer()
CFG = LMConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=32)
TOKENS = jax.random.randint(jax.random.key(1), (2, 10), 1, TOK.vocab_size)
np_leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]


@pytest.fixture(scope="module")
def base():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def _perturbed(model, config=LoRAConfig(rank=4, targets=("all_linear",))):
    """Adapters with random (non-zero) A and B, so the adapted model differs from the base."""
    lm = apply_lora(model, config)
    g, ad, rest = nnx.split(lm, LoRAParam, ...)
    ks = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(ad))))
    ad = jax.tree.map(lambda x: 0.1 * jax.random.normal(next(ks), x.shape, x.dtype), ad)
    return nnx.merge(g, ad, rest)


@pytest.mark.parametrize("kw, msg", [
    (dict(rank=0), "rank must be >= 1"),
    (dict(dropout=1.0), "dropout must be in"),
    (dict(dropout=-0.1), "dropout"),
    (dict(alpha=-1.0), "alpha"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(targets="q_proj"), "tuple of names"),
    (dict(targets=()), "tuple of names"),
    (dict(targets=("q_proj(",)), "bad pattern"),
])
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LoRAConfig(**kw)


def test_apply_errors(base):
    with pytest.raises(ValueError, match="match no Linear"):
        apply_lora(base, LoRAConfig(targets=("nope",)))
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(apply_lora(base, LoRAConfig()), LoRAConfig())


def test_targets_shapes_and_base_untouched(base):
    lm = apply_lora(base, LoRAConfig(rank=4, targets=("q_proj", "v_proj")))
    assert not has_lora(base) and has_lora(lm)
    ad = nnx.state(lm, LoRAParam)
    assert sorted(ad["blocks"]["attn"].keys()) == ["q_proj", "v_proj"]
    q = lm.blocks.attn.q_proj
    assert q.lora.a.shape == (CFG.n_layers, 32, 4) and q.lora.b.shape == (CFG.n_layers, 4, q.kernel.shape[-1])
    all_lin = nnx.state(apply_lora(base, LoRAConfig(targets=("all_linear",))), LoRAParam)
    assert set(all_lin["blocks"]["mlp"].keys()) == {"gate", "up", "down"}


def test_adapter_off_is_the_base_model_exactly(base):
    want = np.asarray(base(TOKENS)[0])
    np.testing.assert_array_equal(np.asarray(apply_lora(base, LoRAConfig())(TOKENS)[0]), want)  # fresh: B = 0
    lm = _perturbed(base)
    g, ad, rest = nnx.split(lm, LoRAParam, ...)
    assert not np.allclose(np.asarray(lm(TOKENS)[0]), want)
    np.testing.assert_array_equal(np.asarray(nnx.merge(g, lora_off(ad), rest)(TOKENS)[0]), want)


def test_merge_matches_adapted(base):
    lm = _perturbed(base)
    merged = merge_lora(lm)
    assert not has_lora(merged) and has_lora(lm)  # the input keeps its adapters
    assert jax.tree.structure(nnx.state(merged)) == jax.tree.structure(nnx.state(base))
    np.testing.assert_allclose(np.asarray(merged(TOKENS)[0]), np.asarray(lm(TOKENS)[0]), atol=1e-5, rtol=1e-5)


def test_mla_adapters_apply_in_the_absorbed_attention_too():
    """MLA with absorbed attention (the default) reads kv_b's kernel directly: an adapter on kv_b still applies."""
    cfg = LMConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, attention="mla", kv_lora_rank=16,
                   q_lora_rank=16, qk_rope_dim=8, qk_nope_dim=8, v_head_dim=8, max_seq_len=32)
    assert cfg.mla_absorbed
    lm = _perturbed(Transformer(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=4, targets=("kv_b",)))
    want = np.asarray(merge_lora(lm)(TOKENS)[0])
    naive = nnx.merge(nnx.graphdef(lm), nnx.state(lm))
    naive.blocks.attn.absorbed = False
    np.testing.assert_allclose(np.asarray(lm(TOKENS)[0]), want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(naive(TOKENS)[0]), want, atol=1e-5, rtol=1e-5)


def test_sft_steps_train_only_adapters_and_reduce_loss(base):
    lm = apply_lora(base, LoRAConfig(rank=4, alpha=8.0, targets=("all_linear",)))
    opt = optax.adam(1e-2)
    graphdef, state = init_train_state(lm, opt, wrt=LoRAParam)
    n_ad = sum(x.size for x in jax.tree.leaves(state.params))
    n_all = sum(x.size for x in jax.tree.leaves(nnx.state(lm, nnx.Param)))
    assert {type(v) for v in jax.tree.leaves(state.params, is_leaf=lambda x: isinstance(x, nnx.Variable))} == {LoRAParam}
    adam_mu = state.opt_state[0].mu
    assert sum(x.size for x in jax.tree.leaves(adam_mu)) == n_ad < 0.3 * n_all
    rest0 = np_leaves(state.rest)
    step = make_train_step(graphdef, opt, chunk=16, wrt=LoRAParam)
    batch = {"tokens": TOKENS, "loss_mask": jnp.ones((2, 9))}
    losses = []
    for _ in range(15):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < losses[0] - 0.5, losses
    for a, b in zip(rest0, np_leaves(state.rest)):
        np.testing.assert_array_equal(a, b)


TASKS = [RandomCalculation(max_difficulty=1, ops="+-")]
GRPO = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=8, lr=1e-2, minibatches=2, log_kl=True,
                  reward=RewardConfig("random"), lora=LoRAConfig(rank=4, dropout=0.1, targets=("all_linear",)))


def test_grpo_lora_trains_adapters_only_against_the_base_reference(base):
    learner, agent = grpo_for_tasks(GRPO, base, TOK, TASKS, prompt_len=12)
    full, full_agent = grpo_for_tasks(dataclasses.replace(GRPO, lora=None), base, TOK, TASKS, prompt_len=12)
    assert not has_lora(base)  # the learner adapted a copy
    state = learner.init(jax.random.key(0), agent)
    # optimiser state: adapters only (adam mu and nu), far below full fine-tuning's
    full_params = full.init(jax.random.key(0), full_agent).params
    ad_bytes, full_opt = state_bytes(state.params), state_bytes(full.optimizer.init(full_params))
    assert ad_bytes * 2 <= state_bytes(state.opt_state) <= ad_bytes * 2 + 64 and state_bytes(state.opt_state) < 0.3 * full_opt
    ref_model = nnx.merge(learner.graphdef, state.ref_params, state.rest)
    np.testing.assert_array_equal(np.asarray(ref_model(TOKENS)[0]), np.asarray(base(TOKENS)[0]))
    rest0, ref0, p0 = np_leaves(state.rest), np_leaves(state.ref_params), np_leaves(state.params)
    step = learner.step_fn(agent)
    for _ in range(2):
        state, m = step(state)
        assert np.isfinite(m["loss"]) and np.isfinite(m["kl"])
    assert any(not np.allclose(a, b) for a, b in zip(p0, np_leaves(state.params)))  # adapters moved
    for a, b in zip(rest0 + ref0, np_leaves(state.rest) + np_leaves(state.ref_params)):
        np.testing.assert_array_equal(a, b)  # base weights and reference frozen
    assert float(m["kl_ref"]) > 0  # the policy left the base model


def test_sharded_adapters_follow_their_kernels(base):
    mesh = make_mesh("fsdp=2,tensor=4")
    lm = apply_lora(base, LoRAConfig(rank=4, targets=("all_linear",)))
    state = nnx.state(lm)
    specs = param_specs(state, mesh)
    q, o = specs["blocks"]["attn"]["q_proj"], specs["blocks"]["attn"]["o_proj"]
    kq, ko = tuple(q["kernel"].get_value()), tuple(o["kernel"].get_value())
    assert kq == (None, "fsdp", "tensor") and ko == (None, "tensor", "fsdp")
    assert tuple(q["lora"]["a"].get_value()) == (None, "fsdp", None) and tuple(q["lora"]["b"].get_value()) == (None, None, "tensor")
    assert tuple(o["lora"]["a"].get_value()) == (None, "tensor", None) and tuple(o["lora"]["b"].get_value()) == (None, None, "fsdp")
    sharded = nnx.merge(nnx.graphdef(lm), shard_state(state, mesh))
    assert len(sharded.blocks.attn.q_proj.lora.b[...].sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(sharded(TOKENS)[0]), np.asarray(lm(TOKENS)[0]), atol=1e-5)
    learner, agent = grpo_for_tasks(dataclasses.replace(GRPO, mesh="data=4,tensor=2"), base, TOK, TASKS, prompt_len=12)
    s = learner.init(jax.random.key(0), agent)  # (a sharded GRPO step: tests/rl/grpo/test_agent.py, plus adapters)
    b = s.params["blocks"]["attn"]["q_proj"]["lora"]["b"]
    assert b[...].sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor") and len(b[...].sharding.device_set) == 8


def test_export_merges_adapters(base, tmp_path):
    pytest.importorskip("safetensors")
    from jaxrl_reason.models.lm import load_hf_model, save_hf_model

    lm = _perturbed(base)
    back = load_hf_model(save_hf_model(lm, tmp_path / "export"))
    assert not has_lora(back)
    np.testing.assert_allclose(np.asarray(back(TOKENS)[0]), np.asarray(lm(TOKENS)[0]), atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # warm start + two SFT arms + evaluations (~30 s on 2 quiet cores)
def test_lora_experiment_sft_objective_trains_adapters_only(tmp_path):
    """experiments/lora.py with objective=sft: both arms learn from the same warm start, the LoRA arm with
    adapters only (a few % of the optimiser state), its merged model scores as the adapted one, and the run exports
    it merged and as a PEFT adapter that peft loads on the exported base with the merged export's logits."""
    from jaxrl_reason.cli import run_experiment

    s = run_experiment("lora", ["--run-root", str(tmp_path), "--objective", "sft", "--warm-start.steps", "20",
                                "--warm-start.problems", "256", "--sft-steps", "60", "--sft-problems", "1024",
                                "--heldout-problems", "96"])
    assert s["n_heldout"] == 96 and s["opt_state_ratio"] < 0.05
    assert s["full_gain_points"] > 10 and s["lora_gain_points"] > 10, s  # learning: both beat the warm start
    assert s["lora_merged_accuracy"] == s["lora_accuracy"]
    assert abs(s["lora_minus_full_points"] - (s["lora_accuracy"] - s["full_accuracy"]) * 100) < 1e-9
    # both exports of the LoRA arm: merged (lora/hf) and a PEFT adapter on the warm start (base/, exported too)
    run = pathlib.Path(s["run_dir"])
    dirs = ("lora/hf", "lora/adapter", "base")
    assert (s["lora_hf"], s["lora_adapter"], s["base_hf"]) == tuple(str(run / d) for d in dirs)
    config = json.loads((run / "lora/adapter/adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == s["base_hf"] and config["r"] == 4 and config["lora_alpha"] == 8
    transformers, peft = pytest.importorskip("transformers"), pytest.importorskip("peft")
    from testutil import hf_logits, rel_error

    adapted = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(run / "base"),
                                             run / "lora/adapter")
    merged = transformers.AutoModelForCausalLM.from_pretrained(run / "lora/hf")
    toks = np.asarray(TOKENS)
    assert rel_error(hf_logits(adapted, toks), hf_logits(merged, toks)) < 1e-5
