"""The report layer (top, below the cli): figures, report tables and verdicts, ipywidgets, JupyterLab's strip-on-save.

Every string a figure shows may come from data (label names and values, run names, MRs), so text is
never parsed as mathtext: a label named ``$x_$`` would otherwise stop the report with a
ParseSyntaxException and ``$\\frac{a}{b}$`` would be typeset as a fraction. zfree's own labels are
Unicode (β_eff = β·|S|/w), so nothing of ours needs mathtext. Set here, once, for every process that
draws zfree's figures (the report kernel, the notebooks, the widgets).
"""

import matplotlib as _mpl

_mpl.rcParams["text.parse_math"] = False
