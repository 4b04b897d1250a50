"""The documentation (docs/, mkdocs.yml) and the README agree with the code (issue 41).

The generated reference covers every ``TrainConfig`` field (with a meaning) and every ``zfree``
subcommand; every ``<!-- gen:... -->`` part of a page expands and has a fallback line for the raw
page; every ``zfree`` command a page or the README shows parses with the real parser; the README stays one screen and names what exists. With
mkdocs installed (``make docs`` installs the ``docs`` extra) the site builds under ``--strict``: no
warning, no broken link or anchor. No torch is imported: the parser, the configs and the tables are
light, and a build takes seconds. The slow tier runs the tutorials' commands that need no cluster,
model download or hours: the SLURM tutorial's local sweeps and the README's own_smoke study."""

from __future__ import annotations

import argparse
import html
import os
import re
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from tests.scripts import load_script

from zfree.config import TrainConfig
from zfree_lab.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def gen():
    return load_script(DOCS / "gen_docs.py", "zfree_gen_docs")


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "zfree") -> list[str]:
    """Every command path of the parser, walked here independently of docs/gen_docs.py."""
    out = [prefix]
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out += _subcommands(sub, f"{prefix} {name}")
    return out


def test_config_reference_covers_every_train_config_field_with_type_default_and_meaning(gen):
    docs = gen.train_config_fields()
    assert [d.name for d in docs] == TrainConfig.flat_fields()  # every flat field, in to_flat order, once
    assert not [d.name for d in docs if not d.meaning.strip()], "a field without a comment in zfree/config/"
    page = gen.expand((DOCS / "reference" / "config.md").read_text(encoding="utf-8"))
    defaults = TrainConfig().to_flat()
    for d in docs:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{d.name}` |")), None)
        assert row is not None, d.name
        assert repr(defaults[d.name]) in row or f'"{defaults[d.name]}"' in row, (d.name, row)
    base = [cls for cls, _ in gen.config_sections() if cls.__name__ == "BaseTrainConfig"][0]
    assert all(f"| `{f.name}` |" in page for f in fields(base))


def test_a_field_comment_is_read_from_above_and_beside_the_field(gen):
    docs = {d.name: d.meaning for d in gen.train_config_fields()}
    assert docs["beta"] == "KL weight; beta < 1 is InfoVAE-style beta reduction"  # beside
    assert docs["c_base_source"].startswith("where c_base comes from")  # the comment lines above
    assert "Fu et al. 2019" in docs["beta_ratio_zero"]


def test_cli_reference_shows_every_subcommand_and_its_options(gen):
    commands = _subcommands(build_parser())
    assert {"zfree study", "zfree train", "zfree sweep", "zfree data synth", "zfree model fetch"} <= set(commands)
    page = gen.expand((DOCS / "reference" / "cli.md").read_text(encoding="utf-8"))
    headings = re.findall(r"^#+ `(zfree[^`]*)`$", page, flags=re.M)
    assert headings == commands
    for command, parser in gen.cli_commands():
        options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]  # noqa: SLF001
        missing = [o for o in options if o not in page]
        assert not missing, (command, missing)


def test_every_generated_part_expands_and_every_results_table_is_shown(gen):
    used = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        used |= {m["arg"] for m in gen.MARKER.finditer(text) if m["name"] == "table"}
        out = gen.expand(text)
        assert "<!-- gen:" not in out, page
    assert used == set(gen.TABLES), "a table of docs/gen_docs.py TABLES no page shows, or a page names an unknown one"
    for name, table in gen.TABLES.items():
        assert all((gen.RESULTS / f).is_file() for f in table.files), name
        assert table.command.split()[0] in ("make", "zfree"), name


def test_every_generated_part_has_a_fallback_line_for_the_raw_page(gen):
    """A reader of the raw .md file (GitHub, an editor) sees no HTML comment: each ``<!-- gen:... -->``
    placeholder is followed by one line starting with ``gen.FALLBACK`` that says where to read the part,
    then a blank line or the page's end (else the raw page runs the next paragraph into the quote). Its
    relative links resolve, and an included file's or a table's own files are among them. No fallback
    line stands anywhere else (the site would show it)."""
    problems = []
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines):
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            if line.startswith(gen.FALLBACK) and not (i and gen.MARKER.fullmatch(lines[i - 1])):
                problems.append(f"{where}: a fallback line after no placeholder")
            m = gen.MARKER.fullmatch(line)
            if not m:
                continue
            after = lines[i + 1] if i + 1 < len(lines) else ""
            if not after.startswith(gen.FALLBACK):
                problems.append(f"{where}: gen:{m['name']} without a fallback line")
                continue
            if i + 2 < len(lines) and lines[i + 2].strip():
                problems.append(f"{where}: no blank line after the fallback line")
            targets = {(page.parent / t).resolve() for t in link.findall(after) if "://" not in t}
            problems += [f"{where}: broken link {t}" for t in targets if not t.exists()]
            own = ({(ROOT / m["arg"]).resolve()} if m["name"] == "include" else
                   {(gen.RESULTS / f).resolve() for f in gen.TABLES[m["arg"]].files} if m["name"] == "table" else set())
            problems += [f"{where}: the fallback does not link {f.relative_to(ROOT)}" for f in own - targets]
    assert not problems, "\n".join(problems)


