"""The bottom of the house: atomic files and JSON (files.py) and stop signals (stops.py), which envs/, policies/
and agent/ may all import; it imports none of them."""
