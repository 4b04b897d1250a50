# Loaded by `make lab` (JUPYTER_CONFIG_PATH=etc/jupyter): notebooks are saved without outputs,
# so a JupyterLab session leaves `git status` clean (zfree.report.lab).
c.ContentsManager.pre_save_hook = "zfree.report.lab.strip_on_save"  # noqa: F821 - `c` is the traitlets config
