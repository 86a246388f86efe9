"""wandb as docs/wandb.md describes it: one wandb run per trained model, which its evaluations and probes resume
by the id kept in the run folder; the numbers a user compares as summary metrics with sortable names; curves as
history on their own x-axis. Nothing waits on a login or a network: offline, said in one line, instead."""
import http.client
import json
import netrc
import os
import re
import secrets
import tempfile
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path
from urllib.parse import urlparse

from common import UserError, run_home

RUN_FILE = "wandb.json"  # in a run folder: the id, name, project, group and job type of its wandb run
MODES = ("online", "offline", "disabled")
# seconds; wandb itself would prompt for a missing login, and retry an unreachable server for 90 s
CONNECT_TIMEOUT, INIT_TIMEOUT = 3, 30
AXES = {"iter": ("train/*", "val/*", "lr", "tokens_per_s"),  # x-axis: the metrics plotted against it
        "position": ("loss_by_position/*", "loss_minus_crop_by_position/*")}


def given_mode():
    given = os.environ.get("WANDB_MODE", "")
    mode = {"dryrun": "offline", "run": "online"}.get(given.lower(), given.lower())  # wandb's own aliases
    if mode not in ("", *MODES):  # wandb's own error is a page of pydantic
        raise UserError(f"WANDB_MODE={given!r} is not one of: {', '.join(MODES)} (unset: online where there "
                        "is a login, else offline)")
    return mode


def offline(why):
    print(f"wandb: {why}: logging offline under ./wandb; upload with `wandb sync wandb/offline-run-*`",
          flush=True)
    return "offline"


def wandb_mode():
    """WANDB_MODE's offline or disabled as given; else online only with a login and a server that answers."""
    if (mode := given_mode()) in ("offline", "disabled"):
        return mode
    url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    login = os.environ.get("WANDB_API_KEY")
    with suppress(OSError, netrc.NetrcParseError):  # no ~/.netrc, or one that cannot be read: no login there
        login = login or netrc.netrc().authenticators(urlparse(url).hostname)
    if not login:
        return offline("no wandb login (WANDB_API_KEY or `wandb login`)")
    try:  # an answer, not only a connection: a server that accepts and never answers would hold the run
        urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT).close()
    except urllib.error.HTTPError:  # an error page is an answer: the server is there
        pass
    except (OSError, http.client.HTTPException) as e:  # refused, unreachable, silent, or not HTTP
        return offline(f"{url} cannot be reached ({getattr(e, 'reason', None) or e or type(e).__name__})")
    return "online"


def run_file(run_dir):
    """The wandb run kept in run_dir ({} where there is none)."""
    path = run_home(run_dir) / RUN_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def ready_to_log(run_dir, new=False):
    """Checked before any work: WANDB_MODE and wandb's folder. The run kept in run_dir ({}: none, or new), or
    None where wandb is disabled."""
    if given_mode() == "disabled":
        return None
    folder = Path(os.environ.get("WANDB_DIR") or ".") / "wandb"
    try:  # else wandb logs into a temporary folder, where `wandb sync wandb/...` would not find the run
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        why = "is a file" if folder.is_file() else f"cannot be written ({e.strerror or e})"
        raise UserError(f"{folder} {why}, where wandb keeps its runs: set WANDB_DIR to a writable folder, or "
                        "log nothing (--wandb_log=false)") from None
    return {} if new else run_file(run_dir)


