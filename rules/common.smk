"""Shared by the stage files: the validated profile, where each stage writes, how a job calls its script.

Layout for a profile P (``config["profile"]``):
    data/<corpus.name>/                      corpus and tokenizer (git-ignored)
    runs/P/<model>_<recipe>_s<seed>/         checkpoints and metrics (git-ignored)
    results/<stage>/P/*.json                 machine-written results with provenance
                                             (*.json.gz for the stages in COMPRESSED_STAGES)
    paper_figs/out/P/fig*.png|pdf            the figures
    logs/P/<rule>/*.log                      one log per job (git-ignored)
"""

import os
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

# Jobs run `python` from the environment that runs snakemake (.venv/bin in the quick start, also
# when the venv is not activated): its folder goes first on PATH. The commands say plain `python`,
# so their code (a rerun trigger) does not change when the venv moves.
envvars:
    "PATH",


os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.getenv("PATH", "")])
# Keys the workflow reads itself; every other key is read by the experiment scripts from the file.
WORKFLOW_ONLY_KEYS = ("results_from",)


def _profile_file():
    """The profile file the experiment scripts read: the last --configfile, else the Snakefile's."""
    path = str((workflow.overwrite_configfiles or workflow.configfiles)[-1])
    inside = os.path.abspath(path).startswith(os.getcwd() + os.sep)
    return os.path.relpath(path) if inside else path


CONFIG_FILE = _profile_file()


def _differences(a, b, prefix=""):
    """Dotted paths of the keys whose values differ between two nested dicts."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix.rstrip(".")]
    return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{prefix}{k}.")]


def _check_scripts_see_this_config():
    # The scripts read CONFIG_FILE, not snakemake's in-memory config. A --config override of a
    # stage setting, or a key of config/smoke.yaml that a partial profile does not set (snakemake
    # merges --configfile over the Snakefile's configfile), would make the workflow and the
    # scripts disagree: both are refused here, naming the keys.
    with open(CONFIG_FILE) as f:
        on_disk = yaml.safe_load(f) or {}
    validate(on_disk, "../config/schema.yaml", set_default=False)
    overridden = set(workflow.config_settings.config or {})
    differ = [
        d for d in _differences(on_disk, config)
        if d.split(".")[0] not in WORKFLOW_ONLY_KEYS
    ]
    by_override = [d for d in differ if d.split(".")[0] in overridden]
    leaked = [d for d in differ if d not in by_override]
    if by_override:
        raise WorkflowError(
            f"--config sets {by_override}, but the experiment scripts read {CONFIG_FILE}: stage "
            f"settings cannot be changed with --config (it may set only {list(WORKFLOW_ONLY_KEYS)}). "
            f"Edit the profile, or copy it to config/<name>.yaml and pass --configfile config/<name>.yaml."
        )
    if leaked:
        raise WorkflowError(
            f"{CONFIG_FILE} does not set {leaked}, which config/smoke.yaml sets: a profile must set "
            f"every key the default profile sets (snakemake would fill them in from smoke.yaml, "
            f"the scripts would not)."
        )


_check_scripts_see_this_config()
# The profile file is valid and the config equals it but for WORKFLOW_ONLY_KEYS: check those.
validate(config, "../config/schema.yaml", set_default=False)

PROFILE = config["profile"]
COMMITTED = config["results_from"] == "committed"


def run_settings(settings, recipe):
    """A pretraining run's params: the pretrain section's training ``settings`` with
    ``compile_recipes`` resolved to whether ``recipe`` compiles (as TrainConfig.from_section does),
    so that naming a recipe there reruns that recipe's runs only, not every run of the profile."""
    settings = dict(settings)
    only = settings.pop("compile_recipes", None)
    if only is not None and settings.get("compile"):
        settings["compile"] = recipe in only
    return settings


def stage_input(path):
    """An input of a stage rule.

    With ``results_from: committed`` (figures from results/ as committed to git) every stage input
    is ``ancient``: a git checkout stamps files in an arbitrary order, and a script or config file
    that looks newer than a committed GPU result must not send that GPU stage to this machine.
    """
    return ancient(path) if COMMITTED else path


# Stages whose results are large (megabytes of per-layer records) write gzip-compressed JSON
# (adahop.harness.provenance reads and writes both): the tree sent to a GPU machine must stay small.
COMPRESSED_STAGES = ("patterns",)


def results_path(stage, name):
    suffix = ".json.gz" if stage in COMPRESSED_STAGES else ".json"
    return f"results/{stage}/{PROFILE}/{name}{suffix}"


def log_path(rule, name="job"):
    return f"logs/{PROFILE}/{rule}/{name}.log"


def script_cmd(script, *args, launcher="python", gpus=None):
    """The shell command of a stage: its script, the profile file, the script's args, the log.
    ``launcher`` runs the script (e.g. a torchrun command line for a job over several GPUs).
    ``gpus``: a GPU stage's GPU count (its rule asks for as many as the ``gpu`` resource); it runs
    on that many GPUs that no other job holds (experiments/claim_gpus.py). The count, not the
    resource: Snakemake lowers a job's resource to the global bound (one GPU by default), while
    a run over several GPUs needs them all."""
    claim = [f"python experiments/claim_gpus.py {gpus} --"] if gpus is not None else []
    return " ".join([*claim, launcher, script, "--config", shlex.quote(CONFIG_FILE), *args, "> {log} 2>&1"])


def none_committed(paths):
    """With ``results_from: committed``, whether none of ``paths`` is there (a campaign's per-run
    results not yet run)."""
    return COMMITTED and not any(os.path.exists(p) for p in paths)


def results_inputs(paths, partial=False):
    """An input function giving ``paths`` (results files read by a figure, a table or `all`).

    With ``results_from: committed`` a missing one is an error that names it, never a stage (a GPU
    stage, for the gpu profile) started on this machine to make it. Checked when a job asks for
    them, so one figure can be drawn while another's results are still missing. ``partial``: the
    paths are per-run files of a campaign that may be under way (pretraining, lm-eval); those
    present are used and a warning names the rest; an error only when none is there.
    """
    paths = list(paths)

    def inputs(wildcards):
        if not COMMITTED:
            return paths
        missing = [p for p in paths if not os.path.exists(p)]
        if missing and (not partial or len(missing) == len(paths)):
            raise WorkflowError(
                f"results_from: committed, but {len(missing)} results file(s) of profile {PROFILE} "
                f"are missing: {sorted(missing)}. Run their stages (the gpu profile's on a GPU) or set "
                f"results_from: run."
            )
        if missing:
            logger.warning(
                f"results_from: committed: {len(paths) - len(missing)} of {len(paths)} runs' results are "
                f"there; drawing from those (missing: {sorted(missing)})"
            )
        return [p for p in paths if p not in missing]

    return inputs
