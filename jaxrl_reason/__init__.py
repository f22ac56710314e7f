"""jaxrl_reason: JAX-native RL for reasoning, games and multi-agent coordination."""

__version__ = "0.1.0"