def test_the_hook_puts_the_generated_part_in_place_of_the_placeholder_and_its_fallback(gen, caplog):
    fallback = f"{gen.FALLBACK}: [smoke.yaml](../../analysis/studies/presets/smoke.yaml), included here as it is."
    page = f"# A page\n\nBefore.\n\n<!-- gen:include analysis/studies/presets/smoke.yaml -->\n{fallback}\n\nAfter.\n"
    out = gen.on_page_markdown(page)
    assert "name: smoke" in out  # the generated part, a YAML block ...
    assert out.startswith("# A page\n\nBefore.\n\n```yaml\n") and out.endswith("```\n\nAfter.\n")
    assert gen.FALLBACK not in out and "<!-- gen:" not in out  # ... where the placeholder and its fallback were
    # an ordinary line after a placeholder is kept; a fallback line after none is kept and warned about
    assert gen.on_page_markdown("<!-- gen:budget -->\nAfter.\n").endswith(";\nAfter.\n")
    orphan = f"Text.\n\n{fallback}\n"
    with caplog.at_level("WARNING", logger="mkdocs.hooks.zfree"):
        assert gen.on_page_markdown(orphan) == orphan
    assert any("follows no <!-- gen:" in r.getMessage() for r in caplog.records)


def test_metrics_page_explains_every_key_the_evaluation_writes():
    """Each metric key written by the evaluation (``zfree.evaluate`` and the run's evaluation,
    ``zfree_lab.run.metrics``, ``latent_meaning``: a string constant, or an f-string's fixed prefix such
    as ``structure/n_rows/``) is named on docs/concepts/metrics.md."""
    import ast

    key = re.compile(r"(loss|loss_contrib|structure|latent|task|reference|objective|decode)/[a-z_/]*")
    keys = set()
    run = ROOT / "src" / "zfree_lab" / "run"
    for path in [*(ROOT / "src" / "zfree" / "evaluate").glob("*.py"), run / "metrics.py", run / "latent_meaning.py",
                 run / "property_alignment.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and key.fullmatch(node.value):
                keys.add(node.value)
            elif isinstance(node, ast.JoinedStr) and isinstance(node.values[0], ast.Constant):
                head = str(node.values[0].value)
                if key.fullmatch(head) and head.endswith("/"):
                    keys.add(head)
    assert {"loss/val/kl_prior_loss", "structure/n_rows/", "task/correctness"} <= keys
    page = (DOCS / "concepts" / "metrics.md").read_text(encoding="utf-8")
    assert not sorted(k for k in keys if f"`{k}" not in page)


def test_docs_and_docstrings_cite_only_what_the_project_holds():
    """Issue 60: ``grep -r "DESIGN\\|shared/seeds" docs src`` finds nothing, nor in the notebooks, the
    analysis notes (rendered into the results pages) and the README. The design notes and the seed
    notes are not part of the project; the concepts pages hold their math, with the published
    sources, and the code cites those pages."""
    cited = re.compile(r"DESIGN|shared/seeds")
    files = [README, ROOT / "setup.py"] + [p for top in ("docs", "src", "notebooks", "analysis")
                                           for p in sorted((ROOT / top).rglob("*"))
                                           if p.suffix in (".md", ".py", ".ipynb", ".yaml", ".yml", ".txt")]
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in files if path.is_file()
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if cited.search(line)]
    assert not hits, "\n".join(hits)
    # the pages the code cites instead exist, with the sections it names
    problem = (DOCS / "concepts" / "problem.md").read_text(encoding="utf-8")
    assert "{ #models }" in problem and "{ #benchmark }" in problem
    cites = set()
    for path in (ROOT / "src").rglob("*.py"):
        cites |= set(re.findall(r"docs/((?:concepts|reference)/[a-z_-]+\.md)", path.read_text(encoding="utf-8")))
    assert cites and all((DOCS / c).is_file() for c in cites), cites


