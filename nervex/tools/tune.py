"""``nervex -m tune``: search a config's hyperparameters with Optuna.

::

    nervex -m tune -c app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml \\
        --space app_zoo/classic_control/cartpole/config/cartpole_dqn_space.yaml --trials 16 --seeds 3 \\
        --storage sqlite:///tune.db

Each trial samples the space's keys (TPE, seeded), lays them into the config as ``--set`` would, compiles it, and
trains ``--seeds`` seeds of it in lockstep (``trial_runner.SeedGroup``); after each round of evaluations the seeds'
mean running score goes to the median pruner. A trial whose training raises is marked FAIL with the reason; the
study goes on. With ``--storage`` the study resumes: ``--trials N`` means N finished trials (complete, pruned or
failed) in total, and a trial left RUNNING by a killed tuner on this host is marked FAIL and run again.

Outputs, in ``<run_root>/tune/<study>/``: ``trials.csv`` (one row per trial), ``best_config.yaml`` (the full
resolved config with the best trial's values: ``nervex -m serial -c best_config.yaml`` trains it) and one run
directory per trial and seed (``trial_0003/seed_1/``); a summary is printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import os
import shutil
import socket
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import yaml

from nervex.config import ConfigError, apply_overrides, read_config, to_plain

from .search_space import ParamSpec, load_space, space_summary, trial_config
from .trial_runner import OBJECTIVES, SeedGroup

DEFAULT_SEEDS = 3
DEFAULT_STARTUP_TRIALS = 5  # rl-baselines3-zoo's: random trials before TPE models, complete trials before pruning
MAX_SEEDS = 100
MAX_TRIALS = 100_000


class TuneError(ValueError):
    """The tuning run cannot start: a bad flag, or a study in the storage that was run with other settings."""


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


# ---- the study ------------------------------------------------------------------------------------------------------
def open_study(
    name: str, storage: Optional[str], settings: Mapping[str, Any], seed: int, startup: int, warmup: int
) -> Any:
    """Create the study or load it from ``storage``, and check it was run with the same ``settings``.

    The TPE sampler's seed is ``seed`` plus the number of trials already in the study, so a resumed study does not
    draw its first trials' random samples again. The pruner is ``MedianPruner(startup, warmup)`` on evaluation
    rounds.

    Raises:
        TuneError: the stored study was run with other seeds, objective, space or config.
    """
    import optuna

    pruner = optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    study = optuna.create_study(
        study_name=name, storage=storage, direction="maximize", pruner=pruner, load_if_exists=storage is not None
    )
    stored = study.user_attrs.get("tune")
    if stored is None:
        study.set_user_attr("tune", dict(settings))
    else:
        differ = [k for k in settings if stored.get(k) != settings[k]]
        if differ:
            detail = "; ".join(f"{k}: stored {stored.get(k)!r}, now {settings[k]!r}" for k in differ)
            raise TuneError(
                f"study '{name}' in {storage} was run with other settings ({detail}); resume with the same ones, "
                "or start another study with --study-name"
            )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate TPE
        study.sampler = optuna.samplers.TPESampler(
            seed=seed + len(study.trials), n_startup_trials=startup, multivariate=True
        )
    return study


def interrupted_trials(study: Any) -> Dict[str, str]:
    """``{trial number: reason}`` of trials a kill or Ctrl-C cut short (FAIL, run again, not counted as finished)."""
    return dict(study.user_attrs.get("interrupted") or {})


def _mark_interrupted(study: Any, number: int, params: Mapping[str, Any], reason: str) -> None:
    from optuna.trial import TrialState

    marks = interrupted_trials(study)
    marks[str(number)] = reason
    study.set_user_attr("interrupted", marks)
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    study.enqueue_trial(dict(params), user_attrs={"retry_of": number})


def recover_abandoned(study: Any, say: Callable[[str], None]) -> int:
    """Mark FAIL, and queue again, each RUNNING trial whose tuner process on this host is gone (a kill).

    A RUNNING trial of another host, or of a live process, is left to it (several tuners may share a storage).

    Returns:
        How many trials were queued again.
    """
    from optuna.trial import TrialState

    host, retried = socket.gethostname(), 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = str(trial.user_attrs.get("owner", ""))
        owner_host, _, pid = owner.rpartition(":")
        if owner_host == host and pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            _mark_interrupted(study, trial.number, trial.params, f"abandoned: its tuner {owner} is gone")
            say(f"trial {trial.number} was left RUNNING by {owner}, which is gone: marked FAIL and queued again")
            retried += 1
        else:
            say(f"trial {trial.number} is RUNNING in {owner or 'an unknown process'}; left to it")
    return retried


def finished_trials(study: Any) -> List[Any]:
    """The trials that reached a verdict: complete, pruned, or failed on their own (not interrupted)."""
    from optuna.trial import TrialState

    cut = interrupted_trials(study)
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and str(t.number) not in cut)
    ]


# ---- one trial ------------------------------------------------------------------------------------------------------
def run_trial(trial: Any, study_run: StudyRun) -> None:
    """Sample, compile and train one trial; tell the study its outcome (COMPLETE, PRUNED or FAIL).

    Raises:
        KeyboardInterrupt: after marking the trial interrupted and queueing it again.
    """
    import optuna
    from optuna.trial import TrialState

    trial.set_user_attr("owner", _owner())
    trial.set_user_attr("seeds", list(study_run.seeds))
    values = {p.key: p.suggest(trial) for p in study_run.params}
    trial_dir = os.path.join(study_run.tune_dir, f"trial_{trial.number:04d}")
    if os.path.isdir(trial_dir):
        shutil.rmtree(trial_dir)  # left by an in-memory study of the same name: this trial number is ours now
    group: Optional[SeedGroup] = None
    try:
        cfg = study_run.compile_fn(trial_config(study_run.user_cfg, values))
        group = SeedGroup(cfg, study_run.seeds, trial_dir)
        n = 0
        for n in group.rounds():
            trial.report(statistics.fmean(group.scores(study_run.objective)), n)
            if trial.should_prune():
                _record_scores(trial, group, study_run.objective, final=False, rounds=n)
                raise optuna.TrialPruned()
        scores = _record_scores(trial, group, study_run.objective, final=True, rounds=n)
        group.close()  # the final checkpoints are written before the trial counts as complete
        if group.close_errors:
            trial.set_user_attr("close_errors", group.close_errors[:3])
        study_run.study.tell(trial, statistics.fmean(scores))
    except optuna.TrialPruned:
        study_run.study.tell(trial, state=TrialState.PRUNED)
    except KeyboardInterrupt:
        _mark_interrupted(study_run.study, trial.number, trial.params, "interrupted (Ctrl-C)")
        raise
    except Exception as e:  # a diverging config, a value a model refuses: this trial fails, the study goes on
        trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:500])
        study_run.study.tell(trial, state=TrialState.FAIL)
    finally:
        if group is not None:
            group.close()


def _record_scores(trial: Any, group: SeedGroup, objective: str, final: bool, rounds: int) -> List[float]:
    scores = group.scores(objective, final=final)
    trial.set_user_attr("seed_scores", {str(s): round(v, 4) for s, v in zip(group.seeds, scores)})
    trial.set_user_attr("eval_rounds", rounds)
    trial.set_user_attr("env_steps", [c[-1][0] if c else 0 for c in group.curves])
    trial.set_user_attr("stop_reasons", group.stop_reasons)
    return scores


# ---- outputs --------------------------------------------------------------------------------------------------------
def write_trials_csv(study: Any, params: Sequence[ParamSpec], seeds: Sequence[int], path: str) -> None:
    """``trials.csv``: number, state, value, duration_s, eval_rounds, one column per key, one per seed, note."""
    cut = interrupted_trials(study)
    fields = ["number", "state", "value", "duration_s", "eval_rounds", *[p.key for p in params]]
    fields += [f"score_seed_{s}" for s in seeds] + ["note"]
    temp = path + ".tmp"
    with open(temp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        for t in study.get_trials(deepcopy=False):
            scores = t.user_attrs.get("seed_scores") or {}
            row = {
                "number": t.number,
                "state": t.state.name,
                "value": "" if t.value is None else round(t.value, 4),
                "duration_s": "" if t.duration is None else round(t.duration.total_seconds(), 1),
                "eval_rounds": t.user_attrs.get("eval_rounds", ""),
                "note": cut.get(str(t.number)) or t.user_attrs.get("fail_reason", ""),
            }
            row.update({p.key: _csv_value(p.config_value(t.params[p.key])) for p in params if p.key in t.params})
            row.update({f"score_seed_{s}": scores.get(str(s), "") for s in seeds})
            if t.state.name == "PRUNED" and not row["note"]:
                row["note"] = f"pruned after evaluation round {t.user_attrs.get('eval_rounds', '?')}"
            writer.writerow(row)
    os.replace(temp, path)


def _csv_value(value: Any) -> Any:
    return yaml.safe_dump(value, default_flow_style=True).strip() if isinstance(value, list) else value


def _short(value: Any) -> str:
    """A value for a printed line: floats to 4 significant digits (trials.csv keeps them whole)."""
    return f"{value:.4g}" if isinstance(value, float) else str(_csv_value(value))


def write_best_config(study_run: StudyRun, path: str) -> Optional[Any]:
    """``best_config.yaml``: the full resolved config with the best complete trial's values; None when none is."""
    from optuna.trial import TrialState

    if not study_run.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    best = study_run.study.best_trial
    values = {p.key: p.config_value(best.params[p.key]) for p in study_run.params if p.key in best.params}
    cfg = to_plain(study_run.compile_fn(trial_config(study_run.user_cfg, values)))
    cfg["seed"] = study_run.seeds[0]
    tuned = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
    header = (
        f"# Best trial of study '{study_run.study.study_name}' (nervex -m tune): trial {best.number}, score "
        f"{best.value:.2f} = mean over seeds {', '.join(map(str, study_run.seeds))} of the '{study_run.objective}' "
        f"score capped at evaluator.stop_val.\n# Tuned: {tuned}\n# Every trial: trials.csv next to this file.\n"
    )
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as f:
        f.write(header)
        yaml.safe_dump(cfg, f, sort_keys=False, default_flow_style=False)
    os.replace(temp, path)
    return best


