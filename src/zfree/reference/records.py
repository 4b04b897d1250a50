"""Names a stored prefix reference is found and matched by, without torch (``zfree_lab.experiment.results``
reads a study's tables with them; ``zfree.reference.prefix`` scores and writes the reference)."""

from __future__ import annotations

#: a run folder's prefix references, one folder per split (``zfree.reference.prefix``)
PREFIX_REFERENCE_DIR = "prefix_reference"
#: what a stored prefix reference must record to be read back instead of rescored
MATCH_KEYS = ("route", "model_sha256", "tokenizer_sha256", "rows_sha256", "soft_token_sha256", "scorer_version",
              "policy", "max_length", "dtype")
