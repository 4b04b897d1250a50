"""The core layer (bottom): files, folder locks, paths, expected errors, typed values and field checks; no zfree import above it."""
