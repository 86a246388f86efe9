"""wandb's start-up is checked, not trusted: a bad WANDB_MODE or ./wandb is one line before any work, with
nothing written; a server that accepts and never answers costs no wait."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import train
import wandb_runs
from eval import extrapolate
from test_promises import error, tiny_run
from test_safety import one_line
from test_wandb import offline_runs, wandb_dir, without_login  # noqa: F401 (wandb_dir: a fixture)

EVAL = ["--lengths", "1", "--methods", "none,crop", "--protocols", "windows", "--tokens", "64", "--wandb_log",
        "true"]


def tiny(dataset, out_dir, **more):
    cfg = dict(dataset=dataset, out_dir=out_dir, batch_size=2, block_size=32, n_layer=1, n_head=2, n_embd=32,
               max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1, device="cpu", wandb_log=True)
    cfg.update(more)
    return [f"--{k}={v}" for k, v in cfg.items()]


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
