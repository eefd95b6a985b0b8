"""Shared by the stage files: the validated profile, where each stage writes, how a job calls its script.

Layout for a profile P (``config["profile"]``):
    data/<corpus.name>/                      corpus and tokenizer (git-ignored)
    runs/P/<model>_<recipe>_s<seed>/         checkpoints and metrics (git-ignored)
    results/<stage>/P/*.json                 machine-written results with provenance
    paper_figs/out/P/fig*.png|pdf            the figures
    logs/P/<rule>/*.log                      one log per job (git-ignored)
"""

import os
import sys

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate


validate(config, "../config/schema.yaml", set_default=False)

PROFILE = config["profile"]
# The same interpreter that runs snakemake (.venv/bin/python in the quick start), so a rule never
# picks up another python from PATH.
PY = sys.executable
# Keys the workflow reads itself; every other key is read by the experiment scripts from the file.
WORKFLOW_ONLY_KEYS = ("results_from",)


def _profile_file():
    """The profile file the experiment scripts read: the last --configfile, else the default."""
    given = workflow.overwrite_configfiles
    path = str(given[-1]) if given else "config/smoke.yaml"
    return os.path.relpath(path) if os.path.abspath(path).startswith(os.getcwd() + os.sep) else path


CONFIG_FILE = _profile_file()


def _check_scripts_see_this_config():
    # The scripts read CONFIG_FILE, not snakemake's in-memory config: a --config override of a
    # stage setting (or a key leaking from config/smoke.yaml into a partial profile) would make
    # the workflow and the scripts disagree, so it is refused here with the keys named.
    with open(CONFIG_FILE) as f:
        on_disk = yaml.safe_load(f)
    differ = sorted(
        k for k in set(on_disk) | set(config)
        if k not in WORKFLOW_ONLY_KEYS and on_disk.get(k) != config.get(k)
    )
    if differ:
        raise WorkflowError(
            f"config differs from {CONFIG_FILE} in {differ}: the experiment scripts read "
            f"{CONFIG_FILE}, so stage settings cannot be changed with --config. Edit the profile "
            f"or copy it to config/<name>.yaml and pass --configfile config/<name>.yaml "
            f"(--config may set only {list(WORKFLOW_ONLY_KEYS)})."
        )


_check_scripts_see_this_config()

COMMITTED = config["results_from"] == "committed"


def stage_input(path):
    """An input of a stage rule.

    With ``results_from: committed`` (figures from results/ as committed to git) every stage input
    is ``ancient``: a git checkout stamps files in an arbitrary order, and a script or config file
    that looks newer than a committed GPU result must not send that GPU stage to this machine.
    """
    return ancient(path) if COMMITTED else path


def results_path(stage, name):
    return f"results/{stage}/{PROFILE}/{name}.json"


def log_path(rule, name="job"):
    return f"logs/{PROFILE}/{rule}/{name}.log"


def script_cmd(script, *args):
    """The shell command of a stage: its script, the profile file, the script's args, the log."""
    return " ".join([PY, script, "--config", CONFIG_FILE, *args, "> {log} 2>&1"])


def require_committed_results(paths):
    """With ``results_from: committed``, a missing results file is an error naming it, never a
    stage (a GPU stage, for the gpu profile) started on this machine to make it."""
    missing = sorted(p for p in paths if not os.path.exists(p))
    if missing:
        raise WorkflowError(
            f"results_from: committed, but {len(missing)} results file(s) of profile {PROFILE} are "
            f"missing: {missing}. Run their stages (the gpu profile's on a GPU) or set "
            f"results_from: run."
        )
