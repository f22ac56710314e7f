"""Best-of-N matched to a search's token spend: the fair sampling baseline of a search comparison.

    solved, tokens = matched_best_of_n(graphdef, params, key, batch, budget, groups, max_new_tokens=24,
                                       temperature=1.0, verify=answer_verifier(task, tok), tokenizer=tok)

Per group of problems (e.g. a difficulty), best-of-N takes the fewest responses per problem whose mean
tokens reach the group's mean ``budget`` (the tokens the searches spent on those problems), so it never
has fewer tokens than a search it is compared with, overall or in any group. The responses come from
``lm_mcts.sample_and_verify`` (the search's sampler, stop ids and verifier).
"""

from __future__ import annotations

import numpy as np

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.search.lm_mcts import sample_and_verify


def take_matched(ok: np.ndarray, tok: np.ndarray, budget: np.ndarray, groups: np.ndarray):
    """Per group, the fewest responses per problem whose mean tokens reach the group's mean budget.

    ok, tok [B, N]: verified flag and tokens of N drawn responses; budget [B]; groups [B]
    -> (solved [B]: any of the taken responses verified, tokens [B]: their tokens), or None when N
    responses do not reach some group's budget.
    """
    solved, tokens = np.zeros(len(budget), bool), np.zeros(len(budget), np.int64)
    for g in np.unique(groups):
        m = groups == g
        spent = np.cumsum(tok[m], axis=1).mean(0)  # [N]: mean tokens of the first j+1 responses
        if spent[-1] < budget[m].mean():
            return None
        j = int(np.argmax(spent >= budget[m].mean()))
        solved[m], tokens[m] = ok[m, : j + 1].any(1), tok[m, : j + 1].sum(1)
    return solved, tokens


def matched_best_of_n(graphdef, params, key, batch, budget: np.ndarray, groups: np.ndarray, *, max_new_tokens: int,
                      temperature: float, verify, tokenizer: Tokenizer):
    """Best-of-N on one batch of problems with, in each group, at least the group's mean ``budget`` tokens.

    batch: prompts [B, P], prompt_lens, answers [B, A], answer_lens (``tasks.base.ProblemBatch``); budget [B]:
    tokens per problem to match; groups [B]. Draws N responses per problem (at most ``max_new_tokens`` each,
    checked by ``verify``), growing N until every group's budget can be met, then ``take_matched``
    -> (solved [B] bool, tokens [B]).
    """
    n = max(1, int(budget.max() // max_new_tokens))  # a lower bound; grow until every group's budget is reached
    while True:
        ok, tok = sample_and_verify(graphdef, params, key, batch.prompts, batch.prompt_lens, batch.answers,
                                    batch.answer_lens, num_samples=n, max_new_tokens=max_new_tokens,
                                    temperature=temperature, tokenizer=tokenizer, verify=verify)
        ok, tok = np.asarray(ok), np.asarray(tok)
        taken = take_matched(ok, tok, budget, groups)
        if taken is not None:
            return taken
        short = max(budget[groups == g].mean() / max(tok[groups == g].sum(1).mean(), 1.0) for g in np.unique(groups))
        n = int(np.ceil(n * short)) + 1


__all__ = ["matched_best_of_n", "take_matched"]