class StudyRun:
    """What every trial of one ``nervex -m tune`` run shares: the study, the space, the config, the seeds."""

    def __init__(
        self,
        study: Any,
        params: List[ParamSpec],
        user_cfg: Any,
        compile_fn: Callable[[Any], Any],
        seeds: List[int],
        objective: str,
        tune_dir: str,
    ) -> None:
        self.study, self.params, self.user_cfg, self.compile_fn = study, params, user_cfg, compile_fn
        self.seeds, self.objective, self.tune_dir = seeds, objective, tune_dir

    def run(self, n_trials: int, say: Callable[[str], None]) -> None:
        """Run trials until ``n_trials`` are finished; write ``trials.csv`` and ``best_config.yaml`` after each."""
        while len(finished_trials(self.study)) < n_trials:
            start = time.time()
            trial = self.study.ask()
            try:
                run_trial(trial, self)
            finally:
                self.write_outputs()
            say(self.trial_line(trial.number, time.time() - start))

    def write_outputs(self) -> Optional[Any]:
        write_trials_csv(self.study, self.params, self.seeds, os.path.join(self.tune_dir, "trials.csv"))
        return write_best_config(self, os.path.join(self.tune_dir, "best_config.yaml"))

    def trial_line(self, number: int, seconds: float) -> str:
        t = self.study.trials[number]
        value = "" if t.value is None else f" score={t.value:.2f}"
        scores = t.user_attrs.get("seed_scores")
        per_seed = f" seeds=[{', '.join(f'{v:.1f}' for v in scores.values())}]" if scores else ""
        values = " ".join(
            f"{p.key}={_short(p.config_value(t.params[p.key]))}" for p in self.params if p.key in t.params
        )
        reason = f" ({t.user_attrs['fail_reason']})" if "fail_reason" in t.user_attrs else ""
        return f"trial {number:>3} {t.state.name:<8}{value}{per_seed} {values} {seconds:.0f}s{reason}"


