"""Multi-agent learners: MAPPO (centralised critic) and QMIX (monotone mixing, flashbax replay).
IPPO is ``jaxrl_reason.rl.ppo`` (parameter-shared, independent critics)."""