def open_run(config, run_dir, new=False, job_type=None):
    """The wandb run of the model in run_dir (a run folder or its ckpt.pt), None where it logs nowhere: resumed
    by the id in its wandb.json, else (or new) a new run whose id is kept there. What a workspace groups by:
    the group (wandb_group, else a fine-tune's origin's group, else the run's name) and config_name (the
    run's name without a study's _seed<k>)."""
    import wandb
    run_dir = run_home(run_dir)
    if (known := ready_to_log(run_dir, new)) is None or (mode := wandb_mode()) == "disabled":
        return None
    origin = config.get("init_from", "scratch")
    tuned = origin not in ("scratch", "resume")
    name = config.get("wandb_run_name") or run_dir.name
    run = known or dict(id=secrets.token_hex(4), name=name, project=config.get("wandb_project", "ropelab"),
                        group=config.get("wandb_group") or (tuned and run_file(origin).get("group")) or name,
                        job_type=job_type or ("fine-tune" if tuned else "train"))
    if not run["project"].strip():
        raise UserError(f"wandb_project={run['project']!r} is not a project name: give one, e.g. "
                        "--wandb_project=ropelab")
    settings = dict(config=dict(config, config_name=re.sub(r"_seed\d+$", "", name)),
                    resume="allow" if known else None, **run)
    try:
        wb = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=INIT_TIMEOUT), **settings)
    except wandb.errors.CommError as e:  # reachable, yet no run within INIT_TIMEOUT, or the login was refused
        offline(f"the server did not start the run ({' '.join(str(e).split())[:120]})")
        wandb.teardown()  # its service still holds the failed run's id: offline under that id needs a new one
        wb = wandb.init(mode="offline", **settings)
    if not known:  # written once the run has started: a run that could not start leaves no id behind
        with suppress(OSError):  # a read-only run folder: its evaluations log to runs of their own
            (run_dir / RUN_FILE).write_text(json.dumps(run))
    for m in ("position", "position_over_L"):  # x-axes, not curves against wandb's _step
        wb.define_metric(m, hidden=True)
    for step, metrics in AXES.items():
        for m in metrics:  # a curve's last value is no summary: the summary is what a runs table compares
            wb.define_metric(m, step_metric=step, **({} if step == "iter" else {"summary": "none"}))
    return wb


def log_results(run_dir, config, summary, rows=(), media=None, job_type=None):
    """Into the model's run: summary metrics, history rows and media (tables, images)."""
    if (run := open_run(config, run_dir, job_type=job_type)) is None:
        return
    with run:
        for row in rows:
            run.log(row)
        if media:
            run.log(media)
        run.summary.update(summary)


def key(*parts):
    """A metric name: parts joined by '/', each without spaces, slashes or parentheses."""
    return "/".join(re.sub(r"[\s/()]+", "_", str(p)).strip("_") for p in parts)


def times(n, L):
    return f"{n / L:g}x"


EXTRAPOLATION = dict(ppl="ppl", ppl_past_L="ppl_beyond_train", loss_past_L="loss_beyond_train",
                     loss_minus_crop_past_L="diff_crop", loss_minus_crop_past_L_stderr="diff_crop_stderr",
                     loss_minus_none_past_L="diff_none", loss_minus_none_inside_L="diff_none_inside")


def extrapolation_metrics(report):
    """(summary, history rows) of an extrapolation report: EXTRAPOLATION's numbers per length (a multiple of
    L), method and, where both ran, protocol; the loss and loss minus crop by position in rows whose x is the
    token position."""
    L, results = report["train_len"], [r for r in report["results"] if r["available"]]
    both = len({r["protocol"] for r in results}) > 1
    summary, by_length = {}, {}
    for r in results:
        method = "-".join(filter(None, (r["method"], r["mode"])))  # dynamic-ntk-causal
        at = (times(r["eval_len"], L), method, *([r["protocol"]] if both else []))
        summary.update({key(name, *at): r[field] for name, field in EXTRAPOLATION.items()
                        if r[field] is not None})
        for curve, name, field in (("curve", "loss_by_position", "loss"),
                                   ("crop_curve", "loss_minus_crop_by_position", "diff_crop")):
            for x, y in zip(r[curve]["x"], r[curve][field]) if r.get(curve) else ():
                by_length.setdefault(r["eval_len"], {}).setdefault(x + 1, {})[key(name, *at[:2])] = y
    rows = [dict(position=p, position_over_L=p / L, **values)
            for T in sorted(by_length) for p, values in sorted(by_length[T].items())]
    return summary, rows


def log_extrapolation(report, ckpt, run_dir, png_path):
    import wandb
    from eval.report import CSV_FIELDS
    table = wandb.Table(columns=[*CSV_FIELDS], data=[[r[k] for k in CSV_FIELDS] for r in report["results"]])
    log_results(run_dir, ckpt["config"], *extrapolation_metrics(report),
                media={"extrapolation/table": table, "extrapolation/plot": wandb.Image(str(png_path))})
