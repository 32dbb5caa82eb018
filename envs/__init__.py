"""Environments, one description each (an `EnvSpec`, spec.py; found by name in registry.py): CarRacing with privileged
state (carracing.py), the Udacity-style simulator and its hard world (udacity/), and a recording replayed in closed
loop (replay/)."""
