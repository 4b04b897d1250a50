"""How strongly each derived property of y aligns with the posterior (``zfree_lab.run.latent_meaning``,
item 2), against a permutation null, and whether the posterior itself (not only its argmax) carries it.

A property's mutual information with the posterior argmax (nats; NMI with arithmetic normalisation as
scikit-learn's ``normalized_mutual_info_score``) is compared with ``N_PERMUTATIONS`` shuffles of the
argmax: p = (1 + #{null >= MI}) / (1 + n) (Phipson & Smyth 2010, "Permutation p-values should never be zero"), and a property passes when
p < ``ALPHA`` / (number of properties) (Bonferroni) and its MI under the soft assignment q
(``posterior_mi``, bounded by I(x, y; z), so by the rate) is at least max(``POSTERIOR_SHARE`` x the
argmax's MI, ``MIN_POSTERIOR_MI``). Per value (``per_value_alignment``): the same test of the indicator
[argmax = k] at ``ALPHA`` / (properties x values).

**Beyond x** (docs/concepts/readouts.md). Given strata (``groups``: the rows' x, or the router's
argmax), the argmax is shuffled only within them (``permute_within_groups``): H0 "given x, the argmax
is independent of the property", a stratified permutation test, exact under H0. An argmax that follows
x alone then passes nothing. A row alone in its stratum adds nothing to the null; with no stratum of
two rows nothing is tested (p NaN, a note says so): with every x distinct no test can tell z carrying
y beyond x from z following x (Shah & Peters 2020, "The hardness of conditional independence
testing and the generalised covariance measure"). MI and NMI stay those of all rows.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: shuffles of the posterior argmax in the permutation null
N_PERMUTATIONS = 1000
#: family-wise level of the permutation test (Bonferroni over the properties tested)
ALPHA = 0.05
#: a property passes only when the posterior's soft assignment carries at least this share of the
#: argmax's mutual information with it, and at least ``MIN_POSTERIOR_MI`` nats (``property_alignment``)
POSTERIOR_SHARE = 0.1
MIN_POSTERIOR_MI = 1e-3


def _mi_from_counts(c: np.ndarray) -> np.ndarray:
    """Mutual information (nats) of joint counts (..., A, B)."""
    n = c.sum((-1, -2), keepdims=True)
    p = c / n
    pa, pb = p.sum(-1, keepdims=True), p.sum(-2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * np.log(p / (pa * pb)), 0.0)
    return t.sum((-1, -2))


def posterior_mi(codes: np.ndarray, q: np.ndarray) -> float:
    """I(b; z) in nats under the posterior's own soft assignment: the joint p(b, k) = (1/N) sum_i
    [b_i = b] q(z = k | x_i, y_i) of a property's level codes ``codes`` ((N,) ints) and ``q`` ((N, K)
    probabilities, rows summing to 1). What z carries about b: at most I(x, y; z) under q, so about 0
    for a posterior that barely moves from row to row, whatever its argmax does (module docstring)."""
    codes = np.asarray(codes)
    joint = np.zeros((int(codes.max()) + 1, q.shape[1]))
    np.add.at(joint, codes, np.asarray(q, float))
    return float(max(_mi_from_counts(joint[None])[0], 0.0))


def permute_within_groups(codes: np.ndarray, groups: np.ndarray, n_perm: int, rng: np.random.Generator
                          ) -> np.ndarray:
    """``n_perm`` independent uniform shuffles of ``codes`` ((N,)) among rows of equal ``groups``
    ((N,) hashable: the rows' x), as an (n_perm, N) array: each row of it holds, within every group,
    a uniformly drawn permutation of that group's codes (rows sorted by (group, uniform key),
    ``numpy.lexsort``); a group of one row keeps its code. Raises ValueError when the lengths differ."""
    codes, gid = np.asarray(codes), pd.factorize(np.asarray(groups, dtype=object))[0]
    if len(gid) != len(codes):
        raise ValueError(f"{len(codes)} codes but {len(gid)} group labels")
    keys = rng.random((n_perm, len(codes)))
    drawn = np.lexsort((keys, np.broadcast_to(gid, keys.shape)), axis=-1)  # (n_perm, N): rows by group, random within
    out = np.empty((n_perm, len(codes)), dtype=codes.dtype)
    out[:, np.argsort(gid, kind="stable")] = codes[drawn]  # the group's slots, in order, take its drawn rows' codes
    return out


def property_alignment(props: pd.DataFrame, assign: np.ndarray, *, n_perm: int = N_PERMUTATIONS, seed: int = 0,
                       alpha: float = ALPHA, q: np.ndarray | None = None, groups: np.ndarray | None = None
                       ) -> tuple[pd.DataFrame, list[str]]:
    """Each property's mutual information with ``assign`` (the posterior argmax, (N,) ints) against the
    permutation null (module docstring). Returns (table sorted by MI, notes): columns property,
    levels, mi (nats), nmi, null95 (the null's 95th percentile, nats), p_value, mi_posterior
    (``posterior_mi`` under ``q`` (N, K), NaN without it), passes.

    ``groups`` ((N,) hashable): shuffle within equal groups, with a note on the rows that can move;
    None: across all rows. With ``q`` a property passes only when mi_posterior >= max(``POSTERIOR_SHARE``
    x mi, ``MIN_POSTERIOR_MI``): a near-uniform posterior's argmax can follow y while z carries nothing.
    Properties with one level are skipped with a note; fewer than 2 rows: an empty table and a note.
    Raises ValueError when ``props``, ``assign``, ``q`` and ``groups`` differ in length."""
    assign = np.asarray(assign)
    if len(props) != len(assign) or (q is not None and len(q) != len(assign)) or (
            groups is not None and len(groups) != len(assign)):
        raise ValueError(f"{len(props)} property rows but {len(assign)} posterior assignments"
                         + ("" if q is None else f" and {len(q)} posterior rows")
                         + ("" if groups is None else f" and {len(groups)} x"))
    if len(assign) < 2:
        return pd.DataFrame(columns=_COLUMNS), [f"{len(assign)} evaluated row(s): no property is tested"]
    levels, tables, notes = _count_tables(props, assign, n_perm, seed, groups)
    testable = _testable_rows(groups, len(assign))
    if groups is not None:
        notes.insert(0, _groups_note(groups, testable))
    return _ranked(tables, None, alpha, q, notes, tested=testable > 0)


def _testable_rows(groups: np.ndarray | None, n: int) -> int:
    """Rows a shuffle can move: all ``n`` without groups, else the rows of groups of two or more."""
    if groups is None:
        return n
    sizes = pd.Series(pd.factorize(np.asarray(groups, dtype=object))[0]).value_counts()
    return int(sizes[sizes >= 2].sum())


def _groups_note(groups: np.ndarray, testable: int) -> str:
    """The note of a test within groups of equal x: how many rows could move, or that none could."""
    n = len(groups)
    shared = int(pd.Series(pd.factorize(np.asarray(groups, dtype=object))[0]).value_counts().ge(2).sum())
    if not testable:
        return (f"could not test what z carries beyond x: no x has 2 or more of the {n} rows (the argmax is shuffled "
                "only among rows of equal x), so no property is tested and none passes")
    return (f"the argmax is shuffled only among rows of equal x (what z carries beyond x): {testable} of the {n} rows "
            f"share their x with another row ({shared} x); the other rows add nothing to the null")


#: the columns of a property table (``property_alignment``)
_COLUMNS = ["property", "levels", "mi", "nmi", "null95", "p_value", "mi_posterior", "passes"]


def _count_tables(props: pd.DataFrame, assign: np.ndarray, n_perm: int, seed: int, groups: np.ndarray | None = None):
    """(the values of ``assign`` in code order, per property with 2+ levels: (name, level codes b (N,),
    the joint counts (A, B) of (assign, b), the same counts under each of ``n_perm`` shuffles of
    assign (n_perm, A, B)), the notes of the skipped properties). One set of shuffles serves every
    property and, collapsed to [assign = k], every value (``per_value_alignment``). ``groups``: shuffle
    within groups of equal x (``permute_within_groups``); None: across all rows."""
    codes, levels = pd.factorize(assign)
    rng = np.random.default_rng(seed)
    perms = (rng.permuted(np.tile(codes, (n_perm, 1)), axis=1) if groups is None  # (n_perm, N)
             else permute_within_groups(codes, groups, n_perm, rng))
    ka = len(levels)
    kept = [c for c in props.columns if props[c].nunique() >= 2]
    notes = [f"property {c!r} has a single value on these rows: skipped" for c in props.columns if c not in kept]
    tables = []
    for c in kept:
        b = pd.factorize(props[c].astype(str))[0]
        kb = int(b.max()) + 1
        obs = np.bincount(codes * kb + b, minlength=ka * kb).reshape(ka, kb).astype(float)
        flat = (np.arange(n_perm)[:, None] * ka * kb + perms * kb + b[None, :]).ravel()
        null = np.bincount(flat, minlength=n_perm * ka * kb).reshape(n_perm, ka, kb).astype(float)
        tables.append((c, b, obs, null))
    return np.asarray(levels), tables, notes


def _entropy_of_counts(c: np.ndarray) -> float:
    p = c[c > 0] / c.sum()
    return float(-(p * np.log(p)).sum())


def _ranked(tables, value_index: int | None, alpha: float, q: np.ndarray | None, notes: list[str],
            tested: bool = True):
    """The property table of ``_count_tables``' tables: of the assignment itself (``value_index``
    None), or of the indicator [assign = the value at ``value_index``] (its rows collapsed to
    "others" and "it"); ``q``: the matching soft assignment ((N, A) or (N, 2)), or None. ``tested``
    False (no row could be shuffled): p_value and null95 NaN and nothing passes."""
    rows = []
    for c, b, obs, null in tables:
        if value_index is not None:
            obs = np.stack([obs.sum(0) - obs[value_index], obs[value_index]])
            null = np.stack([null.sum(1) - null[:, value_index], null[:, value_index]], axis=1)
        mi = float(_mi_from_counts(obs[None])[0])
        nulls = _mi_from_counts(null)
        h = _entropy_of_counts(obs.sum(1)) + _entropy_of_counts(obs.sum(0))
        rows.append({"property": c, "levels": obs.shape[1], "mi": max(mi, 0.0), "nmi": 2 * mi / h if h > 0 else 0.0,
                     "null95": float(np.quantile(nulls, 0.95)) if tested else math.nan,
                     "p_value": float((1 + np.sum(nulls >= mi - 1e-12)) / (1 + len(nulls))) if tested else math.nan,
                     "mi_posterior": math.nan if q is None else posterior_mi(b, q)})
    tab = pd.DataFrame(rows, columns=_COLUMNS[:-1])
    tab["passes"] = (tab["p_value"] < alpha / max(len(tables), 1)) & (tab["mi"] > 1e-12)  # NaN p: False
    if q is not None and len(tab):
        carried = tab["mi_posterior"] >= np.maximum(POSTERIOR_SHARE * tab["mi"], MIN_POSTERIOR_MI)
        dropped = tab["passes"] & ~carried
        if dropped.any():
            notes.append(f"{int(dropped.sum())} propert{'y' if dropped.sum() == 1 else 'ies'} aligned with the "
                         f"argmax but not with the posterior itself (mi_posterior below "
                         f"max({POSTERIOR_SHARE:g} x mi, {MIN_POSTERIOR_MI:g} nats)): not passed, z carries too "
                         f"little ({', '.join(repr(p) for p in tab.loc[dropped, 'property'])})")
        tab["passes"] &= carried
    return tab.sort_values("mi", ascending=False, ignore_index=True), notes


def per_value_alignment(props: pd.DataFrame, assign: np.ndarray, K: int, *, n_perm: int = N_PERMUTATIONS,
                        seed: int = 0, q: np.ndarray | None = None, groups: np.ndarray | None = None
                        ) -> dict[int, pd.DataFrame]:
    """value k -> ``property_alignment`` table of the indicator [argmax = k], for each value with rows,
    at level ``ALPHA`` / (values with rows) (Bonferroni over properties and values); with ``q`` (N, K)
    the soft indicator (1 - q_k, q_k) must carry it. One set of shuffles serves every value."""
    assign = np.asarray(assign)
    if len(assign) < 2:
        return {}
    levels, tables, _ = _count_tables(props, assign, n_perm, seed, groups)
    tested = _testable_rows(groups, len(assign)) > 0
    present = [k for k in range(K) if (levels == k).any()]
    return {k: _ranked(tables, int(np.flatnonzero(levels == k)[0]), ALPHA / max(1, len(present)),
                       None if q is None else np.stack([1 - q[:, k], q[:, k]], axis=1), [], tested)[0]
            for k in present}
