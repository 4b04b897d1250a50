"""Issue 22, items 1-2: report.html cannot be broken by its own data, and it opens offline.

* Every string from data, specs, run names or errors reaches report.html as text: a property test
  over the markdown escaping helper (``md_text``/``md_code``, rendered with nbconvert's own
  markdown renderer), and one real own-data study whose every user-controlled field (x, y, id,
  label names and values, strategy, run names, error messages, notes) carries markup markers,
  rendered once and parsed: no element or attribute came from the data, the markers read as text.
* report.html is self-contained: no ``src``/``href`` (or CSS ``url()``/``@import``) to a network
  address, and headless Chromium with the network blocked records no request when it opens it
  (skipped without Playwright or a system Chromium, as tests/test_lab_browser.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zfree_lab.report import report as R
from zfree_lab.report.labels_report import notes_markdown

CHROMIUM = os.environ.get("ZFREE_CHROMIUM", "/usr/bin/chromium")
EVIL = "evil"  # every planted tag, attribute and script carries it


class _Page(HTMLParser):
    """Every element (tag, attributes), script/style body and the text nodes of an HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements, self.text, self.scripts, self._in = [], [], [], None

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        self._in = tag if tag in ("script", "style") else None

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        (self.scripts if self._in in ("script", "style") else self.text).append(data)


def parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    p.close()
    return p


#: the report's own figures: PNG bytes in base64, whose random letters can spell "evil" by chance
#: (a fresh-clone run hit one); the planted markup cannot produce a PNG signature
_OWN_FIGURE = "data:image/png;base64,iVBORw0KGgo"


def planted(page: _Page) -> list:
    """Elements or attributes that can only have come from the planted markup."""
    def carries(v):
        return bool(v) and EVIL in v and not v.startswith(_OWN_FIGURE)

    bad = [(t, a) for t, a in page.elements
           if EVIL in t or any(EVIL in k or (carries(v) and k.startswith("on")) for k, v in a.items())
           or (t in ("script", "img", "iframe", "svg", "a", "b", "i") and any(carries(v) for v in a.values()))]
    return bad + [s for s in page.scripts if EVIL in s]


def visible(page: _Page) -> str:
    return " ".join("".join(page.text).split())


def shown(text: str) -> str:
    """What ``md_text`` promises to show for ``text``: whitespace runs as one space, characters HTML
    cannot carry as U+FFFD."""
    return "".join("\ufffd" if (ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) <= 0xDFFF) else c
                   for c in " ".join(text.split()))


MARKUP = ["<b data-evil=1>", "</b>", "<script>evil()</script>", "<img src=x onerror=evil()>", "*", "**", "_", "`",
          "```", "[a](javascript:evil())", "<", ">", "&", "&amp;", "&lt;", "#", "----", "\n", "|", "$", "$$", "\\",
          "<!--", "-->", "]]>", '"', "'", "- ", "1. ", "    ", "<http://evil.example>", "www.evil.example"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(MARKUP), st.text(max_size=8)), max_size=12).map("".join))
def test_md_text_renders_as_the_text_and_nothing_else(text):
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    for md, tags in [(R.md_text(text), {"p"}), (f"- {R.md_code(text)}: {R.md_text(text)}", {"ul", "li", "code"}),
                     *([(f"**{R.md_text(text)}**", {"p", "strong"})] if text.strip() else [])]:
        page = parse(markdown2html_mistune(md))
        assert {t for t, _ in page.elements} <= tags, (text, md)
        assert all(not a for _, a in page.elements), (text, md)
        assert shown(text).strip() in visible(page), (text, md)


def test_notes_and_errors_are_text_where_they_were_markup():
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    page = parse(markdown2html_mistune(notes_markdown(["labels ['style']: structure/<metric>/<label> computed"])))
    assert "structure/<metric>/<label> computed" in visible(page)
    err = R.errors_markdown([{"run_id": "r1", "error": "Traceback\n----\nValueError: <b>bad</b>"}])
    page = parse(markdown2html_mistune(err))
    assert {t for t, _ in page.elements} == {"ul", "li", "code"}  # no heading from ----, no <b>
    assert "---- ValueError: <b>bad</b>" in visible(page)


# ------------------------------------------------------------------------------- the real report


