"""wandb as its users compare runs (docs/wandb.md): one wandb run per trained model, which its evaluation,
probes and training resume by the id kept in the run folder; every number a user compares a summary metric
with a sortable name; curves as history on their own x-axis (training: iter; loss by position: position).
Never waits on a login or a network: offline, said in one line, whenever the server cannot be had.
Torch-free."""
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
RUN_KEYS = ("id", "name", "project", "group", "job_type")
MODES = ("online", "offline", "disabled")  # WANDB_MODE's; wandb's own aliases: dryrun (offline), run (online)
CONNECT_TIMEOUT, INIT_TIMEOUT = 3, 30  # seconds: a server that does not answer in these is not there
AXES = {"iter": ("train/*", "val/*", "lr", "tokens_per_s"),  # x-axis: the metrics plotted against it
        "position": ("loss_by_position/*", "loss_minus_crop_by_position/*")}
HIDDEN = ("position", "position_over_L")  # x-axes of their own, not curves against wandb's _step


def server():
    """(base URL, host, port) of the wandb server this machine would log to."""
    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    return url.geturl(), url.hostname, url.port or (80 if url.scheme == "http" else 443)


def given_mode():
    """WANDB_MODE as given: one of MODES, or "" (unset); any other value is an error (wandb's: a page of
    pydantic)."""
    given = os.environ.get("WANDB_MODE", "")
    mode = {"dryrun": "offline", "run": "online"}.get(given.lower(), given.lower())
    if mode not in ("", *MODES):
        raise UserError(f"WANDB_MODE={given!r} is not one of: {', '.join(MODES)} (unset: online where there "
                        "is a login, else offline)")
    return mode


def wandb_mode():
    """WANDB_MODE's offline or disabled as given; else online where there is a login and its server answers
    within CONNECT_TIMEOUT, else offline, said in one line (wandb online without a login prompts, or fails,
    and without a network waits about 100 s before it fails)."""
    mode = given_mode()
    if mode in ("offline", "disabled"):
        return mode
    url, host, port = server()
    login = os.environ.get("WANDB_API_KEY")
    with suppress(OSError, netrc.NetrcParseError):  # no ~/.netrc, or one that cannot be read: no login there
        login = login or netrc.netrc().authenticators(host)
    why = None if login else "no wandb login (WANDB_API_KEY or `wandb login`)"
    if login:
        try:  # an answer, not only a connection: a server that accepts and never answers would hold the run
            urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT).close()
        except urllib.error.HTTPError:  # an error page is an answer: the server is there
            pass
        except (OSError, http.client.HTTPException) as e:  # refused, unreachable, silent, or not HTTP
            why = f"{url} cannot be reached ({getattr(e, 'reason', None) or e or type(e).__name__})"
    if why:
        offline(why)
    return "online" if why is None else "offline"


def run_file(run_dir):
    """The wandb run kept in run_dir's wandb.json ({} where there is none), checked: a file that is not one is
    an error, never replaced (it names the run a model's evaluations log into)."""
    path = run_home(run_dir) / RUN_FILE
    if not path.exists():
        return {}
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read as a wandb run file ({e}): fix it, or delete it to log a new "
                        "wandb run") from None
    why = None
    if not isinstance(run, dict) or set(run) != set(RUN_KEYS):
        why = f"it is not an object of exactly {', '.join(RUN_KEYS)}"
    elif not (isinstance(run["id"], str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run["id"])):
        why = f"id {run['id']!r} is not a wandb run id (letters, digits, '-' and '_')"
    elif bad := [k for k in RUN_KEYS[1:] if not (isinstance(run[k], str) and run[k].strip())]:
        why = f"{bad[0]} {run[bad[0]]!r} is not a name"
    if why:
        raise UserError(f"{path} is not a wandb run file ({why}): fix it, or delete it to log a new wandb "
                        "run")
    return run