def test_the_live_how_to_and_the_results_loaders_are_in_the_site():
    """Issue 60: TensorBoard and W&B were documented only in the SLURM tutorial, and the API reference
    skipped the results loaders. The how-to names the config fields the code reads; the API page
    renders load_sweep and ExploreLab; both are in the navigation."""
    from zfree.config.optim import OptimConfig

    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "howto/live.md" in nav and "reference/api/results.md" in nav
    live = (DOCS / "howto" / "live.md").read_text(encoding="utf-8")
    assert {"tensorboard", "wandb"} <= {f.name for f in fields(OptimConfig)}
    assert "--set tensorboard=false" in live and "--set wandb=offline" in live and "wandb sync" in live
    assert "pip install 'zfree[wandb]'" in live and "live.md" in (DOCS / "howto" / "index.md").read_text(encoding="utf-8")
    api = (DOCS / "reference" / "api" / "results.md").read_text(encoding="utf-8")
    assert "::: zfree_lab.experiment.results.load_sweep" in api and "::: zfree_lab.report.explore.ExploreLab" in api


def test_presets_page_lists_every_preset(gen):
    from zfree_lab.experiment.catalog import preset_catalog

    page = gen.expand((DOCS / "howto" / "presets.md").read_text(encoding="utf-8"))
    assert all(f"| `{name}` | {e.runs} |" in page for name, e in preset_catalog().items())
    listed = page.split("What they are:")[1].split("\n## ")[0]  # the prose list says what each one is for
    assert not [n for n in preset_catalog() if f"`{n}`" not in listed]


