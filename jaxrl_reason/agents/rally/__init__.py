"""RALLY (arXiv 2507.01378): roles Commander / Coordinator / Executor, the intent-policy
interface with a scripted prior, RMIX role-value mixing, and the LLM intent policy."""