def wandb_folder():
    """The folder wandb keeps its runs in, made and checked writable: one line with advice if it cannot be."""
    folder = Path(os.environ.get("WANDB_DIR") or ".") / "wandb"
    advice = "set WANDB_DIR to a writable folder, or log nothing (--wandb_log=false)"
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, where wandb keeps its runs: move it, or {advice}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise UserError(f"{folder}, where wandb keeps its runs, cannot be written ({e.strerror or e}): "
                        f"{advice}") from None
    return folder


def ready_to_log(run_dir, new=False):
    """Before any work: WANDB_MODE, the run file in run_dir (new: none is read, a new run starts) and wandb's
    folder checked. The run file's run ({}: none), or None where wandb is disabled."""
    if given_mode() == "disabled":
        return None
    known = {} if new else run_file(run_dir)
    wandb_folder()
    return known


def offline(why):
    print(f"wandb: {why}: logging offline under ./wandb; upload with `wandb sync wandb/offline-run-*`",
          flush=True)


def open_run(config, run_dir, new=False, job_type=None):
    """The wandb run of the model in run_dir (a run folder or its ckpt.pt), None where it logs nowhere:
    resumed by the id in run_dir/wandb.json, else (or new: a training from scratch) a new run whose id is kept
    there. Its name is the run's, its group the study's (wandb_group) or else its own (a fine-tune: its
    origin's group), so a workspace groups a model with its fine-tunes; job type train, fine-tune, or as
    given. Its config: the run's, and config_name, the run's name without a study's _seed<k>, which a config's
    seeds share (a workspace groups them by it)."""
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
    if not (isinstance(run["project"], str) and run["project"].strip()):
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
    for m in HIDDEN:
        wb.define_metric(m, hidden=True)
    for step, metrics in AXES.items():
        for m in metrics:  # curves' values are no summary: the summary is the numbers a runs table compares
            wb.define_metric(m, step_metric=step, **({} if step == "iter" else {"summary": "none"}))
    return wb


def log_results(run_dir, config, summary, rows=(), media=None, job_type=None):
    """Into the model's run: summary metrics, history rows (curves on their own x-axis) and media (tables,
    images)."""
    if (run := open_run(config, run_dir, job_type=job_type)) is None:
        return
    with run:
        for row in rows:
            run.log(row)
        if media:
            run.log(media)
        run.summary.update(summary)


def key(*parts):
    """A metric name: parts joined by '/', each without spaces, slashes or parentheses (a contrast 'yarn -
    rope_small crop')."""
    return "/".join(re.sub(r"[\s/()]+", "_", str(p)).strip("_") for p in parts)


def times(n, L):
    return f"{n / L:g}x"


EXTRAPOLATION = dict(ppl="ppl", ppl_past_L="ppl_beyond_train", loss_past_L="loss_beyond_train",
                     loss_minus_crop_past_L="diff_crop", loss_minus_crop_past_L_stderr="diff_crop_stderr",
                     loss_minus_none_past_L="diff_none", loss_minus_none_inside_L="diff_none_inside")


def extrapolation_metrics(report):
    """(summary, history rows) of an eval/extrapolate.py report: per length (a multiple of L), method and,
    where both ran, protocol, the numbers of EXTRAPOLATION; per length the binned loss and loss minus crop by
    position, the bins of extrapolation.png, in rows whose x is the token position (and position_over_L, its
    multiple of L)."""
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
            for x, y in zip(*(r[curve][k] for k in ("x", field))) if r.get(curve) else ():
                by_length.setdefault(r["eval_len"], {}).setdefault(x + 1, {})[key(name, *at[:2])] = y
    rows = [dict(position=p, position_over_L=p / L, **values)
            for T in sorted(by_length) for p, values in sorted(by_length[T].items())]
    return summary, rows


def log_extrapolation(report, ckpt, run_dir, png_path):
    """Into the model's run: eval/extrapolate.py's numbers as summary metrics, its curves by position, its
    table and figure."""
    import wandb
    from eval.report import CSV_FIELDS
    table = wandb.Table(columns=[*CSV_FIELDS], data=[[r[k] for k in CSV_FIELDS] for r in report["results"]])
    log_results(run_dir, ckpt["config"], *extrapolation_metrics(report),
                media={"extrapolation/table": table, "extrapolation/plot": wandb.Image(str(png_path))})
