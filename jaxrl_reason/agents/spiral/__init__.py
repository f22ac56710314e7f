"""SPIRAL: one language model plays both seats of zero-sum text games, trained with
Role-conditioned Advantage Estimation (arXiv 2506.24119), fully on device.

- ``tokenizer``: the LM's tokenizer (task specials + bytes for the presets, or a checkpoint's byte-level
  BPE), the byte <-> id tables that render and parse game text in jit, and the task-id adapter.
- ``rollout``: multi-turn, multi-agent episode batches in one jitted loop (render -> sample -> parse -> step):
  each game a text env of the multi-turn engine (``rl.lm.multiturn``), per-turn token sequences stored.
- ``advantages``: RAE, plain self-play and fixed-opponent advantages: the learner's registered estimators.
- ``warmstart``: SFT warm start on formatted heuristic / random-legal moves.
- ``agent``: multi-game self-play as a rollout of the LM learner (``SpiralAgent``, ``spiral_learner``), per-game
  metrics.
- ``evaluation``: win rates vs fixed opponents, the games' exact evaluations of the LM (Kuhn exploitability), transfer eval.
"""
