"""The dataset format, below envs/ and agent/: episodes on disk and the dataset card (dataset.py), camera frames as
JPEG buffers and lazy frame files (frames.py), and the Udacity simulator's recordings, read and checked
(udacity_log.py) and imported as datasets (udacity_import.py). It imports only common/: it stores env names and plain
values, and the layers above resolve them (envs.registry.dataset_env)."""
