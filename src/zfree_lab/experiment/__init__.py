"""The experiment layer: runs tables and summaries, sweeps on executors, the study presets, own-model studies."""
