"""RL block-size environment: rewards follow residual reduction, larger blocks help, bad config raises."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.solvers.blocksize_env import BlockSizeEnv, _inv_diag_blocks, alternate, evaluate, previous_action


@pytest.fixture(scope="module")
def env():
    return BlockSizeEnv(n=32, pool_size=6, block_sizes=(1, 16), max_cycles=8, split="test")


def test_fixed_block_sizes_converge_and_larger_blocks_need_fewer_iterations(env):
    small = evaluate(env, lambda ts: jnp.int32(0), np.arange(6))
    large = evaluate(env, lambda ts: jnp.int32(1), np.arange(6))
    assert bool(large["converged"].all())
    assert float(large["iterations"].mean()) < float(small["iterations"].mean())
    assert np.isfinite(np.asarray(large["ret"])).all()


def test_alternate_reads_the_previous_action_from_the_observation(env):
    state, ts = env.reset_to(0)
    choose = alternate(1, 0)
    assert int(previous_action(ts)) == -1 and int(choose(ts)) == 1
    for expected_prev, expected_next in ((1, 0), (0, 1)):
        state, ts = env.step(None, state, choose(ts))
        assert int(previous_action(ts)) == expected_prev and int(choose(ts)) == expected_next


def test_block_inverses_shift_only_singular_blocks():
    rng = np.random.default_rng(0)
    A = (1e3 * (8 * np.eye(32) + rng.standard_normal((32, 32)))).astype(np.float32)[None]  # entries ~1e3: scale^16
    A[0, 16:, 16:] = 0  # overflows float32; the second diagonal block is all zero (a KKT constraint block)
    inv = _inv_diag_blocks(A, 16)
    np.testing.assert_allclose(inv[0, 0], np.linalg.inv(A[0, :16, :16].astype(np.float64)), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(inv[0, 1], np.eye(16) / np.sqrt(np.finfo(np.float32).eps), rtol=1e-6)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="block_sizes"):
        BlockSizeEnv(n=16, block_sizes=(32,), pool_size=1)
    with pytest.raises(ValueError, match="family"):
        BlockSizeEnv(family="bonds")
    with pytest.raises(ValueError, match="split"):
        BlockSizeEnv(n=16, pool_size=1, split="val")


def test_the_solvers_package_registers_the_env_on_import(monkeypatch):
    import importlib

    import jaxrl_reason.solvers
    from jaxrl_reason import envs
    from jaxrl_reason.envs import registry

    assert isinstance(envs.make("fgmres_blocksize", n=16, pool_size=1), BlockSizeEnv)
    # a copy of the registry (restored after the test) without it, as if jaxrl_reason.solvers were never imported
    monkeypatch.setattr(registry, "_REGISTRY", {k: v for k, v in registry._REGISTRY.items() if k != "fgmres_blocksize"})
    with pytest.raises(ValueError, match=r"registered environments: catch, .*registered when its module is imported"):
        envs.make("fgmres_blocksize")
    importlib.reload(jaxrl_reason.solvers)  # importing the package registers it again
    assert "fgmres_blocksize" in envs.registered_names()
    importlib.reload(jaxrl_reason.solvers)  # registering the same target twice is fine
    with pytest.raises(ValueError, match="already registered"):
        envs.register("fgmres_blocksize", "jaxrl_reason.envs.catch:Catch")
    with pytest.raises(ValueError, match="module:ClassName"):
        envs.register("blocks_typo", "jaxrl_reason.solvers.blocksize_env.BlockSizeEnv")
    envs.register("tiny_blocks", lambda **kw: BlockSizeEnv(n=16, pool_size=1, **kw))  # a factory
    assert envs.make("tiny_blocks", max_cycles=3).max_episode_steps == 3
