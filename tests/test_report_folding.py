"""Sections of report.html with nothing to show are folded into one closing list
(``zfree_lab.experiment.folding``): a smoke study's report was about 12,600 px tall, six of its sections only
saying they were empty. The folding reads the mark ``nothing_to_show`` puts on an output, through a real kernel
as papermill runs it (``test_the_mark_survives_a_real_kernel``)."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from zfree_lab.experiment.folding import FOLD, FOLDED_HEADING, fold_empty_sections


def _md(text: str, marked: bool = False):
    return new_output("display_data", data={"text/markdown": text, "text/plain": "<Markdown>"},
                      metadata={FOLD: True} if marked else {})


PNG = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})


def _report():
    cells = [new_markdown_cell("# Report\n\nintro"), new_code_cell(outputs=[_md("real content")]),
             new_markdown_cell("## Empty A\n\nwhat A would show"), new_code_cell(outputs=[_md("No A.", True), _md("")]),
             new_markdown_cell("## Kept B"), new_code_cell(outputs=[_md("B's panel: left out.", True), PNG]),
             new_markdown_cell("# Part two"), new_code_cell(), new_code_cell(outputs=[_md("No aided runs.", True)]),
             new_markdown_cell("## Sub C"), new_code_cell(outputs=[_md("No C.", True)]),
             new_markdown_cell("## Sub D"), new_code_cell(outputs=[PNG]),
             new_markdown_cell("# Part three"), new_code_cell(outputs=[_md("No three.", True)]),
             new_markdown_cell("## Sub E"), new_code_cell(outputs=[_md("No E.", True)]),
             new_markdown_cell("## Sub F"), new_code_cell(outputs=[]),
             new_markdown_cell("# Closing"), new_code_cell(outputs=[_md("No run failed.")])]
    return new_notebook(cells=cells)


def _headings(nb) -> list[str]:
    return [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown"]


def test_sections_showing_only_marked_lines_fold_into_one_closing_list():
    nb = _report()
    before = nbformat.writes(nb)
    out = fold_empty_sections(nb)
    assert nbformat.writes(nb) == before  # report.ipynb keeps every cell as executed
    # A and C fold; B (a figure beside its mark) and Part two (Sub D shows a figure) stay, Part two with its own
    # line; Part three folds with its subsections (F showed nothing at all); an unmarked line is content
    assert _headings(out) == ["# Report", "## Kept B", "# Part two", "## Sub D", "# Closing", f"## {FOLDED_HEADING}"]
    closing = out.cells[-1].source.splitlines()
    assert closing[2:] == ["- **Empty A**: No A.", "- **Sub C**: No C.", "- **Part three**: No three.",
                           "- **Sub E**: No E."]
    texts = ["".join(o["data"].get("text/markdown", "")) for c in out.cells if c.cell_type == "code"
             for o in c.outputs if "text/markdown" in o["data"]]
    assert "" not in texts and "No aided runs." in texts and "B's panel: left out." in texts  # blanks removed
    assert "No run failed." in texts


def test_a_left_out_line_does_not_repeat_its_sections_name_in_the_list():
    from zfree_lab.report.gains_report import left_out

    nb = new_notebook(cells=[new_markdown_cell("# R"), new_code_cell(outputs=[PNG]),
                             new_markdown_cell("## The phase boundary: measured against predicted"),
                             new_code_cell(outputs=[_md(left_out("The phase boundary", "no generator truth"), True)])])
    assert fold_empty_sections(nb).cells[-1].source.splitlines()[-1] == (
        "- **The phase boundary: measured against predicted**: *left out — no generator truth.*")


def test_a_report_with_nothing_to_fold_gets_no_closing_list():
    nb = new_notebook(cells=[new_markdown_cell("# R"), new_code_cell(outputs=[PNG]), new_markdown_cell("## S"),
                             new_code_cell(outputs=[_md("content")])])
    out = fold_empty_sections(nb)
    assert _headings(out) == ["# R", "## S"] and len(out.cells) == 4


def test_the_mark_survives_a_real_kernel(tmp_path):
    """``nothing_to_show`` in a notebook executed as the report is (nbclient, one python3 kernel): its output
    carries the mark and its section folds."""
    from nbclient import NotebookClient

    nb = new_notebook(cells=[new_markdown_cell("# R"), new_code_cell("print('shown')"),
                             new_markdown_cell("## Empty"),
                             new_code_cell("from zfree_lab.experiment.folding import nothing_to_show\n"
                                           "nothing_to_show('No aided runs here.')")],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    (mark,) = nb.cells[3].outputs
    assert mark["metadata"][FOLD] is True and "No aided runs here." in mark["data"]["text/markdown"]
    out = fold_empty_sections(nb)
    assert _headings(out) == ["# R", f"## {FOLDED_HEADING}"]
    assert out.cells[-1].source.endswith("- **Empty**: No aided runs here.")


def _head_rows(html: str) -> list[list[str]]:
    import re

    head = re.search(r"<thead>(.*?)</thead>", html, re.S).group(1)
    return [re.findall(r"<th[^>]*>(.*?)</th>", row, re.S) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", head, re.S)]


def test_a_named_index_moves_into_the_headers_empty_corner():
    """pandas writes a named index as a second header row (its name over empty cells): a stray row in every
    report table. One row, the names in the corner; the body is byte-identical; other shapes are left alone."""
    import re

    import pandas as pd

    from zfree_lab.experiment.folding import one_header_row

    df = pd.DataFrame({"rate": [0.1, 0.2], "use": [1, 0]}, index=pd.Index(["r1", "r2"], name="run"))
    for table, want in [(df, ["run", "rate", "use"]), (df.set_index("use", append=True), ["run", "use", "rate"])]:
        html = table._repr_html_()
        assert len(_head_rows(html)) == 2
        out = one_header_row(html)
        assert _head_rows(out) == [want]
        assert out.split("</thead>")[1] == html.split("</thead>")[1]
    styled = df.set_index("use", append=True).style.format("{:.1f}")._repr_html_()  # samples_view's kind of table
    out = one_header_row(styled)
    assert [[re.sub(r"<[^>]+>", "", c) for c in row] for row in _head_rows(out)] == [["run", "use", "rate"]]
    assert 'class="index_name level0"' in out and out.split("</thead>")[1] == styled.split("</thead>")[1]
    two_levels = df.groupby(level="run").agg(["min", "max"])  # columns of two levels: their upper row stays
    assert len(_head_rows(two_levels._repr_html_())) == 3
    assert _head_rows(one_header_row(two_levels._repr_html_())) == [["", "rate", "use"],
                                                                     ["run", "min", "max", "min", "max"]]
    unchanged = [df.reset_index(), df.rename_axis(columns="quantity"),
                 df.reset_index().style.format("{:.1f}", subset=["rate"])]
    for table in unchanged:
        html = table._repr_html_() if hasattr(table, "_repr_html_") else table.to_html()
        assert one_header_row(html) == html
    nb = new_notebook(cells=[new_markdown_cell("# R"), new_code_cell(outputs=[
        new_output("display_data", data={"text/html": df._repr_html_(), "text/plain": "df"})])])
    assert _head_rows(fold_empty_sections(nb).cells[1].outputs[0]["data"]["text/html"]) == [["run", "rate", "use"]]
