"""The MLA + DeepSeekMoE family, single device and sharded on 8 virtual CPU devices.

One model, one compiled forward, one compiled train step and one sharded train step are shared by
all tests here (compilation dominates the cost of these tests).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl_reason.models.lm import LMConfig, Transformer, init_cache
from jaxrl_reason.models.lm.moe import MoE, max_over_mean_load
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate, prepare
from jaxrl_reason.models.lm.sharding import batch_sharding, fit_spec, param_specs, shard_state
from jaxrl_reason.models.lm.train import init_train_state, make_optimizer, make_train_step
from jaxrl_reason.parallel.mesh import make_mesh

MOE = LMConfig(vocab_size=64, d_model=32, n_heads=4, d_ff=64, attention="mla", kv_lora_rank=16, q_lora_rank=16,
               qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8, n_routed_experts=8, moe_top_k=2, moe_d_ff=16,
               moe_bias_update_rate=1e-2, remat=True)
TOKS = jax.random.randint(jax.random.PRNGKey(0), (2, 10), 0, 64)
FWD = nnx.jit(lambda m, t: m(t)[0])
STEPS = 60
BATCH, LEN = 8, 16


@pytest.fixture(scope="module")
def model():
    m = Transformer(MOE, rngs=nnx.Rngs(0))
    m.blocks.mlp.router[...] = m.blocks.mlp.router[...] + jnp.zeros((32, 8)).at[:, :2].set(0.3)  # skew to experts 0, 1
    return m


@pytest.fixture(scope="module")
def full_logits(model):
    return FWD(model, TOKS)


@pytest.fixture(scope="module")
def trainer(model):
    opt = make_optimizer(1e-2, STEPS, warmup_steps=5)
    graphdef, state = init_train_state(model, opt)
    return make_train_step(graphdef, opt, chunk=8), state


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 8:
        pytest.skip("needs 8 (virtual) devices")
    return make_mesh("data=2,expert=2,tensor=2")


def _copy(state):
    return jax.tree.map(jnp.copy, state)  # the train step donates its state


def _counting_batch(key):
    """Token t+1 = token t + 1 (mod V)."""
    start = jax.random.randint(key, (BATCH, 1), 0, MOE.vocab_size)
    return {"tokens": (start + jnp.arange(LEN)) % MOE.vocab_size, "loss_mask": jnp.ones((BATCH, LEN - 1))}


def test_mla_absorbed_equals_naive(model, full_logits):
    naive = Transformer(dataclasses.replace(MOE, mla_absorbed=False), rngs=nnx.Rngs(1))
    nnx.update(naive, nnx.state(model))
    ref = FWD(naive, TOKS)
    assert float(jnp.max(jnp.abs(full_logits - ref)) / jnp.max(jnp.abs(ref))) < 1e-5


def test_incremental_decode_matches_full_forward(model, full_logits):
    """Absorbed MLA on the compressed cache, fed 2 tokens at a time == one full forward."""
    cache = init_cache(MOE, 2, 12)
    step = nnx.jit(lambda m, t, p, c: m(t, p, c)[:2])
    outs = []
    for i in range(0, 10, 2):
        lg, cache = step(model, TOKS[:, i : i + 2], jnp.broadcast_to(jnp.arange(i, i + 2), (2, 2)), cache)
        outs.append(lg)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full_logits), atol=2e-5)
    assert set(cache.buffers) == {"c", "kr"} and cache.buffers["c"].shape == (MOE.n_layers, 2, 12, MOE.kv_lora_rank)


@pytest.mark.slow
def test_sft_learns_counting_with_moe(trainer):
    step, state = trainer
    state, key, hist = _copy(state), jax.random.PRNGKey(0), []
    for _ in range(STEPS):
        key, sub = jax.random.split(key)
        state, met = step(state, _counting_batch(sub))
        hist.append(jax.device_get(met))
    first, last = hist[0], hist[-1]
    assert last["nll"] < 0.5 * first["nll"], (first["nll"], last["nll"])


@pytest.mark.slow
def test_aux_loss_free_bias_balances_experts(trainer):
    """Router skewed at init towards experts 0, 1; random tokens. Expert load averaged over the last
    50 of 150 steps: max/mean < 1.5 with the bias update on, much higher with it off (the same
    compiled step, with the bias reset to 0 after every step == update rate 0)."""
    step, init = trainer

    def run(update: bool) -> float:
        state, key, loads = _copy(init), jax.random.PRNGKey(1), []
        for _ in range(150):
            key, sub = jax.random.split(key)
            toks = jax.random.randint(sub, (BATCH, LEN), 1, MOE.vocab_size)
            state, met = step(state, {"tokens": toks, "loss_mask": jnp.ones((BATCH, LEN - 1))})
            if not update:
                state = state.replace(rest=jax.tree.map(jnp.zeros_like, state.rest))
            loads.append(met["load"])
        return float(jnp.max(max_over_mean_load(jnp.mean(jnp.stack(loads[-50:]), 0))))

    on, off = run(True), run(False)
    print(f"max/mean expert load: bias update on {on:.2f}, off {off:.2f}")
    assert on < 1.5 and off > 2.0, (on, off)


def test_specs_fit_mesh(model, mesh):
    specs = param_specs(nnx.state(model), mesh)
    assert specs["blocks"]["mlp"]["w_gate"].get_value() == P(None, "expert", None, "tensor")
    assert fit_spec(P("tensor"), (3,), {"tensor": 2}) == P(None)  # 3 not divisible: replicated


def test_sharded_train_step_matches_single_device(trainer, mesh):
    """data=2, expert=2, tensor=2: FSDP/TP-sharded params, all-to-all expert parallelism, MLA."""
    step, init = trainer
    batch = _counting_batch(jax.random.PRNGKey(5))
    state1, m1 = step(_copy(init), batch)
    with jax.set_mesh(mesh):
        copy = _copy(init)
        sstate = copy.replace(params=shard_state(copy.params, mesh))
        sbatch = {k: jax.device_put(v, batch_sharding(mesh, v.shape)) for k, v in batch.items()}
        state2, m2 = step(sstate, sbatch)
    assert len(state2.params["blocks"]["mlp"]["w_up"][...].sharding.device_set) == 8
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["load"], m2["load"], atol=1e-6)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state2.params)):
        np.testing.assert_allclose(a, b, atol=2e-5)
    np.testing.assert_allclose(state1.rest["blocks"]["mlp"]["bias"][...], state2.rest["blocks"]["mlp"]["bias"][...])


def test_sharded_greedy_sampler_equals_argmax_of_full_forward(model, full_logits, mesh):
    """Sampler (compressed MLA cache, MoE) on 8 devices: greedy tokens == argmax of the full forward."""
    cfg = SamplerConfig(max_new_tokens=5, temperature=0.0)
    args = prepare(MOE, TOKS[:, :5], None, cfg)
    graphdef, state = nnx.split(model)
    with jax.set_mesh(mesh):
        sargs = [jax.device_put(a, batch_sharding(mesh, a.shape)) for a in args]
        out = generate(graphdef, shard_state(state, mesh), *sargs[:2], jax.random.PRNGKey(0), *sargs[2:], config=cfg)
    tokens = jnp.concatenate([TOKS[:, :5], out.tokens], 1)
    logits = FWD(model, tokens)  # same shape as TOKS: the compiled forward is reused
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(jnp.argmax(logits[:, 4:9], -1)))
    ref_lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, 4:9]), out.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.logprobs, ref_lp, atol=1e-5)


@pytest.mark.parametrize("dispatch, batch", [("all_to_all", 4), ("constraint", 4), ("all_to_all", 3)])
def test_expert_parallel_dispatch(mesh, dispatch, batch):
    """MoE layer under the mesh == single device; "all_to_all" puts explicit all-to-alls in the HLO;
    a batch the expert axis does not divide falls back to the constraint path."""
    layer = MoE(dataclasses.replace(MOE, moe_dispatch=dispatch), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0])
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, 6, MOE.d_model))
    ref = fwd(state, x)
    with jax.set_mesh(mesh):
        sx = jax.device_put(x, batch_sharding(mesh, x.shape))
        sstate = shard_state(state, mesh, [(r"w_(gate|up)", P("expert", None, "tensor")), (r"w_down", P("expert", "tensor"))])
        compiled = fwd.lower(sstate, sx).compile()
        out = compiled(sstate, sx)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-6)
    if dispatch == "all_to_all" and batch % 2 == 0:
        assert "all-to-all" in compiled.as_text()
