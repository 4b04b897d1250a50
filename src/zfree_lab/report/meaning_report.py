"""The report's "What z learned" part: a run's ``latent_meaning.json`` (``zfree_lab.run.latent_meaning``)
as one descriptive sentence per latent value, the properties ranked against their permutation
baseline, and each value's most promoted tokens and phrases. Every string from data goes through
``md_text`` (it renders as text, never as markup); DataFrames are escaped by pandas' HTML writer."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zfree.core.io import read_json_object
from zfree_lab.run.run_config import MEANING_FILE
from zfree_lab.report.report import md_text


def read_meaning(run_dir: Path | str) -> dict | None:
    """The run's latent_meaning.json as a dict; None when the run wrote none (a z-free control, an
    oracle, a run from before the file existed) or the file cannot be parsed."""
    p = Path(run_dir) / MEANING_FILE
    doc = read_json_object(p)
    return doc if doc is not None and isinstance(doc.get("values"), list) else None


def meaning_markdown(doc: dict) -> str:
    """The sentences, one bullet per value with rows (the values with none named on one line), under the
    rule they were tested by; marked descriptive."""
    lines = [f"*Descriptive, on {doc.get('rows', '?')} evaluated rows, values = the {md_text(doc.get('source', ''))}; "
             f"{md_text(doc.get('rule', ''))}. A property that passes describes a value; it is not shown to cause it.*",
             ""]
    passing = [p for p in doc.get("properties", []) if p.get("passes")]
    if not passing:
        lines += ["No derived property of y passes its permutation baseline with the posterior itself carrying it: "
                  "nothing here says what z carries.", ""]
    unused = [v["value"] for v in doc["values"] if v.get("share") == 0]  # no row: no sentence to tell
    lines += [f"- {md_text(v.get('sentence', ''))}" for v in doc["values"] if v.get("share") != 0]
    if unused:
        lines.append(f"- value{'s' * (len(unused) > 1)} {', '.join(str(int(k)) for k in unused)}: no evaluated row "
                     f"(the {md_text(doc.get('source', 'assignment'))} never picks {'them' if len(unused) > 1 else 'it'})")
    lines += [f"- note: {md_text(n)}" for n in doc.get("notes", [])]
    return "\n".join(lines)


def property_table(doc: dict, digits: int = 3) -> pd.DataFrame:
    """The properties ranked by mutual information with the values: MI and the permutation null's
    95th percentile (nats), NMI, p-value, the MI under the posterior's soft assignment (nats; NaN in
    a file written before it was recorded), passes."""
    tab = pd.DataFrame(doc.get("properties", []), columns=["property", "levels", "mi", "null95", "nmi", "p_value",
                                                              "mi_posterior", "passes"])
    return tab.rename(columns={"mi": "MI (nats)", "null95": "null 95 % (nats)", "nmi": "NMI", "p_value": "p",
                               "mi_posterior": "MI under q (nats)"}
                      ).round(digits).set_index("property")


def promoted(gram: dict, digits: int = 2) -> bool:
    """Whether a token or phrase (a ``tokens``/``phrases`` entry) is promoted as the table shows it: its
    mean lift above 0 once rounded to ``digits`` decimals (a collapsed run's lifts of 0.0004 and -0.001
    read 0.0: the value changes nothing there)."""
    return round(gram["mean_lift"], digits) > 0


def promoted_table(doc: dict, digits: int = 2) -> pd.DataFrame:
    """Each value's most promoted tokens and phrases (mean lift over the other values, nats; count),
    indexed by value and kind: only those ``promoted`` at ``digits`` decimals (``unpromoted_markdown``
    names the values left with none)."""
    rows = []
    for v in doc["values"]:
        for kind in ("tokens", "phrases"):
            for g in v.get(kind, []):
                if promoted(g, digits):
                    rows.append({"value": v["value"], "kind": kind[:-1], "text": repr(g["text"]),
                                 "mean lift (nats)": round(g["mean_lift"], digits), "count": g["count"],
                                 "rows": g["rows"]})
    return pd.DataFrame(rows, columns=["value", "kind", "text", "mean lift (nats)", "count", "rows"]
                        ).set_index(["value", "kind"])


def unpromoted_markdown(doc: dict, digits: int = 2) -> str:
    """In words, the values that promote no token or phrase (none ``promoted`` at ``digits`` decimals,
    so none in ``promoted_table``): one line, or "" when every value promotes one."""
    left = [v["value"] for v in doc["values"]
            if not any(promoted(g, digits) for kind in ("tokens", "phrases") for g in v.get(kind, []))]
    why = f"none has a mean lift above {0:.{digits}f} nats"
    if not left:
        return ""
    if len(left) == len(doc["values"]):
        return f"*No value promotes a token or phrase over the other values: {why}.*"
    return (f"*Value{'s' * (len(left) > 1)} {md_text(', '.join(map(str, left)))} promote{'s' * (len(left) == 1)} "
            f"no token or phrase over the other values: {why}.*")


def show_meaning(run_dir: Path | str, title: str) -> bool:
    """Display the run's "What z learned" part in a notebook (heading ``title``, already markdown-safe):
    the sentences, the property table and the promoted tokens (the values that promote none named in
    words: ``unpromoted_markdown``; no table where no value promotes any). False (nothing shown) without a
    latent_meaning.json."""
    from IPython.display import Markdown, display

    doc = read_meaning(run_dir)
    if doc is None:
        return False
    display(Markdown(f"### {title}\n\n" + meaning_markdown(doc)))
    display(property_table(doc))
    if unpromoted_markdown(doc):
        display(Markdown(unpromoted_markdown(doc)))
    table = promoted_table(doc)
    if len(table):
        with pd.option_context("display.max_colwidth", None):  # pandas cuts cells at 50 characters
            display(table)
    return True
