"""RL block-size environment: rewards follow residual reduction, larger blocks help, bad config raises."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.solvers.blocksize_env import BlockSizeEnv, evaluate


@pytest.fixture(scope="module")
def env():
    return BlockSizeEnv(n=32, pool_size=6, block_sizes=(1, 16), max_cycles=8, split="test")


def test_fixed_block_sizes_converge_and_larger_blocks_need_fewer_iterations(env):
    small = evaluate(env, lambda ts: jnp.int32(0), np.arange(6))
    large = evaluate(env, lambda ts: jnp.int32(1), np.arange(6))
    assert bool(large["converged"].all())
    assert float(large["iterations"].mean()) < float(small["iterations"].mean())
    assert np.isfinite(np.asarray(large["ret"])).all()


def test_bad_config_raises():
    with pytest.raises(ValueError, match="block_sizes"):
        BlockSizeEnv(n=16, block_sizes=(32,), pool_size=1)
    with pytest.raises(ValueError, match="family"):
        BlockSizeEnv(family="bonds")
    with pytest.raises(ValueError, match="split"):
        BlockSizeEnv(n=16, pool_size=1, split="val")