# ---- the command ----------------------------------------------------------------------------------------------------
def _check_args(args: argparse.Namespace) -> None:
    if not args.space:
        raise TuneError("-m tune needs --space SPACE.yaml (the dotted keys to search and their ranges)")
    if args.trials is None or not 1 <= args.trials <= MAX_TRIALS:
        raise TuneError(f"-m tune needs --trials N with 1 <= N <= {MAX_TRIALS}, got {args.trials!r}")
    seeds = DEFAULT_SEEDS if args.seeds is None else args.seeds
    if not 1 <= seeds <= MAX_SEEDS:
        raise TuneError(f"--seeds must be in [1, {MAX_SEEDS}], got {seeds}")
    if getattr(args, "objective", None) not in (None, *OBJECTIVES):
        raise TuneError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {args.objective!r}")
    for flag in ("startup_trials", "warmup_evals"):
        value = getattr(args, flag, None)
        if value is not None and value < 0:
            raise TuneError(f"--{flag.replace('_', '-')} must be >= 0, got {value}")


@dataclass
class TunePlan:
    """Everything a tuning run resolved from its flags, config and space before any trial runs."""

    user_cfg: Any  # the user's config after --set: each trial lays its values into it
    compiled: Any
    params: List[ParamSpec]
    study_name: str
    tune_dir: str
    seeds: List[int]
    objective: str
    startup_trials: int
    warmup_evals: int

    def settings(self) -> Dict[str, Any]:
        """What a stored study must have been run with to be resumed by this plan."""
        digest = hashlib.sha256(yaml.safe_dump(to_plain(self.compiled), sort_keys=True).encode()).hexdigest()[:16]
        return dict(seeds=self.seeds, objective=self.objective, space=space_summary(self.params), config_digest=digest)


