"""UAV swarm pursuit-evasion / coverage environment (RALLY setting); see ``env.py``."""

from jaxrl_reason.envs.swarm.dynamics import COMMANDER, COORDINATOR, EXECUTOR, NUM_ROLES, ROLE_NAMES
from jaxrl_reason.envs.swarm.env import Swarm, SwarmConfig, SwarmState

__all__ = ["COMMANDER", "COORDINATOR", "EXECUTOR", "NUM_ROLES", "ROLE_NAMES", "Swarm", "SwarmConfig",
           "SwarmState"]
