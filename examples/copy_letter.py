"""A new LM agent in one file: a two-turn text game and its rollout, trained by jaxrl_reason's one learner.

The game: the prompt shows a letter ("c="); the model answers with a letter; a right answer scores 1 and ends the
episode, a wrong one gets "no=" and a second try worth 0.5. Train it from your script:

    learner = Learner(LearnerConfig(lr=3e-3, advantage="grpo"), model)
    agent = make_agent(learner.graphdef, tokenizer)
    state = learner.init(jax.random.key(0), agent)
    state, metrics = learner.step(state, agent)        # batch: None (the env draws its letters)

or from the command line: ``jaxrl-reason run agent --rollout examples/copy_letter.py:make_agent``.
"""

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_reason.envs.text import TextEnv, TextStep
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.rl.lm.multiturn import lm_responder, make_rollout

LETTERS = "abcd"


class CopyLetter(TextEnv):
    max_turns, prompt_tokens, obs_tokens = 2, 3, 3

    def __init__(self, tokenizer, episodes: int):
        self.ids = jnp.asarray([tokenizer.encode(c)[0] for c in LETTERS])
        self.bos, self.eq, self.no = tokenizer.bos_id, tokenizer.encode("=")[0], jnp.asarray(tokenizer.encode("no="))
        self.episodes = episodes

    def reset(self, key, data):
        letter = jax.random.randint(key, (self.episodes,), 0, len(LETTERS))
        obs = jnp.stack([jnp.full_like(letter, self.bos), self.ids[letter], jnp.full_like(letter, self.eq)], 1)
        zeros = jnp.zeros(letter.shape)
        return (letter, jnp.zeros_like(letter)), TextStep(obs, jnp.full(letter.shape, 3), zeros, zeros > 0)

    def step(self, key, state, turn, turn_len):
        letter, t = state
        right = turn[:, 0] == self.ids[letter]
        obs = jnp.broadcast_to(self.no, (letter.shape[0], 3))
        return (letter, t + 1), TextStep(obs, jnp.full(letter.shape, 3), right / (1.0 + t), right | (t >= 1))


@dataclasses.dataclass(frozen=True, eq=False)
class CopyLetterAgent:
    """The rollout: ``group`` episodes per letter draw share a group (GRPO's baseline)."""

    rollout_fn: object
    episodes: int
    group: int

    def rollout(self, policy, key, batch=None):
        ep = self.rollout_fn(policy, key, None)
        groups = jnp.arange(self.episodes) // self.group
        rollout = ep.to_rollout(rewards=ep.reward, groups=groups, num_groups=self.episodes // self.group)
        return rollout, {"first_try": (ep.rewards[:, 0] > 0).mean()}


def make_agent(graphdef, tokenizer, episodes: int = 64, group: int = 8, temperature: float = 1.0):
    """The agent on a learner's ``graphdef``: turns of 2 tokens (a letter, then eos) sampled at ``temperature``."""
    env = CopyLetter(tokenizer, episodes)
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=2, temperature=temperature,
                                                   pad_id=tokenizer.pad_id), [tokenizer.eos_id])
    return CopyLetterAgent(make_rollout(env, respond, 2, tokenizer.pad_id), episodes, group)
