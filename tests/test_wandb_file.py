"""Issue 53: wandb's run file and start-up are checked, not trusted: a bad wandb.json, WANDB_MODE or ./wandb
is one line before any work, with nothing written or replaced; a server that accepts and never answers costs
no wait."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import train
import wandb_runs
from eval import extrapolate
from test_promises import error, files, tiny_run
from test_safety import one_line
from test_wandb import offline_runs, wandb_dir, without_login  # noqa: F401 (wandb_dir: a fixture)

GOOD = dict(id="abc123", name="run", project="ropelab", group="run", job_type="train")
BAD = {"a list": [GOOD], "a string": "abc123", "an extra key": dict(GOOD, extra=1),
       "a numeric id": dict(GOOD, id=123), "an odd id": dict(GOOD, id="a/b c"),
       "a null project": dict(GOOD, project=None)}
EVAL = ["--lengths", "1", "--methods", "none,crop", "--protocols", "windows", "--tokens", "64", "--wandb_log",
        "true"]


def tiny(dataset, out_dir, **more):
    cfg = dict(dataset=dataset, out_dir=out_dir, batch_size=2, block_size=32, n_layer=1, n_head=2, n_embd=32,
               max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1, device="cpu", wandb_log=True)
    cfg.update(more)
    return [f"--{k}={v}" for k, v in cfg.items()]


def test_a_bad_run_file_is_one_line_before_the_evaluation_and_is_kept(dataset, wandb_dir):
    run = tiny_run(wandb_dir / "run", dataset)
    for what, content in [*BAD.items(), ("not JSON", "{garbage")]:
        text = content if isinstance(content, str) and what == "not JSON" else json.dumps(content)
        (run / "wandb.json").write_text(text)
        before = files(run)
        one_line(error("extrapolate.py", extrapolate.main, [str(run), *EVAL]), f"{run / 'wandb.json'} ",
                 "delete it")
        assert files(run) == before, what  # no report written, the file not replaced
    (run / "wandb.json").write_text(json.dumps(GOOD))
    extrapolate.main([str(run), *EVAL])
    (logged,) = offline_runs(wandb_dir)
    assert logged["run"].run_id == "abc123"


def test_a_bad_run_file_stops_a_resume_and_a_fine_tune_before_training(dataset, wandb_dir):
    train.main(tiny(dataset, wandb_dir / "base"))
    (wandb_dir / "base" / "wandb.json").write_text(json.dumps(BAD["a numeric id"]))
    before = files(wandb_dir / "base")
    resume = tiny(dataset, wandb_dir / "base", init_from="resume", max_iters=4)
    one_line(error("train.py", train.main, resume), "id 123 is not a wandb run id")
    one_line(error("train.py", train.main, tiny(dataset, wandb_dir / "tuned", init_from=wandb_dir / "base")),
             "base/wandb.json is not a wandb run file")
    assert files(wandb_dir / "base") == before and not (wandb_dir / "tuned" / "ckpt.pt").exists()


def test_an_unknown_wandb_mode_is_one_line_naming_the_modes(dataset, wandb_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "bogus")
    run = tiny_run(wandb_dir / "run", dataset)
    one_line(error("extrapolate.py", extrapolate.main, [str(run), *EVAL]), "WANDB_MODE='bogus'",
             "online, offline, disabled")
    assert not (run / "extrapolation.json").exists()
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # wandb's own name for offline
    assert wandb_runs.wandb_mode() == "offline"


def test_a_wandb_folder_that_cannot_be_written_is_one_line_and_leaves_no_run_file(dataset, wandb_dir,
                                                                                   monkeypatch):
    (wandb_dir / "wandb").write_text("a file")
    one_line(error("train.py", train.main, tiny(dataset, wandb_dir / "run")), "wandb is a file", "WANDB_DIR")
    assert not (wandb_dir / "run").exists()  # no lone wandb.json, no run folder
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir / "wandb" / "below"))  # under a file: cannot be made
    one_line(error("train.py", train.main, tiny(dataset, wandb_dir / "run")), "cannot be written",
             "WANDB_DIR")
    assert not (wandb_dir / "run").exists()


def test_a_server_that_accepts_and_never_answers_is_offline_at_once(wandb_dir, monkeypatch, capsys):
    without_login(monkeypatch, wandb_dir)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    with socket.socket() as silent:  # the kernel accepts connections; nothing ever answers them
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        t0 = time.time()
        assert wandb_runs.wandb_mode() == "offline" and time.time() - t0 < wandb_runs.CONNECT_TIMEOUT + 2
    assert "cannot be reached" in capsys.readouterr().out


def test_a_server_that_never_starts_the_run_falls_back_to_offline_cleanly(wandb_dir, monkeypatch):
    without_login(monkeypatch, wandb_dir)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setattr(wandb_runs, "INIT_TIMEOUT", 1)
    released = threading.Event()

    class Stalls(BaseHTTPRequestHandler):  # answers a page, never an API call
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def do_POST(self):
            released.wait(60)

        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stalls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.server_port}")
    (wandb_dir / "run").mkdir()
    try:
        # before: "run ID is in use", the failed online start's id held by wandb's service
        wandb_runs.log_results(wandb_dir / "run", dict(wandb_run_name="run"), {"x": 1.0})
    finally:
        released.set()
        server.shutdown()
    (logged,) = offline_runs(wandb_dir)
    assert logged["summary"]["x"] == 1.0
    assert logged["run"].run_id == json.loads((wandb_dir / "run" / "wandb.json").read_text())["id"]


@pytest.mark.parametrize("project", ["", " "])
def test_an_empty_project_is_refused(dataset, wandb_dir, project):
    with pytest.raises(wandb_runs.UserError, match="is not a project name"):
        wandb_runs.open_run(dict(wandb_project=project), wandb_dir / "run", new=True)
    assert not (wandb_dir / "run" / "wandb.json").exists()