def _field(name: str) -> str:
    """A marker for one user-controlled field: a planted element, an attribute, a script, then
    arbitrary text and markup (``_noise``)."""
    return (f"<b data-evil-{name}=1>{name}</b><script>evil_{name}()</script><img src=x onerror=evil_{name}()>*{name}*"
            + _noise(name))


def _noise(name: str) -> str:
    """Arbitrary text and markup, the same for a name on every run: ``MARKUP`` fragments and
    random printable characters (the report's lines and table cells in one render)."""
    import random

    rng = random.Random(f"issue-22-{name}")
    alphabet = [chr(c) for c in range(33, 127)] + list("βé中😀\u00a0\u200b")
    return " " + "".join(rng.choice(MARKUP) if rng.random() < 0.4 else rng.choice(alphabet) for _ in range(24))


def _rows(n_x: int = 24, per_x: int = 4):
    words = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]
    style = f"st{_field('label')}yle".replace("/", "")  # a label name (no "/": the metric columns split on it)
    rows = []
    for i in range(n_x):
        a, b = words[i % 8], words[(i * 3 + 1) % 8]
        for j in range(per_x):
            value = f"{'short' if j % 2 == 0 else 'long'} {_field('value')}"
            rows.append({"id": f"r{i}-{j} {_field('id')}", "x": f"item[{i}] a[{a}] {_field('x')}",
                         "y": f"{a} then {b}. {_field('y')}" + " " * (j // 2),
                         "strategy": f"s{j % 2} {_field('strategy')}", "labels": {style: value}})
    return rows


@pytest.fixture(scope="module")
def evil_report(tmp_path_factory):
    """An own-data study (tiny GPT-2, the ``own_smoke`` preset's unaided run alone: one run, its
    control and the label's oracle, every kind of run folder the report reads) on rows whose every text field is
    markup, plus a run folder named with markup and a failed run whose error text is markup and a
    papermill-style traceback; rendered once (``zfree report``'s ``render_report``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.smoke_study import agg_backend
    from zfree_lab.run.bpe import train_bpe_tokenizer
    import dataclasses

    from zfree_lab.experiment.own_study import OWN_PRESETS, run_own_study
    from zfree_lab.experiment.render import render_report

    root = tmp_path_factory.mktemp("evil")
    rows = _rows()
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = train_bpe_tokenizer([r["x"] for r in rows] + [r["y"] for r in rows], vocab_size=400)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=512, n_layer=1, n_embd=32, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=3, pad_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    out = root / "study"
    os.environ.setdefault("ZFREE_CACHE_DIR", str(root / "cache"))
    with agg_backend():
        smoke = OWN_PRESETS["own_smoke"]
        one = dataclasses.replace(smoke, boundary=dataclasses.replace(smoke.boundary, aids=("none",)))
        run_own_study(str(root / "model"), root / "pairs.jsonl", out, preset=one, render=False, progress=False)
        every = sorted(p for p in (out / "runs").iterdir() if (p / "summary.json").exists())
        finished = [p for p in every if not p.name.startswith(("control_", "oracle-", "null-"))]
        assert len(finished) == 1, [p.name for p in (out / "runs").iterdir()]  # the run trained on the markup
        assert any(p.name.startswith("control_") for p in every)
        assert any(p.name.startswith("oracle-st-b-data") for p in every)  # the markup label's oracle, its name cleaned
        first = finished[0]
        run_name = "run <img src=x onerror=evil_run()><b data-evil-run=1>*run*"
        shutil.copytree(first, out / "runs" / run_name)
        failed = out / "runs" / "failed <i data-evil-failed=1>"
        failed.mkdir()
        error = ("Traceback (most recent call last)\n----\n# ValueError: <script>evil_error()</script>"
                 "<b data-evil-error=1>**bold**</b> [link](javascript:evil()) `tick" + _noise("error"))
        (failed / "error.json").write_text(json.dumps({"run_id": failed.name, "error": error}))
        notes = json.loads((out / "notes.json").read_text())
        notes["notes"].append(f"a note {_field('note')}")
        (out / "notes.json").write_text(json.dumps(notes))
        html = render_report(out).read_text()
    return out, html


@pytest.mark.timeout(900)
@pytest.mark.e2e  # the evil_report study: CI's test-e2e tier
def test_no_element_or_attribute_of_the_report_comes_from_data(evil_report):
    _, html = evil_report
    page = parse(html)
    assert planted(page) == []
    text = visible(page)
    for name in ("value", "x", "note"):  # the fields the report shows as text
        assert f"<b data-evil-{name}=1>{name}</b><script>evil_{name}()</script>" in text, name
    assert "st<b data-evil-label=1>label<b><script>evil_label()<script>" in text  # the label name, its "/" dropped
    assert "failed <i data-evil-failed=1>" in text  # a run name (the copied run's shows in figures only)
    assert "---- # ValueError: <script>evil_error()</script><b data-evil-error=1>**bold**</b>" in text  # an error
    assert "structure/<metric>/<label>" in text  # a plain note, no tag


#: an attribute, CSS url() or @import naming a network address (http, https or protocol-relative)
NETWORK = re.compile(r"""(?:\b(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//)"""
                     r"""|url\(\s*["']?\s*(?:https?:)?//|@import\s+(?:url\()?\s*["']?\s*(?:https?:)?//""", re.I)


@pytest.mark.e2e  # the evil_report study: CI's test-e2e tier
def test_report_names_no_network_resource(evil_report):
    _, html = evil_report
    assert NETWORK.findall(html) == []
    page = parse(html)
    assert [a for t, a in page.elements if t in ("script", "link", "img", "iframe") and
            re.match(r"\s*(https?:)?//", a.get("src") or a.get("href") or "")] == []
    assert "require.js" not in html and "MathJax" not in html and "β_eff" in html  # math as Unicode text


@pytest.mark.timeout(300)
@pytest.mark.e2e  # the evil_report study: CI's test-e2e tier
def test_report_opens_in_chromium_with_no_request_and_no_script_dialog(evil_report):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ZFREE_CHROMIUM)")
    out, _ = evil_report
    url = (out / "report.html").resolve().as_uri()
    requests, dialogs, errors = [], [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True)
            page = context.new_page()
            page.on("request", lambda r: r.url != url and not r.url.startswith("data:") and requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.goto(url, wait_until="load")
            page.wait_for_timeout(1500)
            assert page.locator("img").count() >= 3  # the figures, inline
            assert page.locator("table").count() >= 3
            if os.environ.get("ZFREE_SCREENSHOTS"):
                page.screenshot(path=str(Path(os.environ["ZFREE_SCREENSHOTS"]) / "report.png"), full_page=True)
        finally:
            browser.close()
    assert requests == [] and dialogs == [] and errors == [], (requests, dialogs, errors)


def test_a_missing_nbconvert_template_is_one_line_saying_the_runs_are_complete(tmp_path, monkeypatch):
    """An environment without nbconvert's data files (wheels installed with ``pip install --target``,
    as on a lent GPU machine): rendering stops in one line that says the runs and tables are complete
    and how to render again, instead of nbconvert's multi-line ValueError; other errors pass through."""
    import nbformat

    from zfree.core.errors import InputError
    from zfree_lab.experiment import render

    class Exporter:
        def __init__(self, message):
            self.message = message

        def from_notebook_node(self, nb):
            raise ValueError(self.message)
    missing = "No template sub-directory with name 'lab' found in the following paths:\n\t/a/share/jupyter\n\t/b"
    monkeypatch.setattr(render, "offline_exporter", lambda: Exporter(missing))
    with pytest.raises(InputError) as e:
        render.html_of(nbformat.v4.new_notebook(), tmp_path)
    line = str(e.value)
    assert "\n" not in line and line.startswith("report.html: nbconvert found no 'lab' template")
    assert f"the runs and tables in {tmp_path} are complete" in line and f"zfree report {tmp_path}" in line
    monkeypatch.setattr(render, "offline_exporter", lambda: Exporter("something else"))
    with pytest.raises(ValueError, match="something else"):
        render.html_of(nbformat.v4.new_notebook(), tmp_path)


def test_the_report_is_titled_with_the_study_not_notebook(tmp_path):
    """Issue 60: report.html's <title> was nbconvert's "Notebook". It names the study: the folder, or a
    sweep's spec name; a name with markup stays text."""
    import nbformat

    from zfree_lab.experiment import render

    def title(folder):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# report")])
        return re.findall(r"<title>(.*?)</title>", render.html_of(nb, folder), flags=re.S)

    study = tmp_path / "study-default"
    study.mkdir()
    assert title(study) == ["study-default · zfree report"]
    (study / "spec.json").write_text(json.dumps({"name": f"<b>{EVIL}</b>"}))
    assert title(study) == [f"&lt;b&gt;{EVIL}&lt;/b&gt; · zfree report"]
