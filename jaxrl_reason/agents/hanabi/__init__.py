"""Hanabi agents: convention bots, game records, BC, IPPO / HDR-IPPO, cross-play evaluation."""
