"""The bottom of the house: atomic files and JSON (files.py), stop signals (stops.py) and command lines built from
dataclasses with how every command ends (cli.py), which driving_data/, envs/, policies/ and agent/ may all
import; it imports none of them."""
