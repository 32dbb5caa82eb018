"""Action vocabularies shared by the policy, the CLIs and their configs; torch-free so that a config can check
its arguments before anything heavy is imported."""

DISCRETE_ACTIONS = ("noop", "right", "left", "gas", "brake")  # CarRacing's discrete action ids 0..4

# How a discrete student picks its action from the logits. argmax: the likeliest. sample: drawn from the softmax --
# the discrete CarRacing expert pulses gas and steering within a fraction of a second, and in a state that does not
# show which pulse comes next argmax takes the commoner one, gas, every time (measured: docs/results.md, issue 23).
DISCRETE_ACTION_RULES = ("argmax", "sample")
