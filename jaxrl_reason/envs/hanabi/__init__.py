"""Hanabi (2-5 players, HLE rules): pure game logic, observation encodings, env wrapper."""

from jaxrl_reason.envs.hanabi.encoding import OBS_MODES, decode, encode, obs_size, section_slices
from jaxrl_reason.envs.hanabi.env import Hanabi
from jaxrl_reason.envs.hanabi.game import GameConfig, GameState, init_from_deck, init_random, legal_moves

__all__ = ["OBS_MODES", "GameConfig", "GameState", "Hanabi", "decode", "encode", "init_from_deck",
           "init_random", "legal_moves", "obs_size", "section_slices"]
