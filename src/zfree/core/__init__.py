"""The core layer (bottom): files, paths, expected errors, typed values and field checks, the weighting, β-schedule and free-bits registries; no zfree import above it."""
