"""rl/grpo/start.py: the CPU start's SFT problems (the held-out prompts left out)."""

from jaxrl_reason.rl.grpo.start import StartConfig, sft_problems


def test_start_sft_problems_leave_out_the_excluded_prompts():
    cfg = StartConfig(sft_problems=256)
    every = sft_problems(cfg)
    held = frozenset(p.prompt for p in every[:20])
    kept = sft_problems(cfg, held)
    assert len(every) == 256 and 0 < len(kept) <= 256 - 20 and not held & {p.prompt for p in kept}
    assert [p.prompt for p in kept] == [p.prompt for p in every if p.prompt not in held]  # the same draw, filtered
