"""Small helpers shared by several test files (importable as ``testutil``: conftest's folder is on sys.path)."""

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.models.lm import Transformer


def subprocess_xla_flags(devices: int) -> str:
    """XLA_FLAGS for a test's subprocess: ``devices`` virtual CPU devices, compiled as fast as the suite."""
    from conftest import FAST_COMPILE_FLAGS

    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_FLAGS}"


class PlainView(envs.Environment):
    """An environment seen only through reset/step: AutoReset's generic (non-split) path."""

    def __init__(self, env):
        self.inner = env
        for name in ("num_agents", "num_actions", "obs_shape", "max_episode_steps"):
            setattr(self, name, getattr(env, name))

    def reset(self, key):
        return self.inner.reset(key)

    def step(self, key, state, action):
        return self.inner.step(key, state, action)


def constant_model(cfg, token: int):
    """(graphdef, state) of a model whose every next-token argmax is ``token`` (blocks zeroed:
    identity residual; needs an untied head)."""
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    nnx.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
    model.embed[...] = jnp.ones_like(model.embed[...])
    model.final_norm.scale[...] = jnp.ones_like(model.final_norm.scale[...])
    model.lm_head.kernel[...] = jnp.zeros_like(model.lm_head.kernel[...]).at[:, token].set(1.0)
    return nnx.split(model)
