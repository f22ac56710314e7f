"""Host-side data for MemAgent: token batches of long-context problems and oracle SFT conversations.

    agent = MemAgent(MemAgentConfig(...), tokenizer)      # the tokenizer encodes every text below
    batch = doc_batch(problems, agent)                   # DocBatch of right-padded token arrays
    convs = oracle_conversations(task, problems, agent)  # [(prompt ids, response ids)], one per turn
    data = conversation_arrays(convs, agent.seq_len, tokenizer=agent.tokenizer)
                                                         # {"tokens" [N, T], "loss_mask" [N, T-1]}

The oracle conversations are what the LM needs before RL (a tiny one trained from scratch, or a
checkpoint learning the memory format): every memory update of the ideal overwrite rule
(``task.oracle_update``) and the final answer, rendered with exactly the agent's templates
(``models.lm.prompts.render_parts``), loss on the response (+ <eos>) only. Documents, questions, answers and
memories are data: plain text, one token per character (``encode_plain``; with a checkpoint
tokenizer a valid spelling, not its canonical tokenization).
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxrl_reason.agents.memagent.agent import DocBatch, MemAgent
from jaxrl_reason.models.lm.prompts import render_parts
from jaxrl_reason.models.lm.sft import sft_examples
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.longcontext import LongContextProblem, LongContextTask, encode_plain


def doc_batch(problems: Sequence[LongContextProblem], agent: MemAgent, doc_width: int | None = None) -> DocBatch:
    """Problems -> DocBatch; raises if a question or an expected answer does not fit the agent's shapes."""
    if not problems:
        raise ValueError("doc_batch: no problems")
    tok, cfg = agent.tokenizer, agent.config
    doc, dlens = encode_plain([p.document for p in problems], doc_width, tokenizer=tok)
    q, qlens = encode_plain([p.question for p in problems], cfg.question_tokens, tokenizer=tok)
    a, alens = encode_plain([p.answer for p in problems], cfg.answer_tokens, tokenizer=tok)
    return DocBatch(doc=jnp.asarray(doc), doc_lens=jnp.asarray(dlens), question=jnp.asarray(q),
                    question_lens=jnp.asarray(qlens), answer=jnp.asarray(a), answer_lens=jnp.asarray(alens))


def text_ids(text: str, tokenizer: Tokenizer) -> list[int]:
    """Plain text (data) -> ids, as ``encode_plain`` encodes it."""
    return encode_plain([text], tokenizer=tokenizer)[0][0].tolist() if text else []


def oracle_conversations(task: LongContextTask, problems: Sequence[LongContextProblem],
                         agent: MemAgent) -> list[tuple[list[int], list[int]]]:
    """Every memory-update turn (chunk by chunk, oracle memory) and the final-answer turn of each problem."""
    config, tok = agent.config, agent.tokenizer
    if config.initial_memory != task.no_answer:
        raise ValueError(f"agent initial_memory {config.initial_memory!r} must equal the task's no_answer "
                         f"{task.no_answer!r} for the oracle memories to be consistent")
    ids = lambda text: text_ids(text, tok)
    c = config.chunk_tokens
    convs = []
    for p in problems:
        mem, q = config.initial_memory, ids(p.question)
        for i in range(0, len(p.document), c):
            new = task.oracle_update(p.question, p.document[i:i + c], mem)
            prompt = render_parts(agent.update_parts, {"question": q, "chunk": ids(p.document[i:i + c]),
                                                       "memory": ids(mem)}, agent.bos_id)
            convs.append((prompt, ids(new) + [agent.eos_id]))
            mem = new
        prompt = render_parts(agent.final_parts, {"question": q, "memory": ids(mem)}, agent.bos_id)
        convs.append((prompt, ids(task.oracle_answer(p.question, mem)) + [agent.eos_id]))
    return convs


def conversation_arrays(convs: Sequence[tuple[list[int], list[int]]], seq_len: int, *,
                        tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """-> {"tokens" [N, seq_len] int32 (right-padded with the tokenizer's pad), "loss_mask" [N, seq_len-1]
    float32 (1 on response targets)}: ``models.lm.sft.sft_examples`` of the pairs."""
    return sft_examples([p for p, _ in convs], [r for _, r in convs], seq_len, tokenizer)


__all__ = ["conversation_arrays", "doc_batch", "oracle_conversations", "text_ids"]
