"""wandb as docs/wandb.md describes: one run per trained model, resumed by its evaluations by the id kept in
the run folder; numbers as summary metrics, curves as history on their own x-axis. Offline where there is no
login or no server, said in one line: nothing waits on a network."""
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
CONNECT_TIMEOUT, INIT_TIMEOUT = 3, 30  # seconds (wandb prompts for a login, and retries a server for 90 s)
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
    if (mode := given_mode()) in ("offline", "disabled"):
        return mode
    url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    login = os.environ.get("WANDB_API_KEY")
    with suppress(OSError, netrc.NetrcParseError):  # no ~/.netrc, or an unreadable one: no login
        login = login or netrc.netrc().authenticators(urlparse(url).hostname)
    if not login:
        return offline("no wandb login (WANDB_API_KEY or `wandb login`)")
    try:  # an answer, not only a connection: a server that never answers would hold the run
        urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT).close()
    except urllib.error.HTTPError:  # an error page is an answer: the server is there
        pass
    except (OSError, http.client.HTTPException) as e:  # refused, unreachable, silent, or not HTTP
        return offline(f"{url} cannot be reached ({getattr(e, 'reason', None) or e or type(e).__name__})")
    return "online"


def run_file(run_dir):
    path = run_home(run_dir) / RUN_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def ready_to_log(run_dir, new=False):
    """Checked before any work: WANDB_MODE, wandb's folder. The run kept in run_dir ({}: none, or new); None:
    wandb is disabled."""
    if given_mode() == "disabled":
        return None
    folder = Path(os.environ.get("WANDB_DIR") or ".") / "wandb"
    try:  # else wandb logs into a temporary folder, where `wandb sync wandb/...` would not find it
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        why = "is a file" if folder.is_file() else f"cannot be written ({e.strerror or e})"
        raise UserError(f"{folder} {why}, where wandb keeps its runs: set WANDB_DIR to a writable folder, or "
                        "log nothing (--wandb_log=false)") from None
    return {} if new else run_file(run_dir)


def open_run(config, run_dir, new=False, job_type=None):
    """The wandb run of the model in run_dir (None: it logs nowhere), resumed by the id kept there, else (or
    new) a new one. A workspace groups by group (a fine-tune: its origin's) and config_name (its seeds')."""
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
    except wandb.errors.CommError as e:  # no run within INIT_TIMEOUT, or the login refused
        offline(f"the server did not start the run ({' '.join(str(e).split())[:120]})")
        wandb.teardown()  # its service holds the failed run's id: a new service can log under it
        wb = wandb.init(mode="offline", **settings)
    if not known:  # once started; a read-only run folder's evaluations log to runs of their own
        with suppress(OSError):
            (run_dir / RUN_FILE).write_text(json.dumps(run))
    for m in ("position", "position_over_L"):  # x-axes, not curves against wandb's _step
        wb.define_metric(m, hidden=True)
    for step, metrics in AXES.items():
        for m in metrics:  # a curve's last value is no summary: a runs table compares summaries
            wb.define_metric(m, step_metric=step, **({} if step == "iter" else {"summary": "none"}))
    return wb


def log_results(run_dir, config, summary, rows=(), media=None, job_type=None):
    if (run := open_run(config, run_dir, job_type=job_type)) is None:
        return
    with run:
        for row in rows:
            run.log(row)
        if media:
            run.log(media)
        run.summary.update(summary)


def key(*parts):
    return "/".join(re.sub(r"[\s/()]+", "_", str(p)).strip("_") for p in parts)


def times(n, L):
    return f"{n / L:g}x"


EXTRAPOLATION = dict(ppl="ppl", ppl_past_L="ppl_beyond_train", loss_past_L="loss_beyond_train",
                     loss_minus_crop_past_L="diff_crop", loss_minus_crop_past_L_stderr="diff_crop_stderr",
                     loss_minus_none_past_L="diff_none", loss_minus_none_inside_L="diff_none_inside")


def extrapolation_metrics(report):
    """(summary, history rows): the numbers per length, method and (where both ran) protocol; the curves by
    position."""
    L, results = report["train_len"], [r for r in report["results"] if r["available"]]
    both = len({r["protocol"] for r in results}) > 1
    summary, rows = {}, {}
    for r in results:
        method = "-".join(filter(None, (r["method"], r["mode"])))  # dynamic-ntk-causal
        at = (times(r["eval_len"], L), method, *([r["protocol"]] if both else []))
        summary.update({key(name, *at): r[field] for name, field in EXTRAPOLATION.items()
                        if r[field] is not None})
        for curve, name, field in (("curve", "loss_by_position", "loss"),
                                   ("crop_curve", "loss_minus_crop_by_position", "diff_crop")):
            for x, y in zip(r[curve]["x"], r[curve][field]) if r.get(curve) else ():
                rows.setdefault((r["eval_len"], x + 1), {})[key(name, *at[:2])] = y
    return summary, [dict(position=p, position_over_L=p / L, **v) for (_, p), v in sorted(rows.items())]


def log_extrapolation(report, ckpt, run_dir, png_path):
    import wandb
    from eval.report import CSV_FIELDS
    table = wandb.Table(columns=[*CSV_FIELDS], data=[[r[k] for k in CSV_FIELDS] for r in report["results"]])
    log_results(run_dir, ckpt["config"], *extrapolation_metrics(report),
                media={"extrapolation/table": table, "extrapolation/plot": wandb.Image(str(png_path))})
