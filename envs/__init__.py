"""Environments: CarRacing wrappers with privileged state (and later the Udacity-style simulator)."""
