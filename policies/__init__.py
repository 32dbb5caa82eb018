"""Policies: the NAC layer, NCP wiring, encoders, sequence cores and the driving policy. Knows nothing of gymnasium."""
