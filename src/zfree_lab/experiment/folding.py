"""Sections of report.html with nothing to show, folded into one list at its end.

A report section that a study cannot fill (no aided runs, no generator truth, fewer than three β values)
says so in one line, written with ``nothing_to_show``: the line's output carries the ``FOLD`` mark. When
report.html is rendered (``zfree_lab.experiment.render.html_of``), ``fold_empty_sections`` removes every
section (a heading and the cells up to the next heading of its level or above) whose cells show nothing but
such lines, and lists those sections with their reasons in one closing section (a smoke study's report, about
12,600 px tall, had four sections that only said they were empty). Outputs of empty Markdown (a
``dropped_markdown`` with nothing dropped) are removed everywhere, and a table's index names move from their own
header row into the empty corner of the row above (``one_header_row``). report.ipynb keeps every cell as executed.
Light: no torch, pandas or nbformat at import.
"""

from __future__ import annotations

import copy
import re

#: the key, in a display output's metadata, of a line that says its section has nothing to show
FOLD = "zfree_nothing_to_show"
#: the closing section's heading
FOLDED_HEADING = "Sections with nothing to show in this study"


def nothing_to_show(markdown: str) -> None:
    """Display ``markdown``, the one line that says why a section is empty, marked ``FOLD`` (in a notebook
    run by hand it shows as any Markdown; report.html folds the section into its closing list)."""
    from IPython.display import Markdown, display  # lazy: only a kernel displays

    display(Markdown(markdown), metadata={FOLD: True})


def _markdown_text(output) -> str | None:
    """The Markdown text of a display output that shows only Markdown (a string), else None."""
    data = output.get("data", {}) if output.get("output_type") in ("display_data", "execute_result") else {}
    if "text/markdown" not in data or set(data) - {"text/markdown", "text/plain"}:
        return None
    text = data["text/markdown"]
    return "".join(text) if isinstance(text, list) else text


def _is_blank(output) -> bool:
    text = _markdown_text(output)
    return text is not None and not text.strip()


def _is_marked(output) -> bool:
    return bool(output.get("metadata", {}).get(FOLD)) and _markdown_text(output) is not None


def _heading(cell) -> tuple[int, str] | None:
    """``(level, title)`` of a Markdown cell that opens with a heading line, else None."""
    if cell.get("cell_type") != "markdown":
        return None
    lines = [line for line in "".join(cell.get("source", "")).splitlines() if line.strip()]
    if not lines or not lines[0].startswith("#"):
        return None
    mark = lines[0].split(" ", 1)[0]
    return (len(mark), lines[0][len(mark):].strip()) if set(mark) == {"#"} else None


def _section_end(cells, start: int, level: int) -> int:
    for j in range(start + 1, len(cells)):
        head = _heading(cells[j])
        if head is not None and head[0] <= level:
            return j
    return len(cells)


def _shows_only_marks(cells) -> bool:
    """Whether the code cells of ``cells`` show nothing but marked lines, at least one."""
    outputs = [o for cell in cells if cell.get("cell_type") == "code" for o in cell.get("outputs", [])]
    return bool(outputs) and all(_is_marked(o) for o in outputs)


def _marks_by_heading(cells) -> list[tuple[str, list[str]]]:
    """The marked lines of a folded range, grouped under the heading (or subheading) they sit in."""
    groups: list[tuple[str, list[str]]] = []
    for cell in cells:
        head = _heading(cell)
        if head is not None:
            groups.append((head[1], []))
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            groups[-1][1].append(_markdown_text(output).strip())
    return [(title, marks) for title, marks in groups if marks]


#: ``zfree_lab.report.gains_report.left_out``'s line, "*Section: left out — why.*": under its section's title in
#: the closing list, the section's name is not repeated
_LEFT_OUT = re.compile(r"^\*(.+?): left out — (.*)\*$", re.S)
_SHORT = r"*left out — \2*"
_THEAD = re.compile(r"<thead>(.*?)</thead>", re.S)
_ROW = re.compile(r"(<tr[^>]*>)(.*?)</tr>", re.S)  # (opening tag, cells)
_CELL = re.compile(r"<th([^>]*)>(.*?)</th>", re.S)


def _blank(text: str) -> bool:
    return not text.replace("&nbsp;", "").strip()


def _merged_head(match: re.Match) -> str:
    rows = list(_ROW.finditer(match.group(1)))
    if len(rows) < 2:
        return match.group(0)
    above, names = list(_CELL.finditer(rows[-2].group(2))), list(_CELL.finditer(rows[-1].group(2)))
    k = next((i for i, c in enumerate(names) if _blank(c.group(2))), len(names))
    corners = [c for row in rows[:-1] for c in list(_CELL.finditer(row.group(2)))[:k]]
    if (not k or len(above) != len(names) or any("span" in c.group(1) for c in above + names + corners)
            or not all(_blank(c.group(2)) for c in corners + names[k:])):
        return match.group(0)
    cells = [c.group(0) for c in names[:k] + above[k:]]
    merged = rows[-2].group(1) + "".join(f"\n      {c}" for c in cells) + "\n    </tr>"
    return ("<thead>\n    " + "\n    ".join([r.group(0) for r in rows[:-2]] + [merged]) + "\n  </thead>")


def one_header_row(html: str) -> str:
    """``html`` with each pandas table whose last header row holds only the index's names (over empty cells)
    given one header row less: the names go into the empty corner cells of the row above (a DataFrame's and a
    Styler's, each cell keeping its attributes; columns of several levels keep their upper rows). A named
    corner (``columns.name``), a spanning corner cell or any other shape is left as is."""
    return _THEAD.sub(_merged_head, html)


def fold_empty_sections(nb):
    """A copy of the executed notebook ``nb`` (nbformat) without its blank Markdown outputs, its tables'
    headers in one row (``one_header_row``), and without the
    sections that show only ``nothing_to_show`` lines; those sections' titles and lines are listed in one
    closing Markdown cell (``FOLDED_HEADING``). ``nb`` itself is not changed."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = [o for o in cell.get("outputs", []) if not _is_blank(o)]
            for output in cell["outputs"]:
                html = output.get("data", {}).get("text/html")
                if html is not None:
                    output["data"]["text/html"] = one_header_row("".join(html) if isinstance(html, list) else html)
    kept, folded, i = [], [], 0
    while i < len(nb.cells):
        head = _heading(nb.cells[i])
        end = _section_end(nb.cells, i, head[0]) if head else i + 1
        if head and _shows_only_marks(nb.cells[i:end]):
            folded += _marks_by_heading(nb.cells[i:end])
            i = end
            continue
        kept.append(nb.cells[i])
        i += 1
    if folded:
        from nbformat.v4 import new_markdown_cell  # lazy: only a report with folded sections needs it

        lines = [f"- **{title}**: {' '.join(_LEFT_OUT.sub(_SHORT, m) for m in marks)}" for title, marks in folded]
        kept.append(new_markdown_cell(f"## {FOLDED_HEADING}\n\n" + "\n".join(lines)))
    nb.cells = kept
    return nb
