"""The generated parts of the documentation site, and the mkdocs hook that puts them in place.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml). A page asks for a generated part
with an HTML comment on a line of its own, e.g. ``<!-- gen:cli -->``; ``on_page_markdown``
replaces it with markdown built here from the code and the shipped results:

- ``gen:cli``: ``zfree --help`` and every subcommand's help, from ``zfree_lab.cli.parser.build_parser``;
- ``gen:config``: every ``TrainConfig`` field (type, default, meaning) from the dataclasses of
  ``zfree.config``, the meaning read from the comments at each field;
- ``gen:presets``: ``zfree study``'s presets from their files (``zfree_lab.experiment.catalog.preset_catalog``);
- ``gen:budget``: ``--budget``'s cuts in order, from ``zfree_lab.experiment.budget.CUTS``;
- ``gen:registry NAME``: one menu's table from its registry (weightings, schedules, free_bits, aids, remedies);
- ``gen:layout``: every module of ``src/zfree`` and ``src/zfree_lab`` by layer, with the first sentence of its docstring;
- ``gen:table NAME``: a table of ``analysis/results/`` (``TABLES``), with the command that
  reproduces it;
- ``gen:include PATH``: a file of the repository as it is (a results note, a spec).

Nothing here imports torch: the parser, the configs and the catalog are light modules, and the
tables are read with the standard library's csv. ``tests/test_docs.py`` imports this file to
check that the reference covers every field and command.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import io
import json
import logging
import math
import os
import re
import sys
import tokenize
from dataclasses import MISSING, fields
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple, get_args, get_origin

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "analysis" / "results"
log = logging.getLogger("mkdocs.hooks.zfree")  # a warning fails `mkdocs build --strict`


def use_this_checkout() -> None:
    """Put this checkout's ``src/`` first on ``sys.path``, so the pages describe the package beside
    them whatever is installed (mkdocs restores ``sys.path`` after loading a hook: called from
    ``on_config`` and before every generator), and warn when ``zfree`` was already imported from
    somewhere else."""
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    mod = sys.modules.get("zfree")
    if mod is not None and Path(mod.__file__).resolve().parent != ROOT / "src" / "zfree":
        log.warning("zfree imported from %s, not from this checkout's src/: the generated pages describe "
                    "that package", Path(mod.__file__).parent)


MARKER = re.compile(r"^<!-- gen:(?P<name>[a-z_-]+)(?: (?P<arg>[^>]*?))? -->[ \t]*$", re.M)


# --- markdown helpers -------------------------------------------------------------------------

def md_escape(text: str) -> str:
    """Plain text for a markdown table cell or paragraph: no emphasis, no HTML, no cell break."""
    text = re.sub(r"([\\*_`|\[\]{}])", r"\\\1", str(text))  # {…} at a cell's end would be an attr_list
    return text.replace("<", "&lt;").replace(">", "&gt;")


def md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    """A markdown table; cells are taken as they are (escape them first)."""
    rule = [{"r": "---:", "c": ":---:"}.get(a, "---") for a in (align or ["l"] * len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# --- the CLI reference (zfree_lab.cli.parser.build_parser) ------------------------------------------

HELP_COLUMNS = 100  # argparse wraps help to the terminal: fixed here, so the page is the same everywhere


@contextlib.contextmanager
def _columns(n: int = HELP_COLUMNS):
    """argparse reads the terminal width from ``COLUMNS`` when it formats: set for the block."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_commands(parser: argparse.ArgumentParser | None = None, prefix: str = "zfree"
                 ) -> list[tuple[str, argparse.ArgumentParser]]:
    """``[(command, parser)]``: ``zfree`` itself, then every subcommand depth-first, in the
    parser's own order (``zfree data synth`` after ``zfree data``)."""
    if parser is None:
        use_this_checkout()
        from zfree_lab.cli.parser import build_parser  # light: no torch (the commands import it lazily)

        with _columns():
            parser = build_parser()
    out = [(prefix, parser)]
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subcommands here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out += cli_commands(sub, f"{prefix} {name}")
    return out