def _zfree_commands(text: str) -> list[str]:
    """The ``zfree`` command lines of the bash blocks of a markdown text (environment assignments
    and ``.venv/bin/`` stripped, comments dropped, continuation lines joined)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]
            if words and words[0] in ("zfree", ".venv/bin/zfree"):
                out.append(shlex.join(words[1:]))
    return out


def test_every_zfree_command_in_the_docs_and_readme_parses(gen):
    """Each command a reader copies is one the CLI accepts (parsed, not run: the slow ones train),
    the generated parts included (each results table's reproducing command)."""
    commands = [(p, c) for p in [*PAGES, README]
                for c in _zfree_commands(gen.expand(p.read_text(encoding="utf-8")))]
    assert len(commands) > 20
    for path, command in commands:
        try:
            build_parser().parse_args(shlex.split(command))
        except SystemExit:
            pytest.fail(f"{path.relative_to(ROOT)}: `zfree {command}` does not parse")


def test_the_own_model_tutorial_names_a_shipped_stand_in_model_and_its_command_parses():
    """The own-model tutorial's first-run command (inline, on the shipped 2-layer E2E GPT-2) parses, and
    the model folder and the pairs it names are in the repository: a newcomer tries the pipeline with
    no download."""
    page = (DOCS / "tutorials" / "own-model.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"`OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 \.venv/bin/zfree (study --model data/e2e/base/model [^`]*)`",
                            page)
    args = build_parser().parse_args(shlex.split(command))
    assert args.preset == "own_smoke"
    assert all((ROOT / args.model / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))
    assert (ROOT / args.data).is_file()


def test_readme_is_one_screen_and_names_what_exists():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "make study" in text and "make test" in text  # the two commands; CI (.ci/run) runs `make test`
    assert "Dušek, David M. Howcroft and Verena Rieser" in text and "CC BY-SA 4.0" in text  # E2E attribution
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) == 1 and (ROOT / images[0]).is_file()
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert links and all((ROOT / t).exists() for t in links), links
    commands = set(_zfree_commands(text))
    assert any("--model" in c and "--data" in c for c in commands)  # your own model and data


def test_the_readme_figure_is_drawn_from_the_shipped_tables():
    """docs/figures/default_study_gains.py reads analysis/results/ and writes the PNG the README shows."""
    script = (DOCS / "figures" / "default_study_gains.py").read_text(encoding="utf-8")
    for name in re.findall(r'"(study-default-[a-z_]+\.csv)"', script):
        assert (ROOT / "analysis" / "results" / name).is_file()
    assert "default-study-z-gain.png" in script and "default-study-z-gain.png" in README.read_text(encoding="utf-8")


def test_mkdocs_build_is_strict_clean(tmp_path, gen):
    """The whole site under ``--strict`` (a warning, a broken link or anchor fails it), into tmp_path."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make docs installs it)")
    pytest.importorskip("material", reason="mkdocs-material is not installed (make docs installs it)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (make docs installs it)")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = res.stdout + res.stderr
    assert res.returncode == 0 and "WARNING" not in log, log[-4000:]
    assert (tmp_path / "site" / "reference" / "config.html").is_file()
    api = (tmp_path / "site" / "reference" / "api" / "results.html").read_text(encoding="utf-8")
    assert 'id="zfree_lab.experiment.results.load_sweep"' in api and 'id="zfree_lab.report.explore.ExploreLab"' in api
    remote = re.compile(r'<(?:script|img)[^>]+src="(?:https?:)?//|<link[^>]+href="(?:https?:)?//[^"]*"[^>]*stylesheet'
                        r'|<link[^>]+stylesheet[^>]+href="(?:https?:)?//')
    pages = [p for p in (tmp_path / "site").rglob("*.html") if remote.search(p.read_text(encoding="utf-8"))]
    assert not pages, f"a page loads a script, image or stylesheet from the network: {pages[:3]}"  # offline
    from zfree_lab.experiment.catalog import preset_catalog

    # generated cells shown whole (markdown extensions such as attr_list eat some text, e.g. "{a, b}")
    page = (tmp_path / "site" / "howto" / "presets.html").read_text(encoding="utf-8")
    shown = html.unescape(re.sub(r"<[^>]+>", "", page))
    lost = [name for name, e in preset_catalog().items() if e.what not in shown or e.cost not in shown]
    assert not lost, f"presets whose text the rendered table does not show whole: {lost}"  # e.g. {...} eaten
    page = (tmp_path / "site" / "reference" / "config.html").read_text(encoding="utf-8")
    shown = " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())
    lost = [d.name for d in gen.train_config_fields() if " ".join(d.meaning.split()) not in shown]
    assert not lost, f"fields whose meaning the rendered reference does not show whole: {lost}"


def _runnable(command: str, out_dir: Path, subs: dict[str, str] | None = None) -> list[str]:
    """A page's command as ``zfree_lab.cli.main`` arguments: placeholders replaced by ``subs`` and its
    ``--out`` moved into ``out_dir`` (same folder name)."""
    args = [(subs or {}).get(a, a) for a in shlex.split(command)]
    i = args.index("--out") + 1
    args[i] = str(out_dir / Path(args[i]).name)
    return args


@pytest.mark.slow  # two smoke sweeps of 2 x 20 steps through papermill with their reports: minutes
def test_the_slurm_tutorials_commands_without_a_cluster_run(tmp_path, monkeypatch):
    """The SLURM tutorial's "trying it without a cluster" commands, as the page shows them: submitit's
    local executor and the local pool, on the shipped benchmark and base."""
    from zfree_lab.cli import main

    commands = [c for c in _zfree_commands((DOCS / "tutorials" / "slurm.md").read_text(encoding="utf-8"))
                if c.startswith("sweep analysis/sweeps/smoke.yaml ")]
    assert len(commands) == 2 and any("--executor submitit --cluster local" in c for c in commands)
    monkeypatch.chdir(ROOT)  # the spec path is relative to the repository root
    for command in commands:
        args = _runnable(command, tmp_path)
        assert main(args) == 0, command
        out = Path(args[args.index("--out") + 1])
        done = sorted(f.parent.name for f in (out / "runs").glob("*/summary.json"))
        cvaes = [r for r in done if r.startswith(("plain_", "distribution_"))]
        assert (out / "report.html").is_file() and len(cvaes) == 2, done
        assert any(r.startswith("control_") for r in done), done  # the CVAEs' z-free controls ran too


@pytest.mark.slow  # an own_smoke study to its report (~2 min on one thread)
def test_the_own_model_smoke_command_of_the_readme_and_the_tutorial_runs(tmp_path, monkeypatch):
    """README's and the own-model tutorial's ``--preset own_smoke`` command, with a tiny GPT-2 saved
    as a transformers folder for the model and the shipped benchmark's validation rows for the pairs."""
    from tests.tiny import tiny_gpt2
    from zfree_lab.cli import main

    readme = [c for c in _zfree_commands(README.read_text(encoding="utf-8")) if "--preset own_smoke" in c]
    page = [c for c in _zfree_commands((DOCS / "tutorials" / "own-model.md").read_text(encoding="utf-8"))
            if "--preset own_smoke" in c]
    assert len(readme) == 1 and page
    model = tmp_path / "model"
    model.mkdir()
    tiny_gpt2(n_layer=1, folder=model)
    monkeypatch.setenv("ZFREE_CACHE_DIR", str(tmp_path / "cache"))
    pairs = ROOT / "data" / "synth" / "default" / "val.jsonl"
    subs = {"$M": str(model), "MODEL": str(model), "pairs.jsonl": str(pairs)}
    args = _runnable(readme[0], tmp_path, subs)
    assert main(args) == 0
    out = Path(args[args.index("--out") + 1])
    assert (out / "report.html").is_file() and (out / "base" / "model").is_symlink()
