"""wandb_runs.py: what a tiny training, evaluation, probe and study log, read back from wandb's offline run files;
and that no login or network ever blocks a command."""
import json
import struct
import time

import pytest
from wandb.proto.wandb_internal_pb2 import Record

import train
import wandb_runs
from eval import extrapolate
from lab import ladder, probes, study
from test_study import fake_report

L = 32
BLOCK = 32 * 1024  # the .wandb file: a LevelDB-style log of 32 KiB blocks


def records(path):
    """The Record protobufs of an offline run's .wandb file (wandb has no reader of its own): after a 7-byte file
    header, chunks of (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) that never cross a block's end."""
    data, pos, payload = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zeros: the rest of the block is padding
            pos += BLOCK - pos % BLOCK
            continue
        payload, pos = payload + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            yield Record.FromString(payload)
            payload = b""


def read_run(path):
    """One offline run file as {run, config, summary, history (rows), axes ({metric or glob: its step metric})}."""
    def name(item):
        return item.key or "/".join(item.nested_key)
    run, summary, history, axes = None, {}, [], {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = r.run
        elif kind == "summary":
            summary.update({name(u): json.loads(u.value_json) for u in r.summary.update})
        elif kind == "history":
            history.append({name(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "metric" and r.metric.step_metric:
            axes[r.metric.name or r.metric.glob_name] = r.metric.step_metric
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    return dict(run=run, config=config, summary=summary, history=history, axes=axes)


def offline_runs(folder):
    """Every offline run file under folder/wandb, in the order the runs started."""
    import wandb
    wandb.teardown()  # its service writes the files behind the runs: shut down, it has written all
    runs = [read_run(f) for f in folder.glob("wandb/offline-run-*/run-*.wandb")]
    return sorted(runs, key=lambda r: r["run"].start_time.ToNanoseconds())


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch):
    import wandb
    wandb.teardown()  # wandb keeps process-wide settings (its dir) from its first init in the process: start afresh
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield tmp_path
    wandb.teardown()  # and leave none behind


def test_a_model_is_one_wandb_run_with_its_evaluation_as_summary_and_curves_by_position(dataset, wandb_dir):
    run_dir = wandb_dir / "tiny_seed3"
    cfg = dict(dataset=dataset, out_dir=run_dir, batch_size=4, block_size=L, n_layer=1, n_head=2, n_embd=32, max_iters=4,
               lr_decay_iters=4, warmup_iters=1, eval_interval=2, eval_iters=1, log_interval=2, device="cpu",
               wandb_log=True, wandb_group="mystudy")
    train.main([f"--{k}={v}" for k, v in cfg.items()])
    extrapolate.main([str(run_dir), "--lengths", "1,2", "--methods", "none,crop,yarn", "--protocols", "windows,sliding",
                      "--tokens", "128", "--device", "cpu"])  # logs: the run's own wandb_log
    probes.main([str(run_dir), "--probes", "copy", "--distances", "0.5,2", "--trials", "2", "--segment", "4",
                 "--methods", "none,yarn", "--device", "cpu"])
    trained, evaluated, probed = parts = offline_runs(wandb_dir)
    # one wandb run: the evaluation and the probes resume the training's, by the id kept in the run folder
    assert {p["run"].run_id for p in parts} == {json.loads((run_dir / "wandb.json").read_text())["id"]}
    assert [p["run"].resume for p in parts] == [False, True, True]
    assert {(p["run"].display_name, p["run"].run_group, p["run"].job_type) for p in parts} == {("tiny_seed3", "mystudy", "train")}
    config = trained["config"]  # what panels group by; config_name: what a config's seeds share
    assert (config["pos_emb"], config["rope_base"], config["block_size"], config["config_name"]) == ("rope", 10000.0, L, "tiny")
    # training: iter is the x-axis of its curves
    assert {trained["axes"][m] for m in ("train/*", "val/*", "lr", "tokens_per_s")} == {"iter"}
    assert [row["iter"] for row in trained["history"] if "val/loss" in row] == [0, 2, 4]
    # evaluation: the numbers as summary metrics, /windows and /sliding as both protocols ran
    for name in ("ppl", "ppl_past_L", "loss_past_L", "loss_minus_crop_past_L", "loss_minus_none_past_L"):
        for protocol in ("windows", "sliding"):
            assert isinstance(evaluated["summary"][f"{name}/2x/yarn/{protocol}"], float), (name, protocol)
    assert "ppl/1x/none/windows" in evaluated["summary"] and "ppl_past_L/1x/none/windows" not in evaluated["summary"]
    assert not [k for k in evaluated["summary"] if "by_position" in k]  # curves are history, not columns
    # the curves: history rows whose x-axis is the token position, binned as extrapolation.png (16 bins per length)
    assert evaluated["axes"]["loss_minus_crop_by_position/*"] == evaluated["axes"]["loss_by_position/*"] == "position"
    curve = [(row["position"], row["position_over_L"]) for row in evaluated["history"] if "loss_minus_crop_by_position/2x/yarn" in row]
    report = json.loads((run_dir / "extrapolation.json").read_text())
    (yarn,) = [r for r in report["results"] if (r["method"], r["protocol"], r["eval_len"]) == ("yarn", "windows", 2 * L)]
    assert curve == [(x + 1, (x + 1) / L) for x in yarn["crop_curve"]["x"]] and len(curve) == 16
    assert any("loss_by_position/1x/none" in row for row in evaluated["history"])
    # probes: top-1 by distance (a multiple of L) and method
    assert {"copy_top1/0.5x/none", "copy_top1/2x/yarn"} <= set(probed["summary"])


def test_a_fine_tune_is_a_run_of_its_own_in_its_origins_group(dataset, wandb_dir):
    base = dict(dataset=dataset, batch_size=4, block_size=L, n_layer=1, n_head=2, n_embd=32, max_iters=2, lr_decay_iters=2,
                warmup_iters=1, eval_interval=2, eval_iters=1, log_interval=2, device="cpu", wandb_log=True)
    train.main([f"--{k}={v}" for k, v in dict(base, out_dir=wandb_dir / "base").items()])
    train.main([f"--{k}={v}" for k, v in dict(base, out_dir=wandb_dir / "tuned", init_from=wandb_dir / "base",
                                              block_size=2 * L).items()])
    origin, tuned = offline_runs(wandb_dir)
    assert origin["run"].run_id != tuned["run"].run_id
    assert (tuned["run"].run_group, tuned["run"].job_type) == ("base", "fine-tune")


def test_the_study_run_holds_the_decided_contrasts_as_summary_metrics(wandb_dir):
    reports = {"rope_small": [fake_report(4.0, 3.5), fake_report(4.2, 3.6)]}
    rows = study.aggregate(reports)
    (wandb_dir / "study.png").write_bytes(study.plot(rows))
    study.log_wandb(dict(configs=["rope_small"], seeds=2, rows=rows, contrasts=study.contrasts(reports)),
                    wandb_dir / "mystudy", wandb_dir / "study.png", study.markdown(rows, 2))
    (logged,) = offline_runs(wandb_dir)
    assert (logged["run"].display_name, logged["run"].run_group, logged["run"].job_type) == ("mystudy", "mystudy", "study")
    summary = logged["summary"]
    assert summary["contrast/rope_small/yarn_minus_crop/2x/lo"] < summary["contrast/rope_small/yarn_minus_crop/2x/mean"] < 0
    assert summary["contrast/rope_small/yarn_minus_crop/2x/decision"] in ("lower than crop", "no difference found")


def test_the_ladder_run_holds_every_rungs_contrasts_as_summary_metrics(wandb_dir):
    out = wandb_dir / "page"
    out.mkdir()
    (out / "ladder.png").write_bytes(study.plot(study.aggregate({"rope_small": [fake_report(4.0, 3.5)]})))
    row = dict(config="L32", ref="crop", at=64, mean=0.002, lo=-0.001, hi=0.007, p=0.4, decision="undecided",
               equivalence="equivalent")
    rows = [dict(row, method="rerope:window=24"), dict(row, method="ceiling: full context - crop-L", mean=-0.037)]
    ladder.log_wandb(out, [dict(rung="L32", L=32)], rows, "# page")
    (logged,) = offline_runs(wandb_dir)
    assert (logged["run"].display_name, logged["run"].run_group, logged["run"].job_type) == ("page", "page", "ladder")
    summary = logged["summary"]
    assert summary["contrast/L32/rerope:window=24_minus_crop/2x/hi"] == 0.007
    assert summary["contrast/L32/rerope:window=24_minus_crop/2x/decision"] == "equivalent"  # undecided: its TOST reading
    assert summary["contrast/L32/ceiling_full_context_minus_crop-L/2x/mean"] == -0.037


def without_login(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("NETRC", raising=False)


def test_online_without_a_login_logs_offline_said_in_one_line(wandb_dir, monkeypatch, capsys):
    without_login(monkeypatch, wandb_dir)
    wandb_runs.log_results(wandb_dir / "run", dict(wandb_run_name="run"), {"x": 1.0})
    said = [line for line in capsys.readouterr().out.splitlines() if "no wandb login" in line]
    assert len(said) == 1 and "offline" in said[0]
    (logged,) = offline_runs(wandb_dir)
    assert logged["summary"]["x"] == 1.0


def test_a_login_whose_server_cannot_be_reached_logs_offline_at_once(wandb_dir, monkeypatch, capsys):
    without_login(monkeypatch, wandb_dir)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there: refused, no server contacted
    t0 = time.time()
    assert wandb_runs.wandb_mode() == "offline" and time.time() - t0 < wandb_runs.CONNECT_TIMEOUT + 1
    assert "http://127.0.0.1:9 cannot be reached" in capsys.readouterr().out
