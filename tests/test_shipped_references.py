"""Every shipped reference is re-derived by the current code, on every machine: a stored number that
nothing recomputes goes stale unseen. (The shipped E2E reference did: scored with ``<bos>`` before
``bos="auto"`` came to mean "what the tokenizer itself does", and the E2E tokenizer did not declare
the ``<bos>`` its model was trained with, so the code scored the same rows 0.04 nats/token worse and
every E2E run read step-0 rho_recon 1.0196.)

For each shipped base (synthetic and E2E): a sample of validation rows spread over all x is rescored
from the shipped model and compared with the stored per-example b and per-token surprisal at float32
tolerance; the stored token convention, hashes and c_base = mean b are checked; and the convention is
checked against lm-evaluation-harness's ``loglikelihood`` on the E2E base (the harness reads the
tokenizer's own ``add_special_tokens``, as zfree's ``bos="auto"`` does).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from zfree.core.io import sha256_file, sha256_state_dict
from zfree.data.pairs import load_pairs
from zfree_lab.run.split import spread_sample
from zfree.reference.reference import CONVENTION_KEYS, load_reference
from zfree.reference.scoring import load_scoring_model, score_pairs, tokenizer_sha256

ROOT = Path(__file__).resolve().parents[1]
#: base folder -> its validation data; every shipped base with a reference/ is listed (checked below)
SHIPPED = {"data/base/default": "data/synth/default/val.jsonl", "data/base/near-bayes": "data/synth/default/val.jsonl",
           "data/base/deep": "data/synth/default/val.jsonl", "data/base/deep-slot": "data/synth/default/val.jsonl",
           "data/e2e/base": "data/e2e/val.jsonl"}
SAMPLE_ROWS = 48  # spread over all x (``spread_sample``): ~1 s of scoring per base


def test_every_shipped_reference_is_listed():
    """Every reference.json tracked by git under data/ is re-derived here (a user's own bases trained
    into data/ are not tracked, so they do not count)."""
    try:
        out = subprocess.run(["git", "ls-files", "--", "data/*reference.json"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git clone: {e}")
    assert sorted(str(Path(f).parent.parent) for f in out.split()) == sorted(SHIPPED)


@pytest.fixture(scope="module", params=sorted(SHIPPED))
def shipped(request):
    base = ROOT / request.param
    model, tok = load_scoring_model(base / "model", device="cpu", dtype="float32")
    return base, ROOT / SHIPPED[request.param], load_reference(base), model, tok


def test_shipped_reference_records_what_it_was_computed_from(shipped):
    base, data_file, ref, model, tok = shipped
    assert ref.meta["data_sha256"] == sha256_file(data_file)
    assert ref.meta["model_sha256"] == sha256_state_dict(model.state_dict())
    assert ref.meta["tokenizer_sha256"] == tokenizer_sha256(tok)
    assert ref.meta["n_rows"] == len(load_pairs(data_file)) == len(ref.per_example)
    np.testing.assert_allclose(ref.c_base, ref.per_example["b"].mean(), rtol=1e-12)
    log = json.loads((base / "train_log.json").read_text())  # what was recorded when the base was trained
    if "c_base" in log:
        np.testing.assert_allclose(log["c_base"], ref.c_base, rtol=1e-12)
    else:  # the synthetic base's log records the ratio to the generator's analytic optimum
        np.testing.assert_allclose(log["c_base_analytic"], ref.meta["c_base_analytic"], rtol=1e-12)
        if log["config"].get("slot", "none") == "none":
            np.testing.assert_allclose(log["final_ratio"] * log["c_base_analytic"], ref.c_base, rtol=1e-6)


def test_a_slot_base_records_its_c_base_through_its_own_soft_token():
    """``data/base/deep-slot`` (``zfree base train --slot prefix``): its training log's final ratio is the base
    reading its own s_0 (the prefix route's step-0 layout), re-derived here over every validation row; its
    stored reference, the base reading (x, y), is far worse (the layout it was not trained on)."""
    from zfree.models.routes import initial_soft_token

    base = ROOT / "data/base/deep-slot"
    log = json.loads((base / "train_log.json").read_text())
    assert log["config"]["slot"] == "prefix"
    model, tok = load_scoring_model(base / "model", device="cpu", dtype="float32")
    pairs = load_pairs(ROOT / SHIPPED["data/base/deep-slot"])
    through = score_pairs(model, tok, pairs, cache=False, soft_token=initial_soft_token(model)).c_base
    np.testing.assert_allclose(log["final_ratio"] * log["c_base_analytic"], through, rtol=1e-5)
    assert through < 1.01 * log["c_base_analytic"] < load_reference(base).c_base


def test_shipped_reference_reproduces_from_its_model(shipped):
    """The current code scores a spread sample of the rows as the stored reference says: same token
    convention (bos, sep, end), b and per-token surprisal equal at float32 tolerance."""
    _, data_file, ref, model, tok = shipped
    pairs = spread_sample(load_pairs(data_file), SAMPLE_ROWS)
    res = score_pairs(model, tok, pairs, cache=False)
    assert {k: res.settings[k] for k in CONVENTION_KEYS} == {k: ref.meta["scoring"][k] for k in CONVENTION_KEYS}
    ids = [p.id for p in pairs]
    now = res.per_example.set_index("id").loc[ids]
    np.testing.assert_allclose(now["b"].to_numpy(), ref.b_of(ids), rtol=2e-5, atol=1e-6)
    stored_tokens = ref.surprisal_of(ids)
    pt = res.per_token.groupby("id", sort=False)["surprisal"].apply(np.asarray)
    for i, s in zip(ids, stored_tokens):
        np.testing.assert_allclose(pt[i], s, rtol=1e-4, atol=2e-5, err_msg=f"row {i}")


def test_e2e_convention_agrees_with_lm_eval_loglikelihood():
    """lm-evaluation-harness's HFLM (default settings: the tokenizer's own special tokens) scores y
    given ``x<sep>`` as zfree does: summed surprisal of the y tokens (zfree's end token aside, which
    the harness does not score) equal within float32 rounding. Both put the ``<bos>`` the E2E
    tokenizer declares in front; without it the same rows score worse (the model was trained with it)."""
    lm_eval_hf = pytest.importorskip("lm_eval.models.huggingface")
    from lm_eval.api.instance import Instance

    base = ROOT / "data/e2e/base"
    model, tok = load_scoring_model(base / "model", device="cpu", dtype="float32")
    pairs = spread_sample(load_pairs(ROOT / SHIPPED["data/e2e/base"]), 12)
    res = score_pairs(model, tok, pairs, cache=False)
    assert res.settings["bos_id"] == tok.bos_token_id == 1
    pt = res.per_token.merge(res.per_example[["id", "n_tokens"]], on="id")
    ours = pt[pt["position"] < pt["n_tokens"] - 1].groupby("id", sort=False)["surprisal"].sum()
    lm = lm_eval_hf.HFLM(pretrained=str(base / "model"), backend="causal", device="cpu", dtype="float32", batch_size=1)
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(p.x + tok.sep_token, p.y), idx=i)
            for i, p in enumerate(pairs)]
    theirs = np.array([-ll for ll, _ in lm.loglikelihood(reqs, disable_tqdm=True)])
    np.testing.assert_allclose(ours.loc[[p.id for p in pairs]].to_numpy(), theirs, rtol=1e-5, atol=1e-4)
    no_bos = score_pairs(model, tok, pairs, cache=False, policy=_policy(bos="never"))
    assert no_bos.c_base > res.c_base + 0.01  # the convention matters for this model: with <bos> is how it was trained


def _policy(**kw):
    from zfree.reference.scoring import ScoringPolicy

    return ScoringPolicy(**kw)
