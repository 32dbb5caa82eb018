"""Environments, one description each (registry.py): CarRacing with privileged state (carracing.py), the Udacity-style
simulator and its hard world (udacity/), and a recording replayed in closed loop (replay/)."""