def _help_text(parser: argparse.ArgumentParser) -> str:
    with _columns():
        return parser.format_help().rstrip()


def cli_markdown() -> str:
    """One section per command: its heading and its ``--help`` text as printed."""
    parts = []
    for command, parser in cli_commands():
        depth = command.count(" ")
        parts.append(f"{'#' * min(2 + depth, 4)} `{command}`\n\n```text\n{_help_text(parser)}\n```")
    return "\n\n".join(parts)


# --- the TrainConfig reference (zfree.config) -----------------------------------------------------

class FieldDoc(NamedTuple):
    section: str  # the sub-config class ("ObjectiveConfig") or "TrainConfig" for the paths
    name: str
    type: str  # markdown
    default: str  # markdown
    meaning: str  # plain text (escaped when rendered)


def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` for the dataclass ``cls``: the comment lines right above a field (no
    blank line between) and its trailing comment, joined. Comments are the config's per-field
    documentation (STYLE: every default carries its reason)."""
    import inspect

    path = Path(inspect.getsourcefile(cls))
    src = path.read_text(encoding="utf-8")
    full_line, trailing = {}, {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if tok.line.strip().startswith("#"):
                full_line[tok.start[0]] = text
            else:
                trailing[tok.start[0]] = text
    (node,) = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    out = {}
    for st in node.body:
        if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
            continue
        above, line = [], st.lineno - 1
        while line in full_line:
            above.insert(0, full_line[line])
            line -= 1
        inline = [trailing[n] for n in range(st.lineno, st.end_lineno + 1) if n in trailing]
        out[st.target.id] = " ".join(above + inline).strip()
    return out


def _type_md(typ: Any) -> str:
    if get_origin(typ) is Literal:
        return " \\| ".join(f"`{a!r}`" if not isinstance(a, str) else f'`"{a}"`' for a in get_args(typ))
    if isinstance(typ, type) and issubclass(typ, Enum):
        return " \\| ".join(f'`"{m.value}"`' for m in typ)
    return f"`{getattr(typ, '__name__', str(typ))}`"


def _default_md(f) -> str:
    value = f.default if f.default is not MISSING else f.default_factory()
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    return f"`{json.dumps(value)}`" if isinstance(value, str) else f"`{value!r}`"


def config_sections() -> list[tuple[type, list[FieldDoc]]]:
    """The flat ``TrainConfig`` fields by sub-config, in ``TrainConfig.to_flat`` order, then
    ``BaseTrainConfig`` (``zfree base train``)."""
    use_this_checkout()
    from zfree.config import BaseTrainConfig, TrainConfig
    from zfree.core.values import field_types

    out = []
    paths = {f.name: f for f in fields(TrainConfig) if f.name in ("data_dir", "base_dir")}
    comments, types = field_comments(TrainConfig), field_types(TrainConfig)
    out.append((TrainConfig, [FieldDoc("TrainConfig", n, _type_md(types[n]), _default_md(f), comments[n])
                              for n, f in paths.items()]))
    for cls in (*TrainConfig._SUB.values(), BaseTrainConfig):  # noqa: SLF001 - the sub-configs, in order
        comments, types = field_comments(cls), field_types(cls)
        out.append((cls, [FieldDoc(cls.__name__, f.name, _type_md(types[f.name]), _default_md(f), comments.get(f.name, ""))
                          for f in fields(cls)]))
    return out


def train_config_fields() -> list[FieldDoc]:
    """Every flat ``TrainConfig`` field's documentation (what ``--set``, sweeps and notebooks take)."""
    use_this_checkout()
    from zfree.config import BaseTrainConfig

    return [d for cls, docs in config_sections() if cls is not BaseTrainConfig for d in docs]


def _docstring_md(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    first, _, rest = doc.partition("\n\n")
    text = md_escape(" ".join(first.split()))
    if rest:
        import textwrap

        text += "\n\n```text\n" + textwrap.dedent(rest).strip("\n") + "\n```"
    return text


def config_markdown() -> str:
    use_this_checkout()
    from zfree.config import BaseTrainConfig

    parts = []
    for cls, docs in config_sections():
        if cls.__name__ == "TrainConfig":
            title = "Paths (`TrainConfig`)"
        elif cls is BaseTrainConfig:
            title = "The base model (`BaseTrainConfig`, `zfree base train`)"
        else:
            title = f"`{cls.__name__}`"
        intro = _docstring_md(cls)
        rows = [[f"`{d.name}`", d.type, d.default, md_escape(d.meaning) or "—"] for d in docs]
        parts.append(f"## {title}\n\n{intro}\n\n" + md_table(["field", "type", "default", "meaning"], rows))
    return "\n\n".join(parts)


# --- zfree study's presets (analysis/studies/presets/*.yaml, zfree_lab.experiment.catalog) ----------------

def presets_markdown() -> str:
    use_this_checkout()
    from zfree_lab.experiment.catalog import preset_catalog  # plain YAML, no torch

    rows = [[f"`{name}`", str(e.runs), md_escape(e.cost), md_escape(e.what)] for name, e in preset_catalog().items()]
    return md_table(["preset", "runs", "cost on 2 CPU cores", "what"], rows, ["l", "r", "l", "l"])


# --- the package layout (src/zfree and src/zfree_lab, read without importing them) -----------------

#: (package, layer), bottom to top (tests/test_layers.py): the library, then the application on it
LAYERS = (*(("zfree", layer) for layer in ("config", "core", "data", "models", "objective", "reference",
                                          "evaluate", "train")),
          *(("zfree_lab", layer) for layer in ("run", "experiment", "report", "cli")))


def rst_to_md(text: str) -> str:
    """A docstring sentence as markdown: ``code`` kept as code, everything else escaped."""
    parts = re.split(r"``(.+?)``", text)
    return "".join(f"`{part}`" if i % 2 else md_escape(part) for i, part in enumerate(parts))


def first_sentence(doc: str | None, limit: int = 220) -> str:
    para = " ".join((doc or "").strip().split("\n\n")[0].split())
    m = re.search(r"(?<=[.:])\s(?=[A-Z(])", para)
    text = para[: m.start()] if m else para
    if len(text) > limit:
        return text[: limit - 1].rsplit(" ", 1)[0] + " …"
    return text if not text or text[-1] in ".!?)" else text + " …"


def module_docs(layer: str, package: str = "zfree") -> list[tuple[str, str]]:
    """``[(module file, first sentence of its docstring)]`` of a layer (a sub-package or a module) of ``package``."""
    pkg = ROOT / "src" / package
    paths = [pkg / layer] if layer.endswith(".py") else sorted((pkg / layer).glob("*.py"))
    return [(p.name, first_sentence(ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))))
            for p in paths if p.name != "__init__.py"]


def layout_markdown() -> str:
    """One table per layer: its modules and what each is, from the module docstrings."""
    parts = []
    for package, layer in LAYERS:
        pkg = ROOT / "src" / package / layer
        title = f"`{package}/{layer}`" if layer.endswith(".py") else f"`{package}/{layer}/`"
        intro = "" if layer.endswith(".py") else rst_to_md(first_sentence(ast.get_docstring(
            ast.parse((pkg / "__init__.py").read_text(encoding="utf-8"))))) + "\n\n"
        rows = [[f"`{name}`", rst_to_md(doc) or "—"] for name, doc in module_docs(layer, package)]
        parts.append(f"### {title}\n\n{intro}" + md_table(["module", "what"], rows))
    return "\n\n".join(parts)


# --- the measured tables (analysis/results/*.csv) --------------------------------------------------

def read_csv(name: str) -> list[dict[str, str]]:
    with open(RESULTS / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _float(v: str | None) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def g3(v) -> str:
    """A number as the report and the README quoted it: 3 significant digits (``–`` when missing)."""
    x = _float(v)
    return "–" if math.isnan(x) else f"{x:.3g}"


def interval(row: dict, col: str) -> str:
    """``mean [lo, hi]`` from ``col``, ``col_lo``, ``col_hi`` (3 significant digits each)."""
    if math.isnan(_float(row.get(col))):
        return "–"
    return f"{g3(row[col])} [{g3(row.get(col + '_lo'))}, {g3(row.get(col + '_hi'))}]"


def fixed(digits: int) -> Callable[[str], str]:
    return lambda v: "–" if math.isnan(_float(v)) else f"{_float(v):.{digits}f}"


def share(v) -> str:
    x = _float(v)
    return "–" if math.isnan(x) else f"{100 * x:.0f} %"


def yes_no(v) -> str:
    return {"true": "yes", "false": "no"}.get(str(v).strip().lower(), md_escape(v))


Column = tuple[str, Callable[[dict], str]]  # header, the cell of a row


def col(name: str, fmt: Callable[[str], str] = g3) -> Callable[[dict], str]:
    return lambda r: fmt(r.get(name))


def code(name: str) -> Callable[[dict], str]:
    return lambda r: f"`{r[name]}`" if r.get(name) else "–"


def run_name(r: dict) -> str:
    """weighting, beta and aid of a run (the report's run label)."""
    aid = r.get("aid") or "none"
    return f"{r['weighting']} β={g3(r['beta'])}" + ("" if aid == "none" else f" + `{aid}`")


class Table(NamedTuple):
    files: tuple[str, ...]  # under analysis/results/; rows of the first, joined by run_id with the others
    columns: tuple[Column, ...]
    command: str  # what reproduces the file(s)
    keep: Callable[[dict], bool] = lambda r: True
    order: Callable[[dict], Any] | None = None


def _rows(t: Table) -> list[dict]:
    rows = read_csv(t.files[0])
    for other in t.files[1:]:
        by_id = {r["run_id"]: r for r in read_csv(other)}
        rows = [{**by_id.get(r["run_id"], {}), **r} for r in rows]
    rows = [r for r in rows if t.keep(r)]
    return sorted(rows, key=t.order) if t.order else rows


def _nmi_with_label(r: dict) -> str:
    return f"{interval(r, 'alignment_nmi')} ({r['alignment_label']})" if r.get("alignment_label") else interval(r, "alignment_nmi")


def _seeds_used(r: dict) -> str:
    n = int(_float(r["n_seeds"]))
    return f"{round(_float(r['z_used_share']) * n)}/{n}"


def _ratio(v) -> str:
    return "–" if math.isnan(_float(v)) else f"{_float(v):.2f}"


LEADERBOARD_COLUMNS: tuple[Column, ...] = (
    ("side", col("side", str)), ("remedy", code("remedy")), ("weighting", col("weighting", str)), ("β", col("beta")),
    ("z gain [nats/ex]", lambda r: interval(r, "z_gain")), ("rate KL", lambda r: interval(r, "rate")),
    ("NMI", _nmi_with_label), ("task correct", lambda r: interval(r, "task_correctness")),
    ("z used", _seeds_used), ("tokens ×", col("forward_tokens_ratio", _ratio)), ("wall ×", col("train_wall_ratio", _ratio)))
AVAILABLE_GAIN_COLUMNS: tuple[Column, ...] = (
    ("label", code("label")), ("values", col("n_values", str)), ("rows", col("rows", str)),
    ("ΔR over the control [nats/ex]", lambda r: interval(r, "delta_R")),
    ("H(label \\| x)", lambda r: f"{g3(r['H'])} ({md_escape(r['H_source'])})"),
    ("η = ΔR/H", lambda r: interval(r, "eta")), ("interval above 0", col("distinguishable", yes_no)))
SIDE_RANK = lambda r: (r["side"] != "inside", _float(r["rank"]))  # noqa: E731
PHASE_COLUMNS: tuple[Column, ...] = (
    ("weighting", col("weighting", str)), ("latent", col("latent_kind", str)), ("aid", code("aid")),
    ("β points", col("n_betas", str)), ("plateau rate", col("plateau_rate")),
    ("predicted plateau", col("predicted_plateau_rate")), ("half-plateau β measured", col("beta_half_measured")),
    ("predicted", col("beta_half_predicted")), ("ratio", col("ratio")), ("within ±25 %", col("within", yes_no)))
RUN_COLUMNS: tuple[Column, ...] = (
    ("run", run_name), ("steps", col("steps", str)), ("z gain [nats/ex]", lambda r: interval(r, "z_gain")),
    ("rate KL", col("kl_prior_loss")), ("ρ_recon", col("baseline_normalized_reconstruction_loss")),
    ("NMI (m = 1)", col("alignment_nmi_unambiguous")), ("codes", col("codes_used", str)),
    ("predicted use", col("predicted_use_fraction", share)), ("measured use", col("measured_use_fraction", share)),
    ("z used", col("z_used", yes_no)), ("task correct", col("task_correctness")), ("wall s", col("wall_s", fixed(0))))

TABLES: dict[str, Table] = {
    "default-runs": Table(("study-default-summary.csv",), RUN_COLUMNS,
                          "make study   # = zfree study --preset default --out runs/study-default"),
    "default-available-gain": Table(("study-default-available_gain.csv",), AVAILABLE_GAIN_COLUMNS,
                                    "make study   # = zfree study --preset default --out runs/study-default"),
    "aided-runs": Table(("study-aided-summary.csv",), (
        ("run", run_name), ("seed", col("seed", str)), ("posterior", code("posterior_features")), ("K", col("n_latent", str)),
        ("steps", col("steps", str)), ("rate KL", col("kl_prior_loss")),
        ("ρ_recon", col("baseline_normalized_reconstruction_loss")), ("oracle ρ", col("oracle_rho")),
        ("NMI (m = 1)", col("alignment_nmi_unambiguous")), ("Hungarian (m = 1)", col("hungarian_accuracy_unambiguous")),
        ("task correct", col("task_correctness")), ("hand-over step", col("handover_step", fixed(0))),
        ("wall s", col("wall_s", fixed(0)))),
        "zfree study --preset aided --out runs/study-aided"),
    "full-phase-boundary": Table(("study-full-phase_boundary.csv",), PHASE_COLUMNS,
                                 "zfree study --preset full --out runs/study-full"),
    "sweep-phase-boundary": Table(("phase_boundary.csv",), PHASE_COLUMNS,
                                  "zfree sweep analysis/sweeps/phase_boundary.yaml --out runs/sweep-phase_boundary"),
    "sweep-use-by-length": Table(("phase_boundary_use_by_length.csv",), (
        ("run", code("run_id")), ("β", col("beta")), ("\\|S\\|", col("n_tokens", str)), ("rows", col("rows", str)),
        ("measured use", col("measured_use", share)), ("predicted use", col("predicted_use", share)),
        ("KL", col("kl"))),
        "zfree sweep analysis/sweeps/phase_boundary.yaml --out runs/sweep-phase_boundary",
        keep=lambda r: r["aid"] != "none"),
    "leaderboard": Table(("leaderboard-leaderboard.csv",), LEADERBOARD_COLUMNS,
                         "zfree study --preset leaderboard --out runs/study-leaderboard", order=SIDE_RANK),
    "leaderboard-available-gain": Table(("leaderboard-available_gain.csv",), AVAILABLE_GAIN_COLUMNS,
                                        "zfree study --preset leaderboard --out runs/study-leaderboard"),
    "leaderboard-e2e": Table(("leaderboard-e2e-leaderboard.csv",), LEADERBOARD_COLUMNS,
                             "zfree study --preset leaderboard-e2e --out runs/study-leaderboard-e2e", order=SIDE_RANK),
    "leaderboard-e2e-available-gain": Table(("leaderboard-e2e-available_gain.csv",), AVAILABLE_GAIN_COLUMNS,
                                            "zfree study --preset leaderboard-e2e --out runs/study-leaderboard-e2e"),
    "e2e-available-gain": Table(("study-e2e-available_gain.csv",), AVAILABLE_GAIN_COLUMNS,
                                "zfree study --preset e2e --out runs/study-e2e"),
    "e2e-runs": Table(("study-e2e-summary.csv", "study-e2e-multiref.csv"), (
        ("run", run_name), ("steps", col("steps", str)), ("z gain [nats/ex]", lambda r: interval(r, "z_gain")),
        ("share of the best oracle", col("gain_share", fixed(2))), ("rate KL", col("kl_prior_loss")),
        ("codes", col("codes_used", str)), ("measured use", col("measured_use_fraction", share)),
        ("z used", col("z_used", yes_no)),
        ("NMI complete / first_slot / n_sentences", lambda r: " / ".join(
            fixed(3)(r.get(f"structure/alignment_nmi/{k}")) for k in ("complete", "first_slot", "n_sentences"))),
        ("pairwise-BLEU (control)", lambda r: f"{fixed(1)(r.get('pairwise_bleu'))} ({fixed(1)(r.get('control_pairwise_bleu'))})"),
        ("refs covered (control)", lambda r: f"{fixed(2)(r.get('refs_covered'))} ({fixed(2)(r.get('control_refs_covered'))})")),
        "zfree study --preset e2e --out runs/study-e2e"),
}


def table_markdown(name: str) -> str:
    """The table ``name`` of ``TABLES``, its source files and the command that reproduces them."""
    if name not in TABLES:
        raise KeyError(f"gen:table {name!r}: no such table; known: {sorted(TABLES)}")
    t = TABLES[name]
    rows = [[cell(r) for _, cell in t.columns] for r in _rows(t)]
    files = ", ".join(f"`analysis/results/{f}`" for f in t.files)
    return (f'<div class="zfree-results" markdown>\n\n{md_table([h for h, _ in t.columns], rows)}\n\n</div>\n\n'
            f"From {files}; reproduced by:\n\n```bash\n{t.command}\n```")


def _inline_images(text: str, path: Path, arg: str) -> str:
    """Images an included note links relative to itself (``![alt](curves.png)``) as data URIs: the
    page that includes it lives elsewhere in docs/, and the site stays offline and self-contained.
    Raises ValueError naming the note and the link when the image is missing."""
    import base64

    def one(m: re.Match) -> str:
        alt, link = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", link) or link.startswith("/"):
            return m.group(0)
        img = (path.parent / link).resolve()
        if not img.is_file() or ROOT not in img.parents:
            raise ValueError(f"gen:include {arg!r}: image {link!r} not found beside the note")
        kind = {".png": "png", ".svg": "svg+xml", ".jpg": "jpeg", ".jpeg": "jpeg"}.get(img.suffix.lower(), "png")
        return f"![{alt}](data:image/{kind};base64,{base64.b64encode(img.read_bytes()).decode('ascii')})"

    return re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", one, text)


def include_markdown(arg: str) -> str:
    """A file of the repository (``arg`` relative to its root) as it is: markdown inline, its
    headings one level down; YAML and anything else in a code block."""
    path = (ROOT / arg).resolve()
    if ROOT not in path.parents:
        raise ValueError(f"gen:include {arg!r}: not a file of the repository")
    text = path.read_text(encoding="utf-8").rstrip()
    if path.suffix == ".md":
        return _inline_images(re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M), path, arg)
    lang = {".yaml": "yaml", ".yml": "yaml", ".py": "python"}.get(path.suffix, "text")
    return f"```{lang}\n{text}\n```"


def budget_markdown() -> str:
    """``--budget``'s cuts, in order, from ``zfree_lab.experiment.budget.CUTS`` (a steps fit repeated at the
    same floor after a cut is a retry and is listed with it)."""
    from zfree_lab.experiment.budget import CUTS

    lines, n, floor = [], 0, None
    for c in CUTS:
        if c.apply is None:
            if c.floor == floor:
                continue
            floor = c.floor
        n += 1
        lines.append(f"{n}. {md_escape(c.what)}{' (a steps fit: it ends the search when the grid then fits)' if c.apply is None else ''};")
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    """A registry's markdown text (backticks and links kept) for a table cell: no cell break."""
    return str(text).replace("|", "\\|")


def registry_markdown(name: str) -> str:
    """The docs' table of one menu, read from its registry (the entries in registry order): ``weightings``
    (``zfree.core.weightings``), ``schedules`` (``zfree.core.schedules``), ``free_bits``
    (``zfree.core.free_bits``), ``aids`` (``zfree.config.aid``), ``remedies`` (``zfree.objective.remedies``).
    Light modules: no torch."""
    if name == "weightings":
        from zfree.core.weightings import WEIGHTINGS

        rows = [[f"`{w.name}`", md_escape(w.source), ", ".join(f"`{k}={v}`" for k, v in w.grid.items()) or "–"]
                for w in WEIGHTINGS.values()]
        return md_table(["`weighting`", "w(x, y) and its source", "a grid sets"], rows)
    if name == "schedules":
        from zfree.core.schedules import SCHEDULES

        rows = [[f"`{e.name}`", md_escape(e.formula), md_escape(e.source), ", ".join(f"`{f}`" for f in e.fields) or "–"]
                for e in SCHEDULES.values()]
        return md_table(["`beta_schedule`", "β at step t (after the AE phase)", "source", "fields"], rows)
    if name == "free_bits":
        from zfree.core.free_bits import FREE_BITS_MODES

        rows = [[f"`{m.name}`", md_escape(m.formula), md_escape(m.source), ", ".join(m.kinds)]
                for m in FREE_BITS_MODES.values()]
        return md_table(["`free_bits_mode`", "the KL penalized (λ = `free_bits`)", "source", "latent kinds"], rows)
    if name == "aids":
        from zfree.config.aid import AIDS

        rows = [[f"`{a.name}`", md_escape(a.source), ", ".join(a.kinds), "yes" if a.gate else "–"] for a in AIDS.values()]
        return md_table(["`aid`", "source", "latent kinds", "gate rows"], rows)
    if name == "remedies":
        from zfree.objective.remedies import REMEDY_ENTRIES

        return md_table(["entry", "what (paper, default)"], [[f"`{r.name}`", _md_cell(r.what)]
                                                            for r in REMEDY_ENTRIES.values()])
    raise KeyError(f"gen:registry {name!r}: no such registry; known: weightings, schedules, free_bits, aids, remedies")


# --- the hook -------------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[..., str]] = {
    "cli": lambda arg=None: cli_markdown(),
    "config": lambda arg=None: config_markdown(),
    "presets": lambda arg=None: presets_markdown(),
    "layout": lambda arg=None: layout_markdown(),
    "budget": lambda arg=None: budget_markdown(),
    "registry": registry_markdown,
    "table": table_markdown,
    "include": include_markdown,
}


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- gen:NAME [ARG] -->`` line replaced by its generated part."""
    def one(m: re.Match) -> str:
        name, arg = m["name"], m["arg"]
        if name not in GENERATORS:
            raise KeyError(f"<!-- gen:{name} -->: no such generator; known: {sorted(GENERATORS)}")
        return GENERATORS[name](arg) if arg else GENERATORS[name]()
    return MARKER.sub(one, markdown)


def on_config(config):  # mkdocs hook: before any page
    use_this_checkout()
    return config


def on_page_markdown(markdown: str, page=None, config=None, files=None) -> str:  # mkdocs hook
    return expand(markdown)
