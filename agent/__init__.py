"""The glue between envs and policies: the PPO expert, demonstrations, behaviour cloning, closed-loop driving."""
