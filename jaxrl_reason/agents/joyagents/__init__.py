"""JoyAgents-R1 (arXiv 2506.19846): a master agent routing requests to math / QA / function-call agents
as one jitted transform (``system``), bounded strategy memory evolved with GRPO rewards (``memory``),
scripted SFT traces (``data``) and joint GRPO training, plain or node-wise Monte Carlo with top-K
marginal-benefit selection (``trainer``)."""