def prepare(args: argparse.Namespace) -> TunePlan:
    """Check the flags, read and compile the config, read and check the space: all that can be wrong before a
    trial runs.

    Raises:
        TuneError: a bad flag. ConfigError (SpaceError): a bad config or space file. FileNotFoundError.
    """
    from nervex.entry.builder import compile_config

    _check_args(args)
    user_cfg = read_config(args.config)
    if args.overrides:
        user_cfg = apply_overrides(user_cfg, args.overrides)
    compiled = compile_config(user_cfg)
    params = load_space(args.space, user_cfg, compiled, compile_config)
    seed0 = int(args.seed if args.seed is not None else compiled.seed)
    n_evals = int(compiled.max_env_step) // int(compiled.evaluator.eval_freq)
    startup, warmup = getattr(args, "startup_trials", None), getattr(args, "warmup_evals", None)
    name = args.study_name or os.path.splitext(os.path.basename(args.config))[0]
    return TunePlan(
        user_cfg=user_cfg,
        compiled=compiled,
        params=params,
        study_name=name,
        tune_dir=os.path.join(args.run_root, "tune", args.exp_name or name),
        seeds=list(range(seed0, seed0 + (args.seeds or DEFAULT_SEEDS))),
        objective=getattr(args, "objective", None) or "auc",
        startup_trials=DEFAULT_STARTUP_TRIALS if startup is None else startup,
        warmup_evals=max(1, n_evals // 3) if warmup is None else warmup,  # rl-baselines3-zoo's third
    )


def run_tune(args: argparse.Namespace) -> int:
    """The ``-m tune`` mode of the command line.

    Args:
        args: ``config``, ``space``, ``trials``, ``storage``, ``seeds`` (None: 3), ``study_name`` (None: the config's
            file name), ``overrides`` (``--set``), ``run_root``, ``exp_name`` (the tune directory's name; default the
            study's), ``seed`` (first seed; default the config's), ``objective`` (``auc``), ``startup_trials`` (5),
            ``warmup_evals`` (a third of the evaluations of a full run).

    Returns:
        0 when the study has its trials; 2 on a bad config, space, flag or storage; 130 on Ctrl-C (outputs written).
    """
    try:
        import optuna
    except ImportError:
        print("nervex: error: -m tune needs optuna: pip install 'nervex[tune]'", file=sys.stderr)
        return 2
    try:
        plan = prepare(args)
    except (ConfigError, TuneError, FileNotFoundError) as e:
        print(f"nervex: error: {e}", file=sys.stderr)
        return 2
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tuner prints one line per trial itself
    try:
        return _run_plan(plan, args.storage, args.trials)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _run_plan(plan: TunePlan, storage: Optional[str], n_trials: int) -> int:
    from nervex.entry.builder import compile_config

    say = functools.partial(print, flush=True)
    settings = plan.settings()
    try:
        study = open_study(plan.study_name, storage, settings, plan.seeds[0], plan.startup_trials, plan.warmup_evals)
    except TuneError as e:
        print(f"nervex: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # an unreachable or malformed storage URL (SQLAlchemy, Optuna)
        print(f"nervex: error: cannot open study '{plan.study_name}' in storage {storage!r}: {e}", file=sys.stderr)
        return 2
    os.makedirs(plan.tune_dir, exist_ok=True)
    recover_abandoned(study, say)
    say(
        f"study '{plan.study_name}' ({storage or 'in memory'}): {len(finished_trials(study))} of {n_trials} trials "
        f"finished; seeds {plan.seeds}, objective {plan.objective}, pruning after {plan.startup_trials} complete "
        f"trials from evaluation round {plan.warmup_evals}; outputs in {plan.tune_dir}"
    )
    study_run = StudyRun(study, plan.params, plan.user_cfg, compile_config, plan.seeds, plan.objective, plan.tune_dir)
    try:
        study_run.run(n_trials, say)
    except KeyboardInterrupt:
        say("interrupted: the trial that was running is marked FAIL and will run again on resume")
        return 130
    best = study_run.write_outputs()
    say(summary(study_run, best))
    return 0


def summary(study_run: StudyRun, best: Optional[Any]) -> str:
    """The closing lines: trials by state, the best trial and its values, where the files are."""
    counts: Dict[str, int] = {}
    for t in study_run.study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    lines = [f"trials: {', '.join(f'{n} {s.lower()}' for s, n in sorted(counts.items()))}"]
    if best is None:
        lines.append("no trial completed: no best_config.yaml")
    else:
        lines.append(f"best: trial {best.number}, score {best.value:.2f}")
        lines += [f"  {p.key}: {_csv_value(p.config_value(best.params[p.key]))}" for p in study_run.params]
        lines.append(f"best config: {os.path.join(study_run.tune_dir, 'best_config.yaml')}")
    lines.append(f"trials table: {os.path.join(study_run.tune_dir, 'trials.csv')}")
    return "\n".join(lines)


__all__ = [
    "run_tune",
    "prepare",
    "TunePlan",
    "open_study",
    "recover_abandoned",
    "finished_trials",
    "StudyRun",
    "TuneError",
]
